//! Fused 3D window attention (Pangu / Swin): from the QKV Linear's output
//! to the attention output in token order, in one launch (per 65,535
//! windows: the grid is (heads, windows)), on the matrix
//! units (NVIDIA `mma.sync`, AMD MFMA; the emulator runs both layouts).
//!
//! Per window `w` (144 tokens) and head `h` (32 channels):
//! `out = softmax(scale * q k^T + mask[slot(w)] + bias[type(w), h]) v`.
//!
//! Shapes: `qkv` [windows * 144, 3C] f16, per token `[q(C) | k(C) | v(C)]`
//! with C = heads x 32 head-major (PyTorch's
//! `qkv.reshape(B_, 144, 3, heads, 32)`); optional `qkv_bias` \[3C\] f16;
//! the earth-specific bias [types, heads, 144, 144] f16 with its window ->
//! type table and the optional shift mask as region labels with its
//! window -> slot table ([`WindowBias`], [`RegionMask`]: the mask is 0
//! between tokens of one region, -100 otherwise, exactly the tile that
//! [`RegionLabels::mask_tile`](crate::RegionLabels::mask_tile) writes for
//! [`crate::bias_mask_softmax`]); `out` [windows * 144, C] f16,
//! token-major, head-major within a token (`(attn @ v).transpose(1,
//! 2).reshape(B_, 144, C)`: what the output projection reads).
//!
//! Rounding contract (per query row `i`, key `j`; `scale` in [2^-14, 8]):
//! - with `qkv_bias`, q, k and v are first rounded `f16(x + b)` (as
//!   PyTorch's f16 Linear output with bias);
//! - the score in units of `1 / scale` is one f32 accumulation on the
//!   matrix unit (f16 products, all exact; hardware order): `a = mask' +
//!   bias (dh + dl) + q . k`, with `dh = f16(1 / scale)`, `dl = f16(1 /
//!   scale - dh)` (`dh + dl` within `2^-22` of `1 / scale`) and the mask
//!   as `mask' = f16(-100 f32(1 / scale))` across regions, exactly 0 within one
//!   (for windows of up to 8 regions, and `scale` where `mask'` is a
//!   finite f16: above about 2^-9.4; q is not pre-scaled);
//! - `m = max a`, `e = exp(scale (a - m))` (the hardware `exp2` of
//!   `fma(a, c, -m c)`, `c = f32(scale log2 e)`);
//! - `p = f16(e)` (the unnormalised weights rounded once; PyTorch's
//!   unfused chain rounds the normalised probabilities to f16 too), then
//!   `o = p . v` and `sum = sum p` (the rounded weights) in f32 on the
//!   matrix unit, and `out = f16(o * (1 / sum))` (`1 / sum` one Newton
//!   step on the hardware's reciprocal: within an f32 ulp of the rounded
//!   quotient).
//!
//! A 16-row strip with a NaN or infinite score (an infinite or NaN bias,
//! NaN or infinite inputs) and every strip of a masked window with more
//! than 8 regions, or at a smaller scale, is computed the exact way
//! instead: `z = fma(q . k, scale,
//! bias) + mask` per element in f32 (-100 exactly), then as above with
//! `z` for `scale a`. So a row whose scores hold NaN or +inf, or are all
//! -inf (a bias row of -inf), is NaN (as `torch.softmax`), and `-inf`
//! entries elsewhere get weight 0; a label mask never masks a whole row
//! (a token shares its own region).
//!
//! Error bound against the exact (f64) attention of the same inputs,
//! per output channel, checked by `tests/window_attention.rs` on every
//! backend:
//!
//! ```text
//! |out - exact| <= ulp(exact) / 2
//!                  + (1 + 2^-10) (2^-11 sum_j p_j |v_j - exact|
//!                                 + 2^-25 sum_j |v_j - exact| / sum_j e_j)
//!                  + 2^-16 (M + |exact|) + sum_j p_j |v_j| dz_j + M dz_max
//! ```
//!
//! where `ulp` is the f16 ulp, `p` the exact probabilities, `e_j` the
//! exact weights (`p_j = e_j / sum e`, the largest 1), `M = sum_j p_j
//! |v_j|`. The second term is the f16 rounding of the weights (at most
//! `2^-11` relative, or `2^-25` absolute below f16's normal range): the
//! output is their weighted mean, so a weight's rounding moves it by that
//! weight's share of `v_j - out` (not of `v_j`: PyTorch's chain, which
//! normalises before rounding, moves by up to `2^-11 M`); the sum of
//! the rounded weights is at least `sum_j e_j / (1 + 2^-10)`. The third is
//! the matrix unit's f32 sums of `p v` and `p` and the final product.
//! `dz_j = 2^-17 (scale sum_d |q_d k_jd| + |bias_j|) + 2^-11 |mask_j| +
//! 2^-22 (|bias_j| + |z_j|)` (the f32 scores: the matrix unit's
//! accumulation of q . k and the bias, the mask's f16 form, then the
//! roundings of the exponent's argument; an exponential moves by its
//! argument's absolute error), `dz_max` the same for the row's maximum
//! plus `2^-22 |max|`.
//!
//! The harness checks every output of every timed launch against this
//! bound; its records (`docs/bench`) carry the worst fraction of it seen.
use super::bias_mask_add::WindowTable;
use super::region_labels::RegionMask;
use super::{Check, MAX_GRID_Y};
use crate::backend::Launch;
use crate::buffer::{Span, View, ViewMut};
use crate::device::AsStream;
use crate::registry::{In, launch};
use crate::{Error, Result};
use half::f16;
use wavefuse_shared::geometry::{
    ATTN_HEAD_DIM, ATTN_SCALE_MAX, ATTN_SCALE_MIN, ATTN_SHARED_BYTES, ATTN_T, ATTN_WAVES,
};

