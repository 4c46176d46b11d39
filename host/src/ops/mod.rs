//! One module per kernel family: argument checks, then one launch.
pub mod add_layer_norm;
pub mod add_layer_norm_gather;
pub mod bias_gelu;
pub mod bias_mask_add;
pub mod bias_mask_softmax;
pub mod gather;
pub mod layer_norm;
pub mod layer_norm_gather;
pub mod qkv_split;

/// Every kernel entry point the backends load.
pub const KERNELS: &[&str] = &[
    "wf_layer_norm_192",
    "wf_layer_norm_384",
    "wf_layer_norm_768",
    "wf_layer_norm_affine_192",
    "wf_layer_norm_affine_384",
    "wf_layer_norm_affine_768",
    "wf_add_layer_norm_192",
    "wf_add_layer_norm_384",
    "wf_add_layer_norm_768",
    "wf_add_layer_norm_affine_192",
    "wf_add_layer_norm_affine_384",
    "wf_add_layer_norm_affine_768",
    "wf_layer_norm_gather_192",
    "wf_layer_norm_gather_384",
    "wf_layer_norm_gather_768",
    "wf_layer_norm_gather_affine_192",
    "wf_layer_norm_gather_affine_384",
    "wf_layer_norm_gather_affine_768",
    "wf_gather_192",
    "wf_gather_384",
    "wf_gather_768",
    "wf_gather_generic",
    "wf_add_layer_norm_gather_192",
    "wf_add_layer_norm_gather_384",
    "wf_add_layer_norm_gather_768",
    "wf_add_layer_norm_gather_affine_192",
    "wf_add_layer_norm_gather_affine_384",
    "wf_add_layer_norm_gather_affine_768",
    "wf_bias_gelu_f16",
    "wf_bias_gelu_bf16",
    "wf_bias_gelu_tanh_f16",
    "wf_bias_gelu_tanh_bf16",
    "wf_bias_gelu_f16_scalar",
    "wf_bias_gelu_bf16_scalar",
    "wf_bias_gelu_tanh_f16_scalar",
    "wf_bias_gelu_tanh_bf16_scalar",
    "wf_qkv_split",
    "wf_qkv_split_bias",
    "wf_bias_mask_add",
    "wf_bias_mask_add_nomask",
    "wf_bias_mask_softmax_144",
    "wf_bias_mask_softmax_nomask_144",
];

use crate::buffer::Span;
use crate::device::Device;
use crate::{Error, Result};

/// Alignment of the 16-byte vector path.
pub(crate) const VEC_ALIGN: u64 = 16;

/// The largest grid dimension every backend accepts.
pub(crate) const MAX_GRID: usize = i32::MAX as usize;

pub(crate) struct Check<'a> {
    pub dev: &'a Device,
    pub op: &'static str,
}

impl Check<'_> {
    pub fn same_device(&self, s: &Span, what: &'static str) -> Result<()> {
        self.dev.check_same(s.dev, self.op, what)
    }

    pub fn aligned(&self, s: &Span, what: &'static str) -> Result<()> {
        if s.ptr.is_multiple_of(VEC_ALIGN) {
            Ok(())
        } else {
            Err(Error::Misaligned {
                op: self.op,
                what,
                addr: s.ptr,
                align: VEC_ALIGN,
            })
        }
    }

    pub fn len(&self, s: &Span, what: &'static str, expected: usize) -> Result<()> {
        if s.len == expected {
            Ok(())
        } else {
            Err(Error::LengthMismatch {
                op: self.op,
                what,
                got: s.len,
                expected,
            })
        }
    }

    /// Rows of a [rows, width] tensor (>= 1).
    pub fn rows(&self, s: &Span, what: &'static str, width: usize) -> Result<usize> {
        if s.len == 0 {
            return Err(Error::Empty { op: self.op, what });
        }
        if !s.len.is_multiple_of(width) {
            return Err(Error::RaggedRows {
                op: self.op,
                what,
                len: s.len,
                width,
            });
        }
        Ok(s.len / width)
    }

    pub fn disjoint(&self, a: &Span, an: &'static str, b: &Span, bn: &'static str) -> Result<()> {
        if a.overlaps(b) {
            Err(Error::Aliasing {
                op: self.op,
                a: an,
                b: bn,
            })
        } else {
            Ok(())
        }
    }

    pub fn grid(&self, rows: usize, blocks: usize) -> Result<u32> {
        if blocks > MAX_GRID {
            return Err(Error::TooLarge {
                op: self.op,
                rows,
                blocks,
            });
        }
        Ok(blocks as u32)
    }

    pub fn finite_nonneg(&self, v: f32, what: &'static str) -> Result<()> {
        if v.is_finite() && v >= 0.0 {
            Ok(())
        } else {
            Err(Error::BadParameter {
                op: self.op,
                what,
                value: v.to_string(),
                why: "must be finite and >= 0",
            })
        }
    }
}
