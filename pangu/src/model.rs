//! The whole network (`MODEL.md`), in either block order, in one of two
//! builds picked at load time:
//!
//! * [`Build::Wavefuse`] (f16): wavefuse's kernels wherever one applies
//!   (index gathers for the window partition, the 2 x 2 merge and split;
//!   LayerNorm fused with the window reverse or the split; fused window
//!   attention; cuBLASLt Linears with the bias in the epilogue; the patch
//!   embedding's padding, layout and conversion to f16 as one gather),
//!   candle's ops for the rest (normalisation, recovery layout, residual
//!   adds);
//! * [`Build::Candle`] (f16, f32 or f64): candle's own ops, written as a
//!   PyTorch user writes the model (the CPU check against the PyTorch
//!   reference).
//!
//! Convolutions whose kernel equals their stride are a token layout plus a
//! GEMM: the patch embedding and recovery weights are loaded as `[out, in]`
//! matrices.
use crate::config::{BlockOrder, Geometry};
use crate::error::{Error, Result};
use crate::nn::Lin;
use crate::stage::WavefuseOps;
use crate::stage::ops::StageOps;
use crate::trunk::Trunk;
use crate::weights::Weights;
use candle_core::{DType, Device, Tensor};
use wavefuse_candle::Plan;
use wavefuse_shared::PAD;

/// Which ops run the network.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Build {
    /// candle's own ops (any float dtype).
    Candle,
    /// wavefuse's kernels where one applies (f16).
    Wavefuse,
}

impl Build {
    /// `candle` or `wavefuse`.
    pub fn name(self) -> &'static str {
        match self {
            Build::Candle => "candle",
            Build::Wavefuse => "wavefuse",
        }
    }
}

/// Deliberate wiring faults, for the tests that show a wrong network is
/// caught (not for use).
#[doc(hidden)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Faults {
    /// Concatenate the skip after layer 3's output instead of before.
    pub swap_skip: bool,
    /// Run the odd blocks unshifted.
    pub no_shift: bool,
    /// Put the surface slab after the upper-air slabs.
    pub surface_last: bool,
    /// Order the upper-air patch features `dx` before `dy`.
    pub patch_transposed: bool,
    /// Crop the recovered fields one latitude row late.
    pub crop_late: bool,
    /// Apply the upper-air statistics in reversed level order.
    pub levels_reversed: bool,
}

/// How to build the network.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// The ops.
    pub build: Build,
    /// The activation dtype (f16 for [`Build::Wavefuse`]).
    pub dtype: DType,
    /// Row chunks of each post-norm block's MLP half in the wavefuse
    /// build (1: none): the peak device memory falls with the `[rows, 4C]`
    /// hidden tensor it holds; the output does not change.
    pub mlp_chunks: usize,
    /// Test-only wiring faults.
    #[doc(hidden)]
    pub faults: Faults,
}

/// The wavefuse build's MLP chunks unless told otherwise: the hidden
/// tensor at a quarter of its full size.
pub const DEFAULT_MLP_CHUNKS: usize = 4;

impl Options {
    /// `build` computing in `dtype`.
    pub fn new(build: Build, dtype: DType) -> Options {
        Options {
            build,
            dtype,
            mlp_chunks: DEFAULT_MLP_CHUNKS,
            faults: Faults::default(),
        }
    }
}

/// The network on one device.
#[derive(Debug)]
pub struct Pangu {
    geom: Geometry,
    order: BlockOrder,
    opts: Options,
    device: Device,
    /// Normalisation in the fields' dtype: `[5, 13, 1, 1]`, `[4, 1, 1]`.
    upper_mean: Tensor,
    upper_std: Tensor,
    surface_mean: Tensor,
    surface_std: Tensor,
    /// `[3, Hp, W]` and `[1, 13, H, W]`, in the fields' dtype.
    surface_constants: Tensor,
    upper_constants: Tensor,
    embed_upper: Lin,
    embed_surface: Lin,
    trunk: Trunk,
    recover_upper: Lin,
    recover_surface: Lin,
    /// The wavefuse build's patch layouts: one gather each for the upper
    /// air and the surface ([`patch_tables`]).
    patches: Option<(Plan, Plan)>,
    wf: WavefuseOps,
}

