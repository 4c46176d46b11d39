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
use crate::backend::Launch;
use crate::buffer::{Span, View, ViewMut};
use crate::device::AsStream;
use crate::registry::{In, Out, launch};
use crate::{Error, Result};
use half::f16;
use wavefuse_shared::geometry::{SOFTMAX_BLOCK, SOFTMAX_ROWS, SOFTMAX_T};

/// Row lengths (tokens per window) with a kernel.
pub const SOFTMAX_TOKENS: [usize; 1] = [SOFTMAX_T as usize];

#[allow(clippy::too_many_arguments)]
fn run(
    c: &Check<'_>,
    s: &Span,
    s_arg: In<'_, u16>,
    p: &Span,
    p_arg: Out<'_, u16>,
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
    if a.windows == 0 {
        return Ok(());
    }
    let rows = a.windows * heads * tokens;
    let per_block = SOFTMAX_ROWS as usize;
    if rows > (u32::MAX - SOFTMAX_BLOCK) as usize {
        return Err(Error::TooLarge {
            op: c.op,
            rows,
            blocks: rows.div_ceil(per_block),
        });
    }
    let grid = c.grid(rows, rows.div_ceil(per_block), SOFTMAX_BLOCK)?;
    let l = Launch {
        grid: (grid, 1),
        block: SOFTMAX_BLOCK,
        shared_bytes: 0,
    };
    let kernel = if ab.mask.is_some() {
        launch::wf_bias_mask_softmax_144
    } else {
        launch::wf_bias_mask_softmax_nomask_144
    };
    // SAFETY: shapes, tables (validated at construction), alignment,
    // devices and aliasing checked above (`p` is `s` or disjoint from it).
    unsafe {
        kernel(
            c.q,
            l,
            s_arg,
            p_arg,
            a.bias,
            a.mask,
            a.ty,
            a.slot,
            rows as u32,
            heads as u32,
            a.n_types,
            a.n_slots,
        )
    }
}

/// `probs = softmax(scores + bias (+ mask))` over the last axis (see the
/// module docs). `scores` and `probs` are [windows, heads, 144, 144] with
/// `windows == ab.ty.len()`, and must not overlap.
///
/// No windows (empty tables and `scores`) is a no-op. Errors, all before
/// any launch: `tokens != 144` ([`Error::UnsupportedWidth`]); `heads == 0`
/// ([`Error::BadParameter`]); a length that disagrees with the tables'
/// windows, types or slots ([`Error::LengthMismatch`]); misaligned
/// buffers ([`Error::Misaligned`]); buffers of another device
/// ([`Error::WrongDevice`]); overlap ([`Error::Aliasing`]); too many rows
/// ([`Error::TooLarge`]).
pub fn bias_mask_softmax(
    q: &impl AsStream,
    scores: &View<'_, f16>,
    probs: &mut ViewMut<'_, f16>,
    heads: usize,
    tokens: usize,
    ab: &AttnBias<'_>,
) -> Result<()> {
    let c = Check {
        q: q.as_stream(),
        op: "bias_mask_softmax",
    };
    let (s, p) = (Span::from(scores), Span::from(&*probs));
    c.disjoint(&s, "scores", &p, "probs")?;
    run(&c, &s, scores.arg(), &p, probs.arg(), heads, tokens, ab)
}

/// [`bias_mask_softmax`] writing the probabilities over the scores.
pub fn bias_mask_softmax_inplace(
    q: &impl AsStream,
    scores: &mut ViewMut<'_, f16>,
    heads: usize,
    tokens: usize,
    ab: &AttnBias<'_>,
) -> Result<()> {
    let c = Check {
        q: q.as_stream(),
        op: "bias_mask_softmax",
    };
    let s = Span::from(&*scores);
    let s_arg = scores.arg_in();
    run(&c, &s, s_arg, &s, scores.arg(), heads, tokens, ab)
}
