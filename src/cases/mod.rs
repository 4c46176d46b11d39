//! Benchmark cases: one per kernel and shape. Each knows its byte count
//! (each input read once, each output written once), how to build one input
//! set, launch on it, and check what it wrote against the f64 oracle.
mod attn;
mod gather;
mod mlp;
mod norm;

use wavefuse::{Device, f16};

/// A kernel at one shape.
pub trait Case {
    fn name(&self) -> String;
    fn shape(&self) -> String;
    /// Bytes the kernel must read plus bytes it must write.
    fn bytes(&self) -> usize;
    fn setup(&self, dev: &Device, seed: u64) -> wavefuse::Result<Box<dyn Instance>>;
}

/// One input set on the device.
pub trait Instance {
    fn launch(&mut self, dev: &Device) -> wavefuse::Result<()>;
    /// Max error in f16 ulps against the f64 oracle (on sampled rows), or
    /// why it is wrong. In-place kernels restore their input and launch
    /// once more first, so the check sees exactly one application.
    fn check(&mut self, dev: &Device) -> Result<f64, String>;
}

/// splitmix64 for input data.
pub struct Rng(pub u64);
impl Rng {
    pub fn next(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
    }
    pub fn halves(&mut self, n: usize, scale: f64, offset: f64) -> Vec<f16> {
        (0..n)
            .map(|_| f16::from_f64(offset + scale * (2.0 * self.next() - 1.0)))
            .collect()
    }
}

/// f16 ulps between `got` and `want`, ulp floored at the smallest normal.
pub fn ulp_err(got: f16, want: f64) -> f64 {
    if got.is_nan() || want.is_nan() {
        return if got.is_nan() && want.is_nan() {
            0.0
        } else {
            f64::INFINITY
        };
    }
    let a = want.abs().max(f16::MIN_POSITIVE.to_f64());
    (got.to_f64() - want).abs() / 2f64.powf(a.log2().floor() - 10.0)
}

/// Rows checked against the oracle: about 4096 spread over the tensor,
/// always including the first and last.
pub fn sampled_rows(rows: usize) -> impl Iterator<Item = usize> {
    let step = rows.div_ceil(4096).max(1);
    (0..rows).step_by(step).chain(std::iter::once(rows - 1))
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
        v.push(Box::new(norm::AddLayerNorm { rows: r, width: w }));
    }
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
