//! The Earth-specific transformer block in either order, and the two-block
//! stage, written once against [`StageOps`].
//!
//! Post-norm (the released weights, the public pseudocode): `h =
//! windows(x)`; `a = attention(h)`; `x = x + LN1(unwindows(a))`; `x = x +
//! LN2(mlp(x))`.
//!
//! Pre-norm (the profiled student model): `h = windows(LN1(x))`; `a =
//! attention(h)`; `x = x + unwindows(a)`; `x = x + mlp(LN2(x))`. norm1's
//! affine stays in the LayerNorm (the zero padding after it would not
//! survive a fold into Wqkv: see [`StageOps::norm_partition`]); norm2's is
//! folded into W1 at load or applied by the LayerNorm, as the build
//! chooses. The last residual add is left pending so that the next block's
//! entry can fuse it with its LayerNorm and partition.
//!
//! Attention in both: `qkv = h Wqkv^T + bqkv`; `q, k, v` per head (q
//! scaled); `p = softmax(q k^T + earth_bias[type] + mask)`; `o = p v`,
//! heads merged; `a = o Wproj^T + bproj`. Windows are taken after a roll by
//! `-shift` (every second block) and put back with a roll by `+shift`.
use super::config::{BlockOrder, HEAD_DIM, MaskAxes, StageConfig};
use super::ops::StageOps;
use super::tables::Windowing;
use super::weights::BlockWeights;
use candle_core::{DType, Device, Result, Tensor};
use std::collections::HashMap;

/// One block: its windowing and parameters.
#[derive(Debug)]
pub struct Block {
    heads: usize,
    order: BlockOrder,
    win: Windowing,
    w: BlockWeights,
}

impl Block {
    /// The windowing (plan, mask, types).
    pub fn windowing(&self) -> &Windowing {
        &self.win
    }

    /// The parameters.
    pub fn weights(&self) -> &BlockWeights {
        &self.w
    }

    fn attention(&self, ops: &dyn StageOps, h: &Tensor) -> Result<Tensor> {
        let (qkv, qkv_bias) = ops.qkv(h, &self.w)?;
        ops.mark("qkv_gemm")?;
        let bias = self.w.earth_bias.expanded()?;
        let o = ops.attention(&qkv, qkv_bias, &bias, self.heads, &self.win)?;
        ops.proj(&o, &self.w, &self.win)
    }

    /// Runs the block on the residual `x` `[N, C]`, with `pending` a
    /// pre-norm block's MLP output not yet added to it. Returns the new
    /// residual and, for a pre-norm block, this block's MLP output still to
    /// be added (the caller adds it, or the next block's entry does).
    pub fn forward(
        &self,
        ops: &dyn StageOps,
        x: &Tensor,
        pending: Option<&Tensor>,
    ) -> Result<(Tensor, Option<Tensor>)> {
        match self.order {
            BlockOrder::Post => {
                let x = match pending {
                    None => x.clone(),
                    Some(d) => ops.add(x, d)?,
                };
                let h = ops.partition(&x, &self.win)?;
                let a = self.attention(ops, &h)?;
                let x = ops.unpartition_norm_add(&x, &a, &self.w.norm1, &self.win)?;
                Ok((ops.mlp_norm_add(&x, &self.w)?, None))
            }
            BlockOrder::Pre => {
                let (x, h) = match pending {
                    None => (x.clone(), ops.norm_partition(x, &self.w.norm1, &self.win)?),
                    Some(d) => ops.add_norm_partition(x, d, &self.w.norm1, &self.win)?,
                };
                let a = self.attention(ops, &h)?;
                let (x, h) = ops.unpartition_add_norm(&x, &a, &self.w.norm2, &self.win)?;
                let m = ops.mlp(&h, &self.w)?;
                Ok((x, Some(m)))
            }
        }
    }
}

/// Two blocks (unshifted, shifted) on one grid.
#[derive(Debug)]
pub struct Stage {
    cfg: StageConfig,
    dtype: DType,
    blocks: Vec<Block>,
}

impl Stage {
    /// Builds the stage from weights in the file layout
    /// ([`crate::stage::weights`]), on `device`, computing in `dtype`
    /// (f16: the stage; f32/f64: for checks).
    pub fn load(
        cfg: StageConfig,
        t: &HashMap<String, Tensor>,
        device: &Device,
        dtype: DType,
    ) -> Result<Stage> {
        if cfg.dim != cfg.heads * HEAD_DIM {
            candle_core::bail!("dim {} is not {} heads of {HEAD_DIM}", cfg.dim, cfg.heads);
        }
        let mut blocks = Vec::new();
        for i in 0..2 {
            let shift = cfg.block_shift(i);
            let win = match cfg.mask {
                MaskAxes::LevelLatitude => {
                    Windowing::earth(cfg.grid, cfg.window, shift, device, dtype)?
                }
                MaskAxes::All => Windowing::new(cfg.grid, cfg.window, shift, device, dtype)?,
            };
            let w = BlockWeights::load(t, i, &cfg, &win, device, dtype)?;
            blocks.push(Block {
                heads: cfg.heads,
                order: cfg.order,
                win,
                w,
            });
        }
        Ok(Stage { cfg, dtype, blocks })
    }

    /// The configuration.
    pub fn config(&self) -> &StageConfig {
        &self.cfg
    }

    /// The blocks, unshifted first.
    pub fn blocks(&self) -> &[Block] {
        &self.blocks
    }

    /// The stage input from the weight file (`x` `[Z, H, W, C]`) as `[N, C]`
    /// in the stage's dtype on `device`.
    pub fn input(&self, t: &HashMap<String, Tensor>, device: &Device) -> Result<Tensor> {
        let g = self.cfg.grid;
        let x = t
            .get("x")
            .ok_or_else(|| candle_core::Error::Msg("weights: `x` missing".into()))?;
        if x.dims() != [g.z, g.h, g.w, self.cfg.dim] {
            candle_core::bail!(
                "weights: `x` is {:?}, expected {:?}",
                x.dims(),
                [g.z, g.h, g.w, self.cfg.dim]
            );
        }
        x.to_dtype(self.dtype)?
            .reshape((self.cfg.tokens(), self.cfg.dim))?
            .to_device(device)
    }

    /// Both blocks: `[N, C]` -> `[N, C]`.
    pub fn forward(&self, ops: &dyn StageOps, x: &Tensor) -> Result<Tensor> {
        let mut x = x.clone();
        let mut pending: Option<Tensor> = None;
        for b in &self.blocks {
            let (nx, m) = b.forward(ops, &x, pending.as_ref())?;
            x = nx;
            pending = m;
        }
        match pending {
            Some(m) => ops.add(&x, &m),
            None => Ok(x),
        }
    }

    /// Block `i` alone: `[N, C]` -> `[N, C]`.
    pub fn forward_block(&self, ops: &dyn StageOps, i: usize, x: &Tensor) -> Result<Tensor> {
        let b = self
            .blocks
            .get(i)
            .ok_or_else(|| candle_core::Error::Msg(format!("no block {i}")))?;
        match b.forward(ops, x, None)? {
            (x, Some(m)) => ops.add(&x, &m),
            (x, None) => Ok(x),
        }
    }
}
