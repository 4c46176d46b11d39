//! wavefuse in candle: every wavefuse kernel as a candle op.
//!
//! # The ops
//! Each kernel is a candle `CustomOp1/2/3` (fresh output) or
//! `InplaceOp1/2/3` (updates its first tensor), plus a typed function:
//!
//! | function | op | kernel |
//! |---|---|---|
//! | [`layer_norm`] | [`LayerNorm`] | LayerNorm ± affine |
//! | [`add_layer_norm`] | [`AddLayerNorm`] (in place) | residual add + LayerNorm |
//! | [`add_layer_norm_to`] | [`AddLayerNormTo`] | the same, residual untouched |
//! | [`gather`] | [`Gather`] | token gather through a [`Plan`] |
//! | [`gather_to_f16`] | [`GatherToF16`] | rows of four `f32` gathered through a [`Plan`] and rounded to `f16` |
//! | [`layer_norm_gather`] | [`LayerNormGather`] | LayerNorm + gather |
//! | [`add_layer_norm_gather`] | [`AddLayerNormGather`] (in place) | residual add + LayerNorm + gather |
//! | [`bias_gelu`] | [`BiasGelu`] | bias (f16 or bf16) + GELU (erf or tanh) |
//! | [`qkv_split`] | [`QkvSplit`] | QKV split, bias added, q scaled |
//! | [`bias_mask_add`] | [`BiasMaskAdd`] (in place) | earth bias + shift mask added to scores |
//! | [`bias_mask_softmax`], [`bias_mask_softmax_`] | [`BiasMaskSoftmax`] | the same fused with the softmax |
//! | [`window_attention`] | [`WindowAttention`] | fused window attention from the QKV output (bias, scale, earth bias, shift mask, softmax, `p v`, heads merged) |
//! | [`BiasAdd::add_`] | [`BiasMaskAdd`] (in place) | a Linear's bias added to its output rows |
//! | [`linear`] | [`Linear`] | not a wavefuse kernel: cuBLASLt's GEMM with the bias in its epilogue (one rounding), for the stage's Linears |
//! | [`linear_no_bias`] | [`LinearNoBias`] | the same GEMM without a bias (the default epilogue), for the model's bias-less Linears |
//!
//! Tensors are f16 (the GELU bias may be bf16). Index tables and shift
//! masks ([`Plan`], [`AttnTables`]) are built once per layout on the
//! tensor's device and reused; LayerNorm affines are packed once
//! ([`Affine`]).
//!
//! # Where they run
//! - CUDA tensors: on candle's own stream, over candle's own memory (views
//!   at the layout's start offset, outputs allocated by candle's device),
//!   no copies and no synchronisation. One wavefuse device per CUDA
//!   ordinal, opened on first use and kept.
//! - CPU tensors: through wavefuse's CPU emulator (the same kernel source),
//!   staged through emulator buffers: a correctness backend, not a fast
//!   one.
//!
//! # Operand rule
//! Every tensor operand must be contiguous and start on a 16-byte boundary
//! of its storage (f16: an element offset that is a multiple of 8), as the
//! kernels' vector paths read it. Anything else is an error naming the op
//! and the argument and what to call (`.contiguous()`,
//! `.force_contiguous()`); the
//! adapter never copies behind the caller's back. Dtype and shape errors
//! name the op and the argument too; wavefuse's own checks (widths,
//! aliasing, devices) come back as candle errors prefixed with the op.
//!
//! # The model
//! The Pangu-Weather model built on these ops is the `pangu` crate of this
//! workspace; this crate holds the ops only.
#![deny(missing_docs)]

#[macro_use]
mod runner;

mod attn;
mod bias;
mod gather;
mod gelu;
mod layer_norm;
mod linear;
mod qkv;

pub use attn::{
    AttnTables, BiasMaskAdd, BiasMaskSoftmax, WindowAttention, bias_mask_add, bias_mask_softmax,
    bias_mask_softmax_, window_attention,
};
pub use bias::BiasAdd;
pub use gather::{
    AddLayerNormGather, Gather, GatherToF16, LayerNormGather, Plan, add_layer_norm_gather, gather,
    gather_to_f16, layer_norm_gather,
};
pub use gelu::{BiasGelu, bias_gelu};
pub use layer_norm::{
    AddLayerNorm, AddLayerNormTo, Affine, LayerNorm, add_layer_norm, add_layer_norm_to, layer_norm,
};
pub use linear::{Linear, LinearNoBias, linear, linear_no_bias};
pub use qkv::{HEAD_DIM, QkvSplit, qkv_split};
pub use wavefuse::GeluMode;
