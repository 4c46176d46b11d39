//! Attention scores `S += earth_bias[type(w)] + mask[slot(w)]`, in place.
//!
//! Shapes: `S` [windows, heads, T, T] f16; `bias` [types, heads, T, T] f16
//! picked per window by an INT32 window -> type table; `mask` [slots, T, T]
//! f16 picked per window by an INT32 window -> slot table (optional: the
//! non-shifted blocks have none). Tables are plain INT32 vectors (e.g. from
//! the window planner), validated once when a [`WindowTable`] is built.
//!
//! Rounding contract: one rounding,
//! `S = f16((f32(S) + f32(mask)) + f32(bias))` (two f32 adds in that
//! order; without a mask `f16(f32(S) + f32(bias))`). The mask goes first
//! because with the planner's values (0, -100) `S + mask` is exact in f32
//! whenever it cancels (Sterbenz), so the result is the exact sum rounded
//! once to f16 even where the mask wipes out most of the score; in general
//! the f32 adds add at most `2^-24 * (|S + mask| + |result|)`.
//!
//! PyTorch's unfused `(S + bias) + mask` on f16 tensors rounds twice:
//! `f16(f16(S + bias) + mask)`. The two differ by at most one f16 ulp when
//! `|S + bias + mask| >= |S + bias|` (e.g. O(1) scores and a -100 mask), but
//! by up to thousands of ulps of the result when the mask cancels most of
//! `S + bias` (the first rounding's error is relative to the larger
//! operand); `tests/bias_mask_add.rs` measures both.
//!
//! The mask is f16 on the device: the planner's f32 masks hold 0 and -100
//! (and -inf where used), all exact in f16, so converting them once loses
//! nothing (`half::f16::from_f32`), and it halves the mask's bytes. A mask
//! value that is not an f16 would be rounded by that conversion.
use super::Check;
use crate::backend::Launch;
use crate::buffer::{DeviceBuffer, Span, View, ViewMut};
use crate::device::{AsStream, Device};
use crate::registry::{In, launch};
use crate::{Error, Result};
use half::f16;
use wavefuse_shared::geometry::ADD_BLOCK;

/// A validated window -> index table (bias type or mask slot) on a device.
pub struct WindowTable {
    table: DeviceBuffer<i32>,
    bound: usize,
}

impl std::fmt::Debug for WindowTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WindowTable")
            .field("windows", &self.len())
            .field("bound", &self.bound)
            .finish()
    }
}

impl WindowTable {
    /// Validates that every entry of `table` (one per window) is in
    /// `0..bound` and uploads it.
    ///
    /// An empty table (no windows) is valid: the ops then have nothing to
    /// do.
    ///
    /// Errors: `bound` of 0 or above `i32::MAX`, or an entry out of range
    /// ([`Error::BadParameter`] with `what == "table"`, naming the first bad
    /// position).
    pub fn new(dev: &Device, table: &[i32], bound: usize) -> Result<WindowTable> {
        const OP: &str = "window_table";
        if bound == 0 || bound > i32::MAX as usize {
            return Err(Error::BadParameter {
                op: OP,
                what: "bound",
                value: bound.to_string(),
                why: "must be in 1..=i32::MAX",
            });
        }
        if let Some((position, &value)) = table
            .iter()
            .enumerate()
            .find(|&(_, &v)| v < 0 || v as usize >= bound)
        {
            return Err(Error::BadParameter {
                op: OP,
                what: "table",
                value: format!("table[{position}] = {value} (bound = {bound})"),
                why: "entries must be in 0..bound",
            });
        }
        Ok(WindowTable {
            table: dev.upload(table)?,
            bound,
        })
    }

    /// Windows (entries).
    pub fn len(&self) -> usize {
        self.table.len()
    }

    /// Whether the table has no windows.
    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }

    /// Number of bias types / mask slots the entries index.
    pub fn bound(&self) -> usize {
        self.bound
    }

    /// The table on the device.
    pub fn table(&self) -> View<'_, i32> {
        self.table.view()
    }
}

/// The shift mask and the window -> slot table that picks it.
#[derive(Clone, Copy)]
pub struct AttnMask<'a> {
    /// [slots, T, T] f16, `slots == slot.bound()`.
    pub mask: &'a View<'a, f16>,
    /// Window -> mask slot.
    pub slot: &'a WindowTable,
}

/// What is added to the scores.
#[derive(Clone, Copy)]
pub struct AttnBias<'a> {
    /// Earth-specific bias [types, heads, T, T] f16, `types == ty.bound()`.
    pub bias: &'a View<'a, f16>,
    /// Window -> bias type (its length is the number of windows).
    pub ty: &'a WindowTable,
    /// The shift mask, for shifted-window blocks.
    pub mask: Option<AttnMask<'a>>,
}

/// Kernel arguments after the checks shared by the bias + mask family.
pub(crate) struct AttnArgs<'a> {
    pub windows: usize,
    pub bias: In<'a, u16>,
    pub mask: In<'a, u16>,
    pub ty: In<'a, i32>,
    pub slot: In<'a, i32>,
    pub n_types: u32,
    pub n_slots: u32,
}

