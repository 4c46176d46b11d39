//! Downsample, first scale to second: pad latitude with zero tokens at the
//! end to `2 h2`, merge each 2 x 2 patch of tokens into one token of 768
//! channels, `LayerNorm(768)` with affine, Linear 768 -> 384 without bias.
//!
//! Merge order (the public pseudocode's and pangu-pytorch's): coarse token
//! `(z, i, j)` is the concatenation, in order `(dy, dx)` = (0,0), (0,1),
//! (1,0), (1,1), of fine tokens `(z, 2i + dy, 2j + dx)`: channel
//! `(2 dy + dx) * 192 + c` is channel `c` of part `(dy, dx)`.
use crate::config::{Geometry, SLABS};
use crate::error::Result;
use crate::model::Build;
use crate::nn::{Lin, layer_norm};
use crate::stage::{Affine, StageOps};
use candle_core::{Device, Tensor};
use wavefuse_candle::Plan;

/// The merge as a gather table: row `4 t + 2 dy + dx` of the merged
/// tokens is fine token `(z, 2i + dy, 2j + dx)` of coarse token `t = (z,
/// i, j)`, or `-1` (zeros) past the fine grid's last latitude.
pub fn merge_table(g: &Geometry) -> Vec<i32> {
    let mut t = Vec::with_capacity(g.n2() * 4);
    for z in 0..SLABS {
        for i in 0..g.h2 {
            for j in 0..g.w2 {
                for dy in 0..2 {
                    for dx in 0..2 {
                        let (y, x) = (2 * i + dy, 2 * j + dx);
                        // Below the grid sizes Geometry::new admits.
                        t.push(if y < g.h1 {
                            ((z * g.h1 + y) * g.w1 + x) as i32
                        } else {
                            -1
                        });
                    }
                }
            }
        }
    }
    t
}

/// The downsample of one geometry, in one build.
#[derive(Debug)]
pub struct Downsample {
    geom: Geometry,
    /// First-scale channels `C`.
    width: usize,
    build: Build,
    norm: Affine,
    reduction: Lin,
    /// The wavefuse build's merge (one gather through [`merge_table`]).
    merge: Option<Plan>,
}

impl Downsample {
    /// From `norm` (`4 C` channels) and the reduction's weight `[2 C,
    /// 4 C]`, both in the network's dtype on `device`; `width` is `C`.
    pub fn new(
        geom: Geometry,
        width: usize,
        build: Build,
        norm: Affine,
        reduction: Tensor,
        device: &Device,
    ) -> Result<Downsample> {
        let merge = match build {
            Build::Wavefuse => Some(Plan::new(&merge_table(&geom), geom.n1(), device)?),
            Build::Candle => None,
        };
        Ok(Downsample {
            geom,
            width,
            build,
            norm,
            reduction: Lin::no_bias(reduction),
            merge,
        })
    }

    /// First-scale tokens `[8 h1 w1, C]` -> second-scale tokens `[8 h2
    /// w2, 2 C]`. `ops` marks the steps.
    pub fn forward(&self, x: &Tensor, ops: &dyn StageOps) -> Result<Tensor> {
        let (g, c) = (&self.geom, self.width);
        let m = match &self.merge {
            Some(merge) => wavefuse_candle::gather(x, merge)?.reshape((g.n2(), 4 * c))?,
            None => x
                .reshape((SLABS, g.h1, g.w1, c))?
                .pad_with_zeros(1, 0, 2 * g.h2 - g.h1)?
                .reshape((SLABS, g.h2, 2, g.w2, 2 * c))?
                .permute((0, 1, 3, 2, 4))?
                .contiguous()?
                .reshape((g.n2(), 4 * c))?,
        };
        ops.mark("merge")?;
        let m = layer_norm(self.build, &m, &self.norm)?;
        ops.mark("merge_norm")?;
        let y = self.reduction.forward(self.build, &m)?;
        ops.mark("merge_gemm")?;
        Ok(y)
    }
}
