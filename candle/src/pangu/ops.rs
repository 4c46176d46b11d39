//! The stage's fusion points: every step between two GEMMs where a wavefuse
//! kernel applies. The block (`block.rs`) is written once against this
//! trait; [`crate::pangu::CandleOps`] implements it with candle's own ops,
//! [`crate::pangu::WavefuseOps`] with wavefuse's kernels.
//!
//! Shapes (all f16 on the stage's device): the residual stream `x` is
//! `[N, C]` in grid order (`N = Z * H * W`); windowed tokens are
//! `[windows * T, C]` in [`wavefuse_shared::window::WindowPlan`]'s order;
//! per-head tensors `[windows, heads, T, head_dim]`; attention scores
//! `[windows, heads, T, T]`.
use super::tables::Windowing;
use candle_core::{Result, Tensor};

/// A LayerNorm's affine parameters, `[C]` each.
#[derive(Debug)]
pub struct Affine {
    /// Scale.
    pub gamma: Tensor,
    /// Shift.
    pub beta: Tensor,
}

/// One build of the stage's non-GEMM steps.
pub trait StageOps {
    /// The build's name (`candle`, `wavefuse`).
    fn name(&self) -> &'static str;

    /// A block's entry when nothing is pending: `windows(LayerNorm(x) *
    /// gamma + beta)` with zero tokens in the padding. The affine stays
    /// here, not folded into the QKV Linear: PyTorch pads the affine
    /// output with zeros, and a folded Linear would turn those zeros into
    /// `beta`-valued tokens that the edge windows attend to.
    fn norm_partition(&self, x: &Tensor, norm: &Affine, win: &Windowing) -> Result<Tensor>;

    /// A block's entry after a block whose MLP output `d` is not yet in the
    /// residual: returns `(x + d, windows(LayerNorm(x + d) * gamma + beta))`.
    fn add_norm_partition(
        &self,
        x: &Tensor,
        d: &Tensor,
        norm: &Affine,
        win: &Windowing,
    ) -> Result<(Tensor, Tensor)>;

    /// The QKV Linear's output without its bias, `[windows * T, 3C]`
    /// (per token `[q | k | v]`, heads major) -> `(q * scale, k, v)` after
    /// adding `bias` `[3C]`.
    fn split_heads(
        &self,
        qkv: &Tensor,
        bias: &Tensor,
        heads: usize,
        scale: f64,
        win: &Windowing,
    ) -> Result<(Tensor, Tensor, Tensor)>;

    /// `softmax(scores + earth_bias[type(w)] + mask[w])` over the last
    /// axis; `earth_bias` is `[types, heads, T, T]`, the mask the block's
    /// (none when unshifted).
    fn attn_softmax(&self, scores: &Tensor, earth_bias: &Tensor, win: &Windowing)
    -> Result<Tensor>;

    /// The attention branch `[windows * T, C]` back to grid order (reverse
    /// partition, roll back, crop), added to the residual: returns
    /// `(x + branch, LayerNorm(x + branch))` (no affine: norm2's is folded
    /// into the MLP's first Linear, exact here since no padding follows).
    fn unpartition_add_norm(
        &self,
        x: &Tensor,
        branch: &Tensor,
        win: &Windowing,
    ) -> Result<(Tensor, Tensor)>;

    /// `gelu(h + bias)` (exact, erf) over the MLP's first Linear output
    /// without its bias.
    fn bias_gelu(&self, h: &Tensor, bias: &Tensor) -> Result<Tensor>;

    /// The last residual add, `x + d`.
    fn add(&self, x: &Tensor, d: &Tensor) -> Result<Tensor>;
}
