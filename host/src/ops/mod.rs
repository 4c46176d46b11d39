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
pub mod region_labels;
pub mod window_attention;

use crate::buffer::Span;
use crate::device::Stream;
use crate::{Error, Result};
use wavefuse_shared::Target;

/// Alignment of the 16-byte vector path.
pub(crate) const VEC_ALIGN: u64 = 16;

/// The largest grid x dimension every backend accepts (CUDA: 2^31 - 1).
pub(crate) const MAX_GRID: usize = i32::MAX as usize;

/// The most threads one launch may have (HIP counts grid x block threads
/// in 32 bits).
pub(crate) const MAX_THREADS: u64 = u32::MAX as u64;
/// Workgroups along y in one launch (CUDA's `gridDim.y` limit; HIP's is
/// not lower): an op with a 2D grid splits a longer launch.
pub(crate) const MAX_GRID_Y: usize = 65_535;

/// The argument checks of one op on one stream.
pub(crate) struct Check<'a> {
    pub q: &'a Stream,
    pub op: &'static str,
}

impl Check<'_> {
    pub fn same_device(&self, s: &Span, what: &'static str) -> Result<()> {
        self.q.check_same(s.dev, self.op, what)
    }

    /// The kernel build the stream's device runs.
    pub fn target(&self) -> Target {
        self.q.info().backend.target()
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

    /// Rows of a [rows, width] tensor (0 rows is a valid, empty tensor:
    /// each op checks its arguments and then returns without a launch).
    pub fn rows(&self, s: &Span, what: &'static str, width: usize) -> Result<usize> {
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

    /// `blocks` workgroups of `block` threads as a grid dimension, or
    /// [`Error::TooLarge`] past what every backend launches.
    pub fn grid(&self, rows: usize, blocks: usize, block: u32) -> Result<u32> {
        if blocks > MAX_GRID || blocks as u64 * u64::from(block) > MAX_THREADS {
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