/// Head dimensions with a kernel.
pub const ATTN_HEAD_DIMS: [usize; 1] = [ATTN_HEAD_DIM as usize];
/// Tokens per window with a kernel.
pub const ATTN_TOKENS: [usize; 1] = [ATTN_T as usize];

/// What is added to the scores of a window attention.
#[derive(Clone, Copy)]
pub struct WindowBias<'a> {
    /// Earth-specific bias [types, heads, 144, 144] f16, `types == ty.bound()`.
    pub bias: &'a View<'a, f16>,
    /// Window -> bias type (its length is the number of windows).
    pub ty: &'a WindowTable,
    /// The shift mask as region labels, for shifted-window blocks.
    pub mask: Option<RegionMask<'a>>,
}

/// Shape and scale of a window attention.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WindowAttention {
    /// Attention heads (C = heads * head_dim).
    pub heads: usize,
    /// Channels per head; only 32 has a kernel.
    pub head_dim: usize,
    /// Tokens per window; only 144 (2 x 6 x 12) has a kernel.
    pub tokens_per_window: usize,
    /// Factor on `q . k` (default `head_dim^-0.5`, rounded to f32).
    pub scale: f32,
}

impl WindowAttention {
    /// `heads` heads of 32, 144 tokens per window, `scale = 1/sqrt(32)`.
    pub fn new(heads: usize) -> WindowAttention {
        WindowAttention {
            heads,
            head_dim: ATTN_HEAD_DIM as usize,
            tokens_per_window: ATTN_T as usize,
            scale: (1.0 / 32f64.sqrt()) as f32,
        }
    }
}

/// `out = attention(qkv)` for every window and head (see the module docs).
/// The number of windows is `ab.ty.len()`; none (empty tables, `qkv` and
/// `out`) is a no-op.
///
/// Errors, all before any launch: `head_dim != 32` or
/// `tokens_per_window != 144` ([`Error::UnsupportedWidth`]); `heads == 0`
/// or too large, or a non-finite `scale` ([`Error::BadParameter`]); `qkv`,
/// `out`, `qkv_bias`, the bias or the labels of a length that disagrees
/// with the windows, heads, types, slots or 144 tokens
/// ([`Error::LengthMismatch`]; labels out of range are rejected when
/// [`RegionLabels`](crate::RegionLabels) are built); misaligned buffers
/// ([`Error::Misaligned`]); buffers of another device
/// ([`Error::WrongDevice`]); `out` overlapping an input
/// ([`Error::Aliasing`]); more workgroups than one launch takes
/// ([`Error::TooLarge`]).
pub fn window_attention(
    q: &impl AsStream,
    qkv: &View<'_, f16>,
    qkv_bias: Option<&View<'_, f16>>,
    ab: &WindowBias<'_>,
    out: &mut ViewMut<'_, f16>,
    p: &WindowAttention,
) -> Result<()> {
    window_attention_split(q, qkv, qkv_bias, ab, out, p, MAX_GRID_Y)
}