/// Checks `scores` ([windows, heads, T, T]) against `ab` (see the module
/// docs for the shapes); `outs` are the written spans (must not overlap
/// the bias, mask or tables).
pub(crate) fn check_attn<'a>(
    c: &Check<'_>,
    scores: &Span,
    outs: &[(&Span, &'static str)],
    heads: usize,
    tokens: usize,
    ab: &AttnBias<'a>,
) -> Result<AttnArgs<'a>> {
    if heads == 0 || heads > u32::MAX as usize {
        return Err(Error::BadParameter {
            op: c.op,
            what: "heads",
            value: heads.to_string(),
            why: "must be in 1..=u32::MAX",
        });
    }
    let tile = tokens * tokens;
    let windows = ab.ty.len();
    let bias = Span::from(ab.bias);
    let ty = Span::from(&ab.ty.table());
    c.same_device(scores, "scores")?;
    c.same_device(&bias, "bias")?;
    c.same_device(&ty, "ty")?;
    let expect = |what| {
        windows
            .checked_mul(heads)
            .and_then(|n| n.checked_mul(tile))
            .ok_or(Error::BadParameter {
                op: c.op,
                what,
                value: format!("{windows} windows x {heads} heads x {tokens}^2"),
                why: "size overflows",
            })
    };
    c.len(scores, "scores", expect("scores")?)?;
    c.len(
        &bias,
        "bias",
        ab.ty.bound().saturating_mul(heads).saturating_mul(tile),
    )?;
    c.aligned(scores, "scores")?;
    c.aligned(&bias, "bias")?;
    for (o, n) in outs {
        c.same_device(o, n)?;
        c.len(o, n, scores.len)?;
        c.aligned(o, n)?;
        c.disjoint(o, n, &bias, "bias")?;
        c.disjoint(o, n, &ty, "ty")?;
    }
    let (mask, slot, n_slots) = match ab.mask {
        Some(m) => {
            let (ms, ss) = (Span::from(m.mask), Span::from(&m.slot.table()));
            c.same_device(&ms, "mask")?;
            c.same_device(&ss, "slot")?;
            c.len(&ss, "slot", windows)?;
            c.len(&ms, "mask", m.slot.bound().saturating_mul(tile))?;
            c.aligned(&ms, "mask")?;
            for (o, n) in outs {
                c.disjoint(o, n, &ms, "mask")?;
                c.disjoint(o, n, &ss, "slot")?;
            }
            (m.mask.arg(), m.slot.table().arg(), m.slot.bound() as u32)
        }
        None => (In::null(), In::null(), 0),
    };
    Ok(AttnArgs {
        windows,
        bias: ab.bias.arg(),
        mask,
        ty: ab.ty.table().arg(),
        slot,
        n_types: ab.ty.bound() as u32,
        n_slots,
    })
}

/// `scores += bias[type(w)] (+ mask[slot(w)])` in place, rounded once (see
/// the module docs). `scores` is [windows, heads, T, T] with
/// `windows == ab.ty.len()`; `tokens` (T) is any positive multiple of 4
/// (Pangu: 144).
///
/// No windows (empty tables and `scores`) is a no-op. Errors, all before
/// any launch: `heads == 0` or `tokens` not a positive multiple of 4
/// ([`Error::BadParameter`]); a length that disagrees with the tables' windows,
/// types or slots ([`Error::LengthMismatch`]); misaligned buffers
/// ([`Error::Misaligned`]); buffers of another device
/// ([`Error::WrongDevice`]); too many tiles for one launch
/// ([`Error::TooLarge`]).
pub fn bias_mask_add(
    q: &impl AsStream,
    scores: &mut ViewMut<'_, f16>,
    heads: usize,
    tokens: usize,
    ab: &AttnBias<'_>,
) -> Result<()> {
    let c = Check {
        q: q.as_stream(),
        op: "bias_mask_add",
    };
    if tokens == 0 || !tokens.is_multiple_of(4) || tokens > 1 << 15 {
        return Err(Error::BadParameter {
            op: c.op,
            what: "tokens",
            value: tokens.to_string(),
            why: "must be a positive multiple of 4 (at most 32768)",
        });
    }
    let s = Span::from(&*scores);
    let a = check_attn(&c, &s, &[(&s, "scores")], heads, tokens, ab)?;
    if a.windows == 0 {
        return Ok(());
    }
    let tiles = a.windows * heads;
    let grid = c.grid(tiles, tiles, ADD_BLOCK)?;
    let l = Launch {
        grid: (grid, 1),
        block: ADD_BLOCK,
        shared_bytes: 0,
    };
    let run = if ab.mask.is_some() {
        launch::wf_bias_mask_add
    } else {
        launch::wf_bias_mask_add_nomask
    };
    // SAFETY: shapes, tables (validated at construction), alignment,
    // devices and aliasing checked above.
    unsafe {
        run(
            c.q,
            l,
            scores.arg(),
            a.bias,
            a.mask,
            a.ty,
            a.slot,
            heads as u32,
            (tokens * tokens / 8) as u32,
            a.n_types,
            a.n_slots,
        )
    }
}