impl Pangu {
    /// Builds the network from checked weights on `device` for fields of
    /// the geometry `geom`.
    pub fn load(w: &Weights, geom: Geometry, device: &Device, opts: Options) -> Result<Pangu> {
        let dtype = opts.dtype;
        if opts.build == Build::Wavefuse && dtype != DType::F16 {
            return Err(Error::invalid(
                "build",
                "the wavefuse build computes in f16",
            ));
        }
        let fd = field_dtype(dtype);
        let g = geom;
        let c = w.meta.width;
        let levels = |name: &str| -> Result<Tensor> {
            let t = w.get(name)?.reshape((5, 13))?;
            let t = if opts.faults.levels_reversed {
                let idx: Vec<u32> = (0..13u32).rev().collect();
                t.index_select(&Tensor::new(idx.as_slice(), t.device())?, 1)?
            } else {
                t
            };
            Ok(t.reshape((5, 13, 1, 1))?)
        };
        let act = |x: &Tensor| -> Result<Tensor> { Ok(x.to_dtype(dtype)?.to_device(device)?) };
        let fld = |x: &Tensor| -> Result<Tensor> { Ok(x.to_dtype(fd)?.to_device(device)?) };
        // The patch embedding and recovery: convolutions whose kernel is
        // their stride, as Linears with a bias.
        let lin = |name: &str, out: usize, inp: usize, transposed: bool| -> Result<Lin> {
            let wt = w.get(&format!("{name}.weight"))?;
            let m = if transposed {
                wt.reshape((inp, out))?.t()?.contiguous()?
            } else {
                wt.reshape((out, inp))?
            };
            let b = w.get(&format!("{name}.bias"))?;
            // A transposed convolution's bias is per output channel; its
            // GEMM's outputs are (channel, patch position), so each
            // channel's bias repeats over the positions.
            let n = b.elem_count();
            let b = if n != out && n > 0 && out.is_multiple_of(n) {
                b.reshape((n, 1))?
                    .broadcast_as((n, out / n))?
                    .reshape(out)?
            } else {
                b.clone()
            };
            Ok(Lin {
                w: act(&m)?,
                b: Some(act(&b)?),
            })
        };
        Ok(Pangu {
            geom: g,
            order: w.meta.order,
            opts,
            device: device.clone(),
            upper_mean: fld(&levels("upper_mean")?)?,
            upper_std: fld(&levels("upper_std")?)?,
            surface_mean: fld(&w.get("surface_mean")?.reshape((4, 1, 1))?)?,
            surface_std: fld(&w.get("surface_std")?.reshape((4, 1, 1))?)?,
            surface_constants: fld(w.get("surface_constants")?)?,
            upper_constants: fld(&w.get("upper_constants")?.unsqueeze(0)?)?,
            embed_upper: lin("patch_embed.conv", c, 192, false)?,
            embed_surface: lin("patch_embed.conv_surface", c, 112, false)?,
            trunk: Trunk::load(w, g, device, opts)?,
            recover_upper: lin("patch_recovery.conv", 160, 2 * c, true)?,
            recover_surface: lin("patch_recovery.conv_surface", 64, 2 * c, true)?,
            patches: match opts.build {
                Build::Wavefuse => {
                    let (u, nu, s, ns) = patch_tables(&g);
                    Some((Plan::new(&u, nu, device)?, Plan::new(&s, ns, device)?))
                }
                Build::Candle => None,
            },
            wf: WavefuseOps::new().with_mlp_chunks(opts.mlp_chunks),
        })
    }

    /// The fields' geometry.
    pub fn geometry(&self) -> &Geometry {
        &self.geom
    }

    /// The block order (from the weight file).
    pub fn order(&self) -> BlockOrder {
        self.order
    }

    /// The build.
    pub fn build(&self) -> Build {
        self.opts.build
    }

    /// The device.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The dtype the fields are normalised in (f32, or f64 for an f64
    /// network).
    pub fn field_dtype(&self) -> DType {
        field_dtype(self.opts.dtype)
    }

    /// The wavefuse build's step timer (see [`crate::stage::Probe`]).
    pub fn probe(&self) -> &crate::stage::Probe {
        self.wf.probe()
    }

    fn mark(&self, step: &'static str) -> Result<()> {
        Ok(self.wf.mark(step)?)
    }

    fn linear(&self, x: &Tensor, l: &Lin) -> Result<Tensor> {
        l.forward(self.opts.build, x)
    }

    fn check_fields(&self, upper: &Tensor, surface: &Tensor) -> Result<()> {
        let g = &self.geom;
        let fd = self.field_dtype();
        for (what, t, want) in [
            ("upper", upper, vec![5, 13, g.lat, g.lon]),
            ("surface", surface, vec![4, g.lat, g.lon]),
        ] {
            if t.dims() != want.as_slice() {
                return Err(Error::Shape {
                    what: what.into(),
                    got: t.dims().to_vec(),
                    want: format!("{want:?}"),
                });
            }
            if t.dtype() != fd {
                return Err(Error::Dtype {
                    what: what.into(),
                    got: format!("{:?}", t.dtype()),
                    want: format!("{fd:?}"),
                });
            }
        }
        Ok(())
    }

