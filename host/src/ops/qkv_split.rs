//! QKV split into per-head q, k, v with the q scale folded in.
//!
//! Input: the QKV Linear's output `qkv` [windows * T, 3C] f16, per token
//! `[q(C) | k(C) | v(C)]` with C = heads x 32 head-major (PyTorch's
//! `qkv.reshape(B_, T, 3, heads, 32)`). Outputs `q`, `k`, `v`, each
//! [windows, heads, T, 32] contiguous (`.permute(2, 0, 3, 1, 4)`).
//!
//! Rounding contract:
//! - no bias: `q = f16(f32(x) * scale)` (one rounding, as PyTorch's
//!   `q * scale` on an f16 tensor with a Python float computes in f32);
//!   `k` and `v` are bit copies.
//! - fused bias `b` \[3C\] f16: `k = f16(x + b)`, `v = f16(x + b)`,
//!   `q = f16(f16(x + b) * scale)`: the bias add rounds to f16 before the
//!   scale, exactly like PyTorch's unfused `F.linear(x, W) + b` followed by
//!   `q * scale`. (A Linear with its bias fused in the GEMM epilogue rounds
//!   `xW + b` once; that cannot be recovered from an f16 GEMM output.)
use super::Check;
use crate::backend::Launch;
use crate::buffer::{Span, View, ViewMut};
use crate::device::AsStream;
use crate::registry::{In, launch};
use crate::{Error, Result};
use half::f16;
use wavefuse_shared::geometry::{QKV_BLOCK, QKV_HEAD_DIM, QKV_PER_THREAD};

/// Head dimensions with a kernel.
pub const QKV_HEAD_DIMS: [usize; 1] = [QKV_HEAD_DIM as usize];

/// Shape and scale of a QKV split.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct QkvSplit {
    /// Attention heads (C = heads * head_dim).
    pub heads: usize,
    /// Channels per head; only 32 has a kernel.
    pub head_dim: usize,
    /// Tokens per window (Pangu: 2 x 6 x 12 = 144).
    pub tokens_per_window: usize,
    /// Factor applied to q (default `head_dim^-0.5`, rounded to f32).
    pub scale: f32,
}

impl QkvSplit {
    /// `heads` heads of 32, 144 tokens per window, `scale = 1/sqrt(32)`.
    pub fn new(heads: usize) -> QkvSplit {
        QkvSplit {
            heads,
            head_dim: 32,
            tokens_per_window: 144,
            scale: (1.0 / 32f64.sqrt()) as f32,
        }
    }
}

/// Splits `qkv` into `q`, `k`, `v` (see the module docs), adding `bias`
/// first when given.
///
/// Errors, all before any launch: `head_dim != 32`
/// ([`Error::UnsupportedWidth`]); `heads == 0`, `tokens_per_window == 0` or
/// a non-finite `scale` ([`Error::BadParameter`]); `qkv` not a whole
/// number of windows ([`Error::RaggedRows`]; none is a no-op); outputs or bias of the wrong length
/// ([`Error::LengthMismatch`]); misaligned buffers ([`Error::Misaligned`]);
/// buffers of another device ([`Error::WrongDevice`]); overlapping buffers
/// ([`Error::Aliasing`]); more than `u32::MAX` vectors ([`Error::TooLarge`]).
pub fn qkv_split(
    stream: &impl AsStream,
    qkv: &View<'_, f16>,
    bias: Option<&View<'_, f16>>,
    q: &mut ViewMut<'_, f16>,
    k: &mut ViewMut<'_, f16>,
    v: &mut ViewMut<'_, f16>,
    p: &QkvSplit,
) -> Result<()> {
    let c = Check {
        q: stream.as_stream(),
        op: "qkv_split",
    };
    if p.head_dim != QKV_HEAD_DIM as usize {
        return Err(Error::UnsupportedWidth {
            op: c.op,
            width: p.head_dim,
            supported: &QKV_HEAD_DIMS,
        });
    }
    for (what, val) in [
        ("heads", p.heads),
        ("tokens_per_window", p.tokens_per_window),
    ] {
        if val == 0 || val > u32::MAX as usize / 12 {
            return Err(Error::BadParameter {
                op: c.op,
                what,
                value: val.to_string(),
                why: "must be in 1..=u32::MAX / 12",
            });
        }
    }
    if !p.scale.is_finite() {
        return Err(Error::BadParameter {
            op: c.op,
            what: "scale",
            value: p.scale.to_string(),
            why: "must be finite",
        });
    }
    let ch = p.heads * p.head_dim; // C
    let xs = Span::from(qkv);
    let outs = [
        (Span::from(&*q), "q"),
        (Span::from(&*k), "k"),
        (Span::from(&*v), "v"),
    ];
    c.same_device(&xs, "qkv")?;
    let window_len = p
        .tokens_per_window
        .checked_mul(3 * ch)
        .ok_or(Error::BadParameter {
            op: c.op,
            what: "tokens_per_window",
            value: p.tokens_per_window.to_string(),
            why: "window size overflows",
        })?;
    let windows = c.rows(&xs, "qkv", window_len)?;
    c.aligned(&xs, "qkv")?;
    for (s, n) in &outs {
        c.same_device(s, n)?;
        c.len(s, n, xs.len / 3)?;
        c.aligned(s, n)?;
        c.disjoint(&xs, "qkv", s, n)?;
    }
    c.disjoint(&outs[0].0, "q", &outs[1].0, "k")?;
    c.disjoint(&outs[0].0, "q", &outs[2].0, "v")?;
    c.disjoint(&outs[1].0, "k", &outs[2].0, "v")?;
    let b_arg = match bias {
        Some(b) => {
            let bs = Span::from(b);
            c.same_device(&bs, "bias")?;
            c.len(&bs, "bias", 3 * ch)?;
            c.aligned(&bs, "bias")?;
            for (s, n) in &outs {
                c.disjoint(&bs, "bias", s, n)?;
            }
            b.arg()
        }
        None => In::null(),
    };
    if windows == 0 {
        return Ok(());
    }
    let n_vec = xs.len / 8;
    let per_block = (QKV_BLOCK * QKV_PER_THREAD) as usize;
    if n_vec > u32::MAX as usize {
        return Err(Error::TooLarge {
            op: c.op,
            rows: windows,
            blocks: n_vec.div_ceil(per_block),
        });
    }
    let grid = c.grid(windows, n_vec.div_ceil(per_block), QKV_BLOCK)?;
    let l = Launch {
        grid: (grid, 1),
        block: QKV_BLOCK,
        shared_bytes: 0,
    };
    let kernel = if bias.is_some() {
        launch::wf_qkv_split_bias
    } else {
        launch::wf_qkv_split
    };
    // SAFETY: lengths, alignment, devices and aliasing checked above.
    unsafe {
        kernel(
            c.q,
            l,
            qkv.arg(),
            b_arg,
            q.arg(),
            k.arg(),
            v.arg(),
            n_vec as u32,
            p.heads as u32,
            p.tokens_per_window as u32,
            p.scale,
        )
    }
}
