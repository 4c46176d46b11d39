//! Fused `P = softmax(S + earth_bias[type(w)] + mask[slot(w)], dim=-1)` for
//! attention scores [windows, heads, 144, 144] f16.
//!
//! Contract: `z = (f32(S) + f32(mask)) + f32(bias)` in f32 (not rounded to
//! f16, unlike PyTorch's unfused `(S + bias) + mask`; see
//! [`crate::ops::bias_mask_add`]); then the safe softmax in f32
//! (`m = max z`, `e = exp(z - m)`, `sum = sum e`) and
//! `P = f16(e * (1 / sum))`, one rounding of each probability. Within 1 f16
//! ulp of the softmax computed in f64 from the same `z`. A row containing
//! NaN or +inf, or only -inf, gives NaN everywhere in that row, as
//! `torch.softmax` does; with finite (e.g. -100) masks rows never are fully
//! masked. Scores are read once and probabilities written once, either to a
//! separate output ([`bias_mask_softmax`]) or over the scores
//! ([`bias_mask_softmax_inplace`]).
use super::Check;
use super::bias_mask_add::{AttnBias, check_attn};
use crate::backend::{Arg, Launch};
use crate::buffer::{Span, View, ViewMut};
use crate::device::Device;
use crate::{Error, Result};
use half::f16;
use wavefuse_shared::geometry::{SOFTMAX_BLOCK, SOFTMAX_ROWS, SOFTMAX_T};

/// Row lengths (tokens per window) with a kernel.
pub const SOFTMAX_TOKENS: [usize; 1] = [SOFTMAX_T as usize];

fn launch(
    c: &Check<'_>,
    s: &Span,
    p: &Span,
    heads: usize,
    tokens: usize,
    ab: &AttnBias<'_>,
) -> Result<()> {
    if tokens != SOFTMAX_T as usize {
        return Err(Error::UnsupportedWidth {
            op: c.op,
            width: tokens,
            supported: &SOFTMAX_TOKENS,
        });
    }
    let a = check_attn(c, s, &[(p, "probs")], heads, tokens, ab)?;
    let rows = a.windows * heads * tokens;
    let per_block = SOFTMAX_ROWS as usize;
    if rows > (u32::MAX - SOFTMAX_BLOCK) as usize {
        return Err(Error::TooLarge {
            op: c.op,
            rows,
            blocks: rows.div_ceil(per_block),
        });
    }
    let grid = c.grid(rows, rows.div_ceil(per_block))?;
    let l = Launch {
        grid: (grid, 1),
        block: SOFTMAX_BLOCK,
        shared_bytes: 0,
    };
    let args = [
        Arg::Ptr(s.ptr),
        Arg::Ptr(p.ptr),
        Arg::Ptr(a.bias),
        Arg::Ptr(a.mask),
        Arg::Ptr(a.ty),
        Arg::Ptr(a.slot),
        Arg::U32(rows as u32),
        Arg::U32(heads as u32),
        Arg::U32(a.n_types),
        Arg::U32(a.n_slots),
    ];
    let name = if ab.mask.is_some() {
        "wf_bias_mask_softmax_144"
    } else {
        "wf_bias_mask_softmax_nomask_144"
    };
    // SAFETY: shapes, tables (validated at construction), alignment,
    // devices and aliasing checked above (`p` is `s` or disjoint from it);
    // the argument list matches the kernel signature in wavefuse-device.
    unsafe { c.dev.be.launch(name, l, &args) }
}

/// `probs = softmax(scores + bias (+ mask))` over the last axis (see the
/// module docs). `scores` and `probs` are [windows, heads, 144, 144] with
/// `windows == ab.ty.len()`, and must not overlap.
///
/// Errors, all before any launch: `tokens != 144`
/// ([`Error::UnsupportedWidth`]); `heads == 0` ([`Error::BadParameter`]);
/// empty `scores` ([`Error::Empty`]); a length that disagrees with the
/// tables' windows, types or slots ([`Error::LengthMismatch`]); misaligned
/// buffers ([`Error::Misaligned`]); buffers of another device
/// ([`Error::WrongDevice`]); overlap ([`Error::Aliasing`]); too many rows
/// ([`Error::TooLarge`]).
pub fn bias_mask_softmax(
    dev: &Device,
    scores: &View<'_, f16>,
    probs: &mut ViewMut<'_, f16>,
    heads: usize,
    tokens: usize,
    ab: &AttnBias<'_>,
) -> Result<()> {
    let c = Check {
        dev,
        op: "bias_mask_softmax",
    };
    let (s, p) = (Span::from(scores), Span::from(&*probs));
    c.disjoint(&s, "scores", &p, "probs")?;
    launch(&c, &s, &p, heads, tokens, ab)
}

/// [`bias_mask_softmax`] writing the probabilities over the scores.
pub fn bias_mask_softmax_inplace(
    dev: &Device,
    scores: &mut ViewMut<'_, f16>,
    heads: usize,
    tokens: usize,
    ab: &AttnBias<'_>,
) -> Result<()> {
    let c = Check {
        dev,
        op: "bias_mask_softmax",
    };
    let s = Span::from(&*scores);
    launch(&c, &s, &s, heads, tokens, ab)
}