    /// Fields -> first-scale tokens `[8 h1 w1, C]`, the surface slab first
    /// (192 upper-air and 112 surface patch features).
    fn embed(&self, upper: &Tensor, surface: &Tensor) -> Result<Tensor> {
        let g = &self.geom;
        let (h, hp, h1, w1) = (g.lat, g.lat_padded, g.h1, g.w1);
        let dtype = self.opts.dtype;
        if let Some((pu, ps)) = &self.patches {
            // The wavefuse build: each patch layout (zero padding of levels
            // and latitudes, the patch features' order, the constants) and
            // the conversion to f16 is one gather of four-float rows.
            // Each f32 temporary (normalised fields, gather source) is
            // freed before the next is made: only the f16 patch features
            // reach the embedding GEMMs.
            let patches = |field: &Tensor,
                           mean: &Tensor,
                           std: &Tensor,
                           constants: &Tensor,
                           plan: &Plan,
                           shape: (usize, usize)|
             -> Result<Tensor> {
                let n = field.broadcast_sub(mean)?.broadcast_div(std)?;
                let src = Tensor::cat(&[n.flatten_all()?, constants.flatten_all()?], 0)?;
                drop(n);
                let rows = src.elem_count() / 4;
                let src = src.reshape((rows, 4))?;
                Ok(wavefuse_candle::gather_to_f16(&src, plan)?.reshape(shape)?)
            };
            let u = patches(
                upper,
                &self.upper_mean,
                &self.upper_std,
                &self.upper_constants,
                pu,
                (7 * h1 * w1, 192),
            )?;
            let s = patches(
                surface,
                &self.surface_mean,
                &self.surface_std,
                &self.surface_constants,
                ps,
                (h1 * w1, 112),
            )?;
            self.mark("embed_layout")?;
            return self.embed_tokens(&u, &s);
        }
        let u = upper
            .broadcast_sub(&self.upper_mean)?
            .broadcast_div(&self.upper_std)?;
        let u = Tensor::cat(&[&u, &self.upper_constants], 0)?
            .pad_with_zeros(1, 0, 1)?
            .pad_with_zeros(2, 0, hp - h)?
            .to_dtype(dtype)?;
        // [c, z, dz, y, dy, x, dx] -> [z, y, x, c, dz, dy, dx].
        let features = if self.opts.faults.patch_transposed {
            vec![1, 3, 5, 0, 2, 6, 4]
        } else {
            vec![1, 3, 5, 0, 2, 4, 6]
        };
        let u = u
            .reshape(vec![6, 7, 2, h1, 4, w1, 4])?
            .permute(features)?
            .contiguous()?
            .reshape((7 * h1 * w1, 192))?;
        let s = surface
            .broadcast_sub(&self.surface_mean)?
            .broadcast_div(&self.surface_std)?
            .pad_with_zeros(1, 0, hp - h)?;
        let s = Tensor::cat(&[&s, &self.surface_constants], 0)?.to_dtype(dtype)?;
        // [c, y, dy, x, dx] -> [y, x, c, dy, dx].
        let s = s
            .reshape((7, h1, 4, w1, 4))?
            .permute((1, 3, 0, 2, 4))?
            .contiguous()?
            .reshape((h1 * w1, 112))?;
        self.mark("embed_layout")?;
        self.embed_tokens(&u, &s)
    }

    /// Patch features (upper `[7 h1 w1, 192]`, surface `[h1 w1, 112]`) ->
    /// tokens, the surface slab first.
    fn embed_tokens(&self, u: &Tensor, s: &Tensor) -> Result<Tensor> {
        let eu = self.linear(u, &self.embed_upper)?;
        let es = self.linear(s, &self.embed_surface)?;
        self.mark("embed_gemm")?;
        let x = if self.opts.faults.surface_last {
            Tensor::cat(&[&eu, &es], 0)?
        } else {
            Tensor::cat(&[&es, &eu], 0)?
        };
        self.mark("embed_concat")?;
        Ok(x)
    }

