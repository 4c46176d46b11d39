//! Upsample, second scale to first: Linear 384 -> 768 without bias, split
//! each coarse token into a 2 x 2 patch of fine tokens (the inverse of the
//! downsample's merge order: channels `(2 dy + dx) * 192 ..` go to fine
//! token `(z, 2i + dy, 2j + dx)`), crop latitude to `h1`, `LayerNorm(192)`
//! with affine, Linear 192 -> 192 without bias.
use crate::config::{Geometry, SLABS};
use crate::error::Result;
use crate::model::Build;
use crate::nn::{Lin, layer_norm};
use crate::stage::config::LN_EPS;
use crate::stage::{Affine, StageOps};
use candle_core::{Device, Tensor};
use wavefuse_candle::Plan;

/// The split and crop as a gather table over the coarse tokens' parts
/// (each coarse token's 768 channels read as 4 rows of 192): fine token
/// `(z, y, x)` is part `(y % 2, x % 2)` of coarse token `(z, y / 2, x /
/// 2)`. The fine rows past `h1` are never read: that is the crop.
pub fn split_table(g: &Geometry) -> Vec<i32> {
    let mut t = Vec::with_capacity(g.n1());
    for z in 0..SLABS {
        for y in 0..g.h1 {
            for x in 0..g.w1 {
                let coarse = (z * g.h2 + y / 2) * g.w2 + x / 2;
                t.push((coarse * 4 + (y % 2) * 2 + x % 2) as i32);
            }
        }
    }
    t
}

/// The upsample of one geometry, in one build.
#[derive(Debug)]
pub struct Upsample {
    geom: Geometry,
    /// First-scale channels `C`.
    width: usize,
    build: Build,
    linear1: Lin,
    norm: Affine,
    linear2: Lin,
    /// The wavefuse build's split and crop (one `layer_norm_gather` through
    /// [`split_table`], the norm applied on the way).
    split: Option<Plan>,
}

impl Upsample {
    /// From `linear1` `[4 C, 2 C]`, `norm` (`C` channels) and `linear2`
    /// `[C, C]`, in the network's dtype on `device`; `width` is `C`.
    pub fn new(
        geom: Geometry,
        width: usize,
        build: Build,
        linear1: Tensor,
        norm: Affine,
        linear2: Tensor,
        device: &Device,
    ) -> Result<Upsample> {
        let split = match build {
            Build::Wavefuse => Some(Plan::new(&split_table(&geom), geom.n2() * 4, device)?),
            Build::Candle => None,
        };
        Ok(Upsample {
            geom,
            width,
            build,
            linear1: Lin::no_bias(linear1),
            norm,
            linear2: Lin::no_bias(linear2),
            split,
        })
    }

    /// Second-scale tokens `[8 h2 w2, 2 C]` -> first-scale tokens `[8 h1
    /// w1, C]`. `ops` marks the steps.
    pub fn forward(&self, x: &Tensor, ops: &dyn StageOps) -> Result<Tensor> {
        let (g, c) = (&self.geom, self.width);
        let y = self.linear1.forward(self.build, x)?;
        ops.mark("split_gemm")?;
        let y = match &self.split {
            Some(split) => wavefuse_candle::layer_norm_gather(
                &y.reshape((g.n2() * 4, c))?,
                split,
                Some(&self.norm.packed),
                LN_EPS,
            )?,
            None => {
                let y = y
                    .reshape((SLABS, g.h2, g.w2, 2, 2 * c))?
                    .permute((0, 1, 3, 2, 4))?
                    .reshape((SLABS, 2 * g.h2, g.w1, c))?
                    .narrow(1, 0, g.h1)?
                    .contiguous()?
                    .reshape((g.n1(), c))?;
                layer_norm(self.build, &y, &self.norm)?
            }
        };
        ops.mark("split_norm")?;
        let y = self.linear2.forward(self.build, &y)?;
        ops.mark("split_gemm")?;
        Ok(y)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::downsample::merge_table;

    #[test]
    fn merge_and_split_are_inverse_on_the_grid() {
        let g = Geometry::new(25, 96).unwrap();
        let m = merge_table(&g);
        let s = split_table(&g);
        // Every fine token is merged once; the split reads it back from
        // where the merge put it.
        let mut seen = vec![0; g.n1()];
        for &v in m.iter().filter(|&&v| v >= 0) {
            seen[v as usize] += 1;
        }
        assert!(seen.iter().all(|&c| c == 1));
        for (fine, &slot) in s.iter().enumerate() {
            assert_eq!(m[slot as usize], fine as i32);
        }
        // h1 = 7 is odd: the last coarse row's second half is padding.
        assert_eq!(m.iter().filter(|&&v| v < 0).count(), 8 * g.w2 * 2);
    }
}
