//! The stage with wavefuse's kernels wherever one applies. NOT WIRED YET:
//! every method fails with an error naming the step. The kernels it will
//! launch, on candle's stream and candle's buffers (wavefuse's foreign
//! memory and caller streams, issue 13; the CustomOps, issue 14):
//!
//! | step | wavefuse kernel |
//! |---|---|
//! | `norm_partition` | `layer_norm_gather` (affine) with the plan's partition table |
//! | `add_norm_partition` | `add_layer_norm_gather` (affine; residual updated in place) |
//! | `split_heads` | `qkv_split` (bias added, q scaled) |
//! | `attn_softmax` | `bias_mask_softmax` (type and mask-slot tables) |
//! | `unpartition_add_norm` | `gather` with the reverse table, then `add_layer_norm` (no affine) |
//! | `bias_gelu` | `bias_gelu` (exact) |
//! | `add` | candle's add (no kernel of its own) |
use super::ops::{Affine, StageOps};
use super::tables::Windowing;
use candle_core::{Result, Tensor};

/// candle + wavefuse kernels (not wired yet: see the module docs).
#[derive(Debug, Default)]
pub struct WavefuseOps {
    _not_wired: (),
}

impl WavefuseOps {
    /// The wavefuse build's ops.
    pub fn new() -> WavefuseOps {
        WavefuseOps::default()
    }
}

fn not_wired<T>(step: &str) -> Result<T> {
    Err(candle_core::Error::Msg(format!(
        "wavefuse build: `{step}` is not wired to its wavefuse kernel yet"
    )))
}

impl StageOps for WavefuseOps {
    fn name(&self) -> &'static str {
        "wavefuse"
    }

    fn norm_partition(&self, _x: &Tensor, _norm: &Affine, _win: &Windowing) -> Result<Tensor> {
        not_wired("norm_partition")
    }

    fn add_norm_partition(
        &self,
        _x: &Tensor,
        _d: &Tensor,
        _norm: &Affine,
        _win: &Windowing,
    ) -> Result<(Tensor, Tensor)> {
        not_wired("add_norm_partition")
    }

    fn split_heads(
        &self,
        _qkv: &Tensor,
        _bias: &Tensor,
        _heads: usize,
        _scale: f64,
        _win: &Windowing,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        not_wired("split_heads")
    }

    fn attn_softmax(
        &self,
        _scores: &Tensor,
        _earth_bias: &Tensor,
        _win: &Windowing,
    ) -> Result<Tensor> {
        not_wired("attn_softmax")
    }

    fn unpartition_add_norm(
        &self,
        _x: &Tensor,
        _branch: &Tensor,
        _win: &Windowing,
    ) -> Result<(Tensor, Tensor)> {
        not_wired("unpartition_add_norm")
    }

    fn bias_gelu(&self, _h: &Tensor, _bias: &Tensor) -> Result<Tensor> {
        not_wired("bias_gelu")
    }

    fn add(&self, _x: &Tensor, _d: &Tensor) -> Result<Tensor> {
        not_wired("add")
    }
}