    /// Tokens `[8 h1 w1, 2 C]` -> de-normalised fields. `x` is dropped
    /// once the recovery GEMMs have read it, and each temporary once the
    /// next is made: at most two full-size f32 copies of the upper-air
    /// fields are alive at once. Each patch layout is undone by the cast
    /// to the field dtype itself (a strided read of the GEMM output, one
    /// contiguous write: the permutation and the widening commute
    /// exactly), not by a second full-size f32 copy.
    fn recover(&self, x: Tensor) -> Result<(Tensor, Tensor)> {
        let g = &self.geom;
        let (h, hp, w, h1, w1) = (g.lat, g.lat_padded, g.lon, g.h1, g.w1);
        let fd = self.field_dtype();
        let plane = h1 * w1;
        let top = usize::from(self.opts.faults.crop_late);
        let ys = self.linear(&x.narrow(0, 0, plane)?, &self.recover_surface)?;
        let yu = self.linear(&x.narrow(0, plane, 7 * plane)?, &self.recover_upper)?;
        drop(x);
        self.mark("recover_gemm")?;
        // [y, x, c, dy, dx] -> [c, y, dy, x, dx].
        let ys = ys
            .reshape((h1, w1, 4, 4, 4))?
            .permute((2, 0, 3, 1, 4))?
            .to_dtype(fd)?
            .reshape((4, hp, w))?
            .narrow(1, top, h)?;
        // [z, y, x, c, dz, dy, dx] -> [c, z, dz, y, dy, x, dx].
        let yu = {
            let t = yu
                .reshape(vec![7, h1, w1, 5, 2, 4, 4])?
                .permute(vec![3, 0, 4, 1, 5, 2, 6])?
                .to_dtype(fd)?
                .reshape((5, 14, hp, w))?;
            drop(yu);
            let scaled = t
                .narrow(1, 0, 13)?
                .narrow(2, top, h)?
                .broadcast_mul(&self.upper_std)?;
            drop(t);
            scaled.broadcast_add(&self.upper_mean)?.contiguous()?
        };
        let ys = ys
            .broadcast_mul(&self.surface_std)?
            .broadcast_add(&self.surface_mean)?
            .contiguous()?;
        self.mark("recover_layout")?;
        Ok((yu, ys))
    }

    /// One forecast step: upper air `[5, 13, H, W]` and surface `[4, H, W]`
    /// (physical units, [`Pangu::field_dtype`], on the network's device)
    /// to the same a model interval later.
    pub fn forward(&self, upper: &Tensor, surface: &Tensor) -> Result<(Tensor, Tensor)> {
        self.check_fields(upper, surface)?;
        let x = self.embed(upper, surface)?;
        let skip = self.trunk.forward(x, &self.wf)?;
        self.recover(skip)
    }
}

/// The wavefuse build's patch-embedding gathers over rows of four floats
/// (four adjacent longitudes). The upper-air source is the normalised
/// fields `[5, 13, H, W]` followed by the constant channel `[13, H, W]`;
/// output token `(z, y, x)` of slabs 1..8 is 48 rows in feature order
/// `(var, dz, dy)` (`dx` inside the row: features
/// `((var * 2 + dz) * 4 + dy) * 4 + dx`), level `2 (z - 1) + dz` and
/// latitude `4 y + dy`, padding (-1) past 13 levels and `H` rows. The
/// surface source is the normalised fields `[4, H, W]` followed by the
/// maps `[3, Hp, W]` (padded in the file); token `(y, x)` is 28 rows in
/// order `(channel, dy)`. Returns (upper table, its source rows, surface
/// table, its source rows).
pub fn patch_tables(g: &Geometry) -> (Vec<i32>, usize, Vec<i32>, usize) {
    let (h, hp, w, h1, w1) = (g.lat, g.lat_padded, g.lon, g.h1, g.w1);
    let row = |elem: usize| (elem / 4) as i32;
    let mut upper = Vec::with_capacity(7 * h1 * w1 * 48);
    for z in 0..7 {
        for y in 0..h1 {
            for x in 0..w1 {
                for c in 0..6 {
                    for dz in 0..2 {
                        for dy in 0..4 {
                            let (l, lat) = (2 * z + dz, 4 * y + dy);
                            upper.push(if l < 13 && lat < h {
                                row(((c * 13 + l) * h + lat) * w + 4 * x)
                            } else {
                                PAD
                            });
                        }
                    }
                }
            }
        }
    }
    let mut surface = Vec::with_capacity(h1 * w1 * 28);
    for y in 0..h1 {
        for x in 0..w1 {
            for c in 0..7 {
                for dy in 0..4 {
                    let lat = 4 * y + dy;
                    surface.push(if c < 4 {
                        if lat < h {
                            row((c * h + lat) * w + 4 * x)
                        } else {
                            PAD
                        }
                    } else {
                        row(4 * h * w + ((c - 4) * hp + lat) * w + 4 * x)
                    });
                }
            }
        }
    }
    (upper, 6 * 13 * h * w / 4, surface, (4 * h + 3 * hp) * w / 4)
}

fn field_dtype(dtype: DType) -> DType {
    if dtype == DType::F64 {
        DType::F64
    } else {
        DType::F32
    }
}