/// [`window_attention`] in launches of at most `windows_per_launch`
/// windows (clamped to `1..=65535`): the tests' way to exercise the split
/// that more than 65,535 windows take, at sizes the emulator runs.
#[doc(hidden)]
pub fn window_attention_split(
    q: &impl AsStream,
    qkv: &View<'_, f16>,
    qkv_bias: Option<&View<'_, f16>>,
    ab: &WindowBias<'_>,
    out: &mut ViewMut<'_, f16>,
    p: &WindowAttention,
    windows_per_launch: usize,
) -> Result<()> {
    let c = Check {
        q: q.as_stream(),
        op: "window_attention",
    };
    if p.head_dim != ATTN_HEAD_DIM as usize {
        return Err(Error::UnsupportedWidth {
            op: c.op,
            width: p.head_dim,
            supported: &ATTN_HEAD_DIMS,
        });
    }
    if p.tokens_per_window != ATTN_T as usize {
        return Err(Error::UnsupportedWidth {
            op: c.op,
            width: p.tokens_per_window,
            supported: &ATTN_TOKENS,
        });
    }
    // heads * 144 * 144 (a bias tile of all heads) must fit the kernel's
    // u32 head count; far above any model.
    if p.heads == 0 || p.heads > (u32::MAX / (ATTN_T * ATTN_T)) as usize {
        return Err(Error::BadParameter {
            op: c.op,
            what: "heads",
            value: p.heads.to_string(),
            why: "must be in 1..=u32::MAX / 144^2",
        });
    }
    if !(ATTN_SCALE_MIN..=ATTN_SCALE_MAX).contains(&p.scale) {
        return Err(Error::BadParameter {
            op: c.op,
            what: "scale",
            value: p.scale.to_string(),
            why: "must be in [2^-14, 8] (1 / scale enters the matrix unit as f16)",
        });
    }
    let (t, heads) = (ATTN_T as usize, p.heads);
    let ch = heads * ATTN_HEAD_DIM as usize;
    let windows = ab.ty.len();
    let xs = Span::from(qkv);
    let os = Span::from(&*out);
    let bias = Span::from(ab.bias);
    let ty = Span::from(&ab.ty.table());
    for (s, n) in [(&xs, "qkv"), (&os, "out"), (&bias, "bias"), (&ty, "ty")] {
        c.same_device(s, n)?;
    }
    let overflow = |what| Error::BadParameter {
        op: c.op,
        what,
        value: format!("{windows} windows x {heads} heads"),
        why: "size overflows",
    };
    let tokens = windows.checked_mul(t).ok_or_else(|| overflow("qkv"))?;
    let qkv_len = tokens.checked_mul(3 * ch).ok_or_else(|| overflow("qkv"))?;
    c.len(&xs, "qkv", qkv_len)?;
    c.len(&os, "out", qkv_len / 3)?;
    c.len(
        &bias,
        "bias",
        ab.ty.bound().saturating_mul(heads).saturating_mul(t * t),
    )?;
    for (s, n) in [(&xs, "qkv"), (&os, "out"), (&bias, "bias")] {
        c.aligned(s, n)?;
    }
    c.disjoint(&os, "out", &xs, "qkv")?;
    c.disjoint(&os, "out", &bias, "bias")?;
    c.disjoint(&os, "out", &ty, "ty")?;
    let qkv_bias_arg = match qkv_bias {
        Some(b) => {
            let bs = Span::from(b);
            c.same_device(&bs, "qkv_bias")?;
            c.len(&bs, "qkv_bias", 3 * ch)?;
            c.aligned(&bs, "qkv_bias")?;
            c.disjoint(&os, "out", &bs, "qkv_bias")?;
            b.arg()
        }
        None => In::null(),
    };
    let (labels, slot, n_slots) = match ab.mask {
        Some(m) => {
            let (ls, ss) = (Span::from(&m.labels.labels()), Span::from(&m.slot.table()));
            c.same_device(&ls, "labels")?;
            c.same_device(&ss, "slot")?;
            c.len(&ss, "slot", windows)?;
            if m.labels.tokens() != t {
                return Err(Error::LengthMismatch {
                    op: c.op,
                    what: "labels",
                    got: m.labels.tokens(),
                    expected: t,
                });
            }
            c.len(&ls, "labels", m.slot.bound().saturating_mul(t))?;
            c.aligned(&ls, "labels")?;
            c.disjoint(&os, "out", &ls, "labels")?;
            c.disjoint(&os, "out", &ss, "slot")?;
            (
                m.labels.labels().arg(),
                m.slot.table().arg(),
                m.slot.bound() as u32,
            )
        }
        None => (In::null(), In::null(), 0),
    };
    if windows == 0 {
        return Ok(());
    }
    let block = ATTN_WAVES * c.q.info().wave;
    // A grid of (heads, windows): the kernel reads its head and window
    // from the workgroup's x and y (no division by the head count). More
    // windows than one launch's y takes go in several launches, each with
    // its windows' rows of qkv, out and the tables.
    let per_launch = windows.min(windows_per_launch.clamp(1, MAX_GRID_Y));
    let blocks = per_launch
        .checked_mul(heads)
        .ok_or_else(|| overflow("qkv"))?;
    c.grid(windows.saturating_mul(heads), blocks, block)?;
    let kernel = if ab.mask.is_some() {
        launch::wf_window_attention_mask_144
    } else {
        launch::wf_window_attention_144
    };
    let (xa, oa, ta) = (qkv.arg(), out.arg(), ab.ty.table().arg());
    let mut w0 = 0;
    while w0 < windows {
        let n = per_launch.min(windows - w0);
        let l = Launch {
            grid: (heads as u32, n as u32),
            block,
            shared_bytes: ATTN_SHARED_BYTES,
        };
        // SAFETY: lengths, tables and labels (validated at construction),
        // alignment, devices and aliasing checked above; windows w0..w0 + n
        // of qkv, out and the tables (in bounds: w0 + n <= windows); the
        // workgroup memory and block size are the kernel's
        // (wavefuse_shared::geometry).
        unsafe {
            kernel(
                c.q,
                l,
                xa.offset(w0 * t * 3 * ch),
                qkv_bias_arg,
                oa.offset(w0 * t * ch),
                ab.bias.arg(),
                labels,
                ta.offset(w0),
                slot.offset(w0),
                heads as u32,
                ab.ty.bound() as u32,
                n_slots,
                p.scale,
            )?
        };
        w0 += n;
    }
    Ok(())
}
