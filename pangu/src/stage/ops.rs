//! The stage's fusion points: every step between two GEMMs where a wavefuse
//! kernel applies. The block (`block.rs`) is written once against this
//! trait; [`crate::stage::CandleOps`] implements it with candle's own ops,
//! [`crate::stage::WavefuseOps`] with wavefuse's kernels.
//!
//! Shapes (all in the stage's dtype on its device): the residual stream `x`
//! is `[N, C]` in grid order (`N = Z * H * W`); windowed tokens are
//! `[windows * T, C]` in [`wavefuse_shared::window::WindowPlan`]'s order.
use super::tables::Windowing;
use super::weights::BlockWeights;
use candle_core::{Result, Tensor};

/// `x W^T` (candle's GEMM: cuBLAS on CUDA).
pub fn matmul_t(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    x.matmul(&w.t()?)
}

/// A LayerNorm's affine parameters, `[C]` each, and the two packed as the
/// wavefuse ops take them.
#[derive(Debug)]
pub struct Affine {
    /// Scale.
    pub gamma: Tensor,
    /// Shift.
    pub beta: Tensor,
    /// `[gamma; beta]` in f16 ([`wavefuse_candle::Affine`]).
    pub packed: wavefuse_candle::Affine,
}

impl Affine {
    /// The parameters and their packed form.
    pub fn new(gamma: Tensor, beta: Tensor) -> Result<Affine> {
        let packed = wavefuse_candle::Affine::new(&gamma, &beta)?;
        Ok(Affine {
            gamma,
            beta,
            packed,
        })
    }
}

/// One build of the stage's non-GEMM steps.
pub trait StageOps {
    /// The build's name (`candle`, `wavefuse`).
    fn name(&self) -> &'static str;

    /// The end of a step (the time breakdown's boundary; see
    /// [`crate::stage::Probe`]). The block marks its GEMMs and bias adds,
    /// the builds mark their own steps.
    fn mark(&self, _step: &'static str) -> Result<()> {
        Ok(())
    }

    /// A block's entry when nothing is pending: `windows(LayerNorm(x) *
    /// gamma + beta)` with zero tokens in the padding. The affine stays
    /// here, not folded into the QKV Linear: PyTorch pads the affine
    /// output with zeros, and a folded Linear would turn those zeros into
    /// `beta`-valued tokens that the edge windows attend to.
    fn norm_partition(&self, x: &Tensor, norm: &Affine, win: &Windowing) -> Result<Tensor>;

    /// A block's entry after a block whose MLP output `d` is not yet in the
    /// residual: returns `(x + d, windows(LayerNorm(x + d) * gamma + beta))`.
    /// `x` is always a residual the stage made itself (never its input), so
    /// a build may update it in place and return it.
    fn add_norm_partition(
        &self,
        x: &Tensor,
        d: &Tensor,
        norm: &Affine,
        win: &Windowing,
    ) -> Result<(Tensor, Tensor)>;

    /// The QKV Linear on the windowed tokens `h` `[windows * T, C]`:
    /// `[windows * T, 3C]`, and the bias still to be added by
    /// [`StageOps::attention`] (`None` when the build adds it in the
    /// GEMM's epilogue). By default candle's GEMM, the bias left to the
    /// attention.
    fn qkv<'w>(&self, h: &Tensor, w: &'w BlockWeights) -> Result<(Tensor, Option<&'w Tensor>)> {
        Ok((matmul_t(h, &w.qkv_w)?, Some(&w.qkv_b)))
    }

    /// Window attention from the QKV Linear's output `[windows * T, 3C]`
    /// (per token `[q | k | v]`, heads major): adds `qkv_bias` `[3C]` when
    /// given, scales q by `head_dim^-0.5`, and returns
    /// `softmax(q k^T + earth_bias[type(w)] + mask[w]) v` with the heads
    /// merged, `[windows * T, C]` (what the output projection reads).
    /// `earth_bias` is `[types, heads, T, T]`; the mask the block's (none
    /// when unshifted).
    fn attention(
        &self,
        qkv: &Tensor,
        qkv_bias: Option<&Tensor>,
        earth_bias: &Tensor,
        heads: usize,
        win: &Windowing,
    ) -> Result<Tensor>;

    /// The output projection of the merged heads `o` `[windows * T, C]`:
    /// `o Wproj^T + bproj` (cuBLAS in every build).
    fn proj(&self, o: &Tensor, w: &BlockWeights, win: &Windowing) -> Result<Tensor>;

    /// The MLP on `h` `[N, C]` (norm2's affine applied by
    /// [`StageOps::unpartition_add_norm`] or folded into the first Linear,
    /// as the build chooses): `gelu(h W1^T + b1) W2^T + b2`, exact GELU
    /// (the GEMMs are cuBLAS in every build).
    fn mlp(&self, h: &Tensor, w: &BlockWeights) -> Result<Tensor>;

    /// The attention branch `[windows * T, C]` back to grid order (reverse
    /// partition, roll back, crop), added to the residual: returns
    /// `(x + branch, h)`, `h` the MLP's input: `LayerNorm(x + branch)`
    /// without affine where the build folds `norm2` into the MLP's first
    /// Linear (exact here since no padding follows; candle's build), or
    /// with `norm2`'s affine where its [`StageOps::mlp`] uses the Linear as
    /// trained (the wavefuse build: the LayerNorm kernel applies an affine
    /// for free, and unfolded weights are not rounded twice). `x` may be
    /// the stage's input: it is not updated.
    fn unpartition_add_norm(
        &self,
        x: &Tensor,
        branch: &Tensor,
        norm2: &Affine,
        win: &Windowing,
    ) -> Result<(Tensor, Tensor)>;

    /// The last residual add, `x + d`; `x` is a residual the stage made
    /// (a build may update it in place and return it).
    fn add(&self, x: &Tensor, d: &Tensor) -> Result<Tensor>;

    /// A post-norm block's entry: `windows(x)` with zero tokens in the
    /// padding (no LayerNorm before the attention).
    fn partition(&self, x: &Tensor, win: &Windowing) -> Result<Tensor>;

    /// A post-norm block's attention exit: `x + LayerNorm(reverse(branch))
    /// * gamma + beta`, the reverse being un-partition, roll back, crop.
    /// `x` may be the stage's input: it is not updated.
    fn unpartition_norm_add(
        &self,
        x: &Tensor,
        branch: &Tensor,
        norm1: &Affine,
        win: &Windowing,
    ) -> Result<Tensor>;

    /// A post-norm block's MLP half: `x + LayerNorm(mlp(x)) * gamma + beta`
    /// with the MLP's first Linear as trained. `x` is a residual the stage
    /// made (the block's [`StageOps::unpartition_norm_add`] output): a
    /// build may update it in place and return it.
    fn mlp_norm_add(&self, x: &Tensor, w: &BlockWeights) -> Result<Tensor>;
}
