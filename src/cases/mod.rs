//! Benchmark cases: one per kernel and shape. Each knows its byte count
//! (each input read once, each output written once), how to build one input
//! set, launch on it, and check what it wrote against the f64 oracle.
mod attn;
mod gather;
mod mlp;
mod norm;

use wavefuse::{Device, Stream};
pub use wavefuse_suite::check::ulp_err;
pub use wavefuse_suite::rng::Rng;

/// A kernel at one shape.
pub trait Case {
    fn name(&self) -> String;
    fn shape(&self) -> String;
    /// Bytes the kernel must read plus bytes it must write.
    fn bytes(&self) -> usize;
    fn setup(&self, dev: &Device, seed: u64) -> wavefuse::Result<Box<dyn Instance>>;
}

/// What a check covered.
#[derive(Clone, Copy, Default)]
pub struct Checked {
    /// Worst error in f16 ulps against the f64 oracle.
    pub max_err_ulp: f64,
    /// Output elements compared (every one the kernel wrote).
    pub outputs: usize,
}

/// One input set on the device.
pub trait Instance {
    /// Launches the kernel once (each instance counts its launches).
    fn launch(&mut self, dev: &Stream) -> wavefuse::Result<()>;
    /// Checks every output element against the f64 oracle. An in-place
    /// kernel's state after all its launches is replayed on the host from
    /// the initial inputs (the contract's f16 arithmetic, exact), and the
    /// last launch is checked against the oracle applied to the state it
    /// read.
    fn check(&mut self, dev: &Device) -> Result<Checked, String>;
    /// Restores the inputs an in-place kernel updates and zeroes the launch
    /// count (the soak mode bounds the host replay with it).
    fn reset(&mut self, _dev: &Device) -> wavefuse::Result<()> {
        Ok(())
    }
}

/// `f(row)` for every row in `0..rows` on all cores; the worst value, or
/// the first error.
pub fn par_rows<F>(rows: usize, f: F) -> Result<f64, String>
where
    F: Fn(usize) -> Result<f64, String> + Sync,
{
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, rows.max(1));
    let chunk = rows.div_ceil(threads);
    let f = &f;
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                s.spawn(move || {
                    let mut worst = 0.0f64;
                    for r in t * chunk..((t + 1) * chunk).min(rows) {
                        worst = worst.max(f(r)?);
                    }
                    Ok::<f64, String>(worst)
                })
            })
            .collect();
        let mut worst = 0.0f64;
        for h in hs {
            worst = worst.max(
                h.join()
                    .map_err(|_| "check thread panicked".to_string())??,
            );
        }
        Ok(worst)
    })
}

/// Applies `f` to every element of `v` (with its index) on all cores.
pub fn par_update<T: Send, F>(v: &mut [T], f: F)
where
    F: Fn(usize, &mut T) + Sync,
{
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let chunk = v.len().div_ceil(threads).max(1);
    let f = &f;
    std::thread::scope(|s| {
        for (c, part) in v.chunks_mut(chunk).enumerate() {
            s.spawn(move || {
                for (i, x) in part.iter_mut().enumerate() {
                    f(c * chunk + i, x);
                }
            });
        }
    });
}

pub fn all(full: bool) -> Vec<Box<dyn Case>> {
    let mut v: Vec<Box<dyn Case>> = Vec::new();
    let rows: &[(usize, usize)] = if full {
        &[(131040, 192), (32760, 384), (521280, 192), (131040, 384)]
    } else {
        &[(4096, 192), (1024, 384)]
    };
    for &(r, w) in rows {
        v.push(Box::new(norm::LayerNorm {
            rows: r,
            width: w,
            affine: false,
        }));
    }
    v.push(Box::new(norm::LayerNorm {
        rows: rows[0].0,
        width: rows[0].1,
        affine: true,
    }));
    for &(r, w) in rows {
        v.push(Box::new(norm::AddLayerNorm {
            rows: r,
            width: w,
            affine: false,
        }));
    }
    // Pangu's LayerNorms all carry gamma and beta, and only the affine
    // entries run the exact path's refinement: the affine form of each
    // fused entry at its first shape.
    v.push(Box::new(norm::AddLayerNorm {
        rows: rows[0].0,
        width: rows[0].1,
        affine: true,
    }));
    let grids: &[([usize; 3], usize)] = if full {
        &[
            ([8, 91, 180], 192),
            ([8, 181, 360], 192),
            ([8, 91, 180], 384),
        ]
    } else {
        &[([2, 13, 24], 192), ([2, 7, 12], 384)]
    };
    for fuse in [gather::Fuse::None, gather::Fuse::Ln, gather::Fuse::AddLn] {
        for &(g, c) in grids {
            v.push(Box::new(gather::Gather {
                grid: g,
                channels: c,
                fuse,
                affine: false,
            }));
        }
        if fuse != gather::Fuse::None {
            v.push(Box::new(gather::Gather {
                grid: grids[0].0,
                channels: grids[0].1,
                fuse,
                affine: true,
            }));
        }
    }
    let mlp: &[(usize, usize)] = if full {
        &[(521280, 768), (131040, 1536), (131040, 768)]
    } else {
        &[(1024, 768), (256, 1536)]
    };
    for &(r, c) in mlp {
        v.push(Box::new(mlp::BiasGelu { rows: r, cols: c }));
    }
    // (windows, heads): the two Pangu attention shapes.
    let attn: &[(usize, usize)] = if full {
        &[(3720, 6), (960, 12)]
    } else {
        &[(24, 2), (8, 4)]
    };
    for &(w, h) in attn {
        v.push(Box::new(attn::QkvSplit {
            windows: w,
            heads: h,
        }));
    }
    for &(w, h) in attn {
        v.push(Box::new(attn::BiasMask {
            windows: w,
            heads: h,
            softmax: false,
        }));
    }
    for &(w, h) in attn {
        v.push(Box::new(attn::BiasMask {
            windows: w,
            heads: h,
            softmax: true,
        }));
    }
    for &(w, h) in attn {
        v.push(Box::new(attn::WindowAttention {
            windows: w,
            heads: h,
        }));
    }
    v
}
