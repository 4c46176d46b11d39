//! Token gather through a validated INT32 index table.
//!
//! Contract: `out[t] = table[t] >= 0 ? src[table[t]] : 0` over tokens of
//! `width` halves. Tokens are moved bit for bit (NaN payloads included);
//! padding tokens are `+0.0`. The table is validated once, when the
//! [`GatherPlan`] is built (every entry `-1` or in `0..n_src`), and lives on
//! the device; each [`gather`] then only checks shapes. [`gather_to_f16`]
//! moves rows of four `f32` through the same plans and rounds them to
//! `f16` on the way.
use super::Check;
use crate::backend::Launch;
use crate::buffer::{DeviceBuffer, Span, View, ViewMut};
use crate::device::{AsStream, Device, Stream};
use crate::registry::{In, Out, launch};
use crate::{Error, Result};
use half::f16;
use wavefuse_shared::geometry::GENERIC_LANES;
use wavefuse_shared::index::{self, IndexError};
use wavefuse_shared::layout::{ROW_BLOCK, VEC_HALVES, gather_layout};

/// A validated gather table on one device: output token `t` copies source
/// token `table[t]`, or is zero when `table[t] == -1`
/// ([`wavefuse_shared::PAD`]).
///
/// Build it once per layout (e.g. per window partition) and reuse it for
/// every launch; the same plan serves [`gather`] and
/// [`crate::layer_norm_gather`] at any width.
pub struct GatherPlan {
    table: DeviceBuffer<i32>,
    n_src: usize,
    pads: usize,
    partition: bool,
}

impl std::fmt::Debug for GatherPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GatherPlan")
            .field("len", &self.len())
            .field("n_src", &self.n_src)
            .field("pads", &self.pads)
            .field("partition", &self.partition)
            .finish()
    }
}

impl GatherPlan {
    /// Validates `table` against `n_src` source tokens and uploads it.
    ///
    /// An empty table (and `n_src == 0`) is valid: the ops then have
    /// nothing to do.
    ///
    /// Errors: an entry that is neither `-1` nor in `0..n_src`
    /// ([`Error::BadParameter`] with `what == "table"`, naming the first bad
    /// position).
    pub fn new(dev: &Device, table: &[i32], n_src: usize) -> Result<GatherPlan> {
        const OP: &str = "gather_plan";
        index::validate(table, n_src).map_err(|e| match e {
            IndexError::OutOfRange {
                position,
                value,
                n_src,
            } => Error::BadParameter {
                op: OP,
                what: "table",
                value: format!("table[{position}] = {value} (n_src = {n_src})"),
                why: "entries must be -1 (padding) or in 0..n_src",
            },
        })?;
        let pads = table.iter().filter(|&&v| v == index::PAD).count();
        // A partition names every source exactly once (validated entries
        // are in range, so n_src distinct ones cover them all).
        let partition = table.len() - pads == n_src && {
            let mut seen = vec![false; n_src];
            table.iter().filter(|&&v| v != index::PAD).all(|&v| {
                seen.get_mut(v as usize)
                    .is_some_and(|b| !std::mem::replace(b, true))
            })
        };
        Ok(GatherPlan {
            table: dev.upload(table)?,
            n_src,
            pads,
            partition,
        })
    }

    /// Output tokens (entries of the table).
    pub fn len(&self) -> usize {
        self.table.len()
    }

    /// Whether the table has no entries.
    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }

    /// Source tokens the table was validated against.
    pub fn n_src(&self) -> usize {
        self.n_src
    }

    /// Padding (zero) output tokens.
    pub fn pads(&self) -> usize {
        self.pads
    }

    /// True when every source token appears exactly once (a permutation
    /// with padding, like a window partition): what
    /// [`crate::add_layer_norm_gather`] needs to update the residual in place.
    pub fn is_partition(&self) -> bool {
        self.partition
    }

    /// The device the table lives on.
    pub fn device(&self) -> &Device {
        self.table.device()
    }

    /// The table on the device.
    pub fn table(&self) -> View<'_, i32> {
        self.table.view()
    }
}

/// Shared argument checks of the gather family: the plan is on the
/// stream's device, `src` holds `plan.n_src()` tokens and `out`
/// `plan.len()` tokens of `width`, both aligned and disjoint. Returns the
/// table as a kernel argument.
pub(crate) fn check_plan<'p>(
    c: &Check<'_>,
    plan: &'p GatherPlan,
    src: &Span,
    out: &Span,
    width: usize,
) -> Result<In<'p, i32>> {
    c.q.check_same(plan.device().id, c.op, "plan")?;
    c.same_device(src, "src")?;
    c.same_device(out, "out")?;
    let n_src = c.rows(src, "src", width)?;
    if n_src != plan.n_src {
        return Err(Error::LengthMismatch {
            op: c.op,
            what: "src (tokens)",
            got: n_src,
            expected: plan.n_src,
        });
    }
    let n_out = c.rows(out, "out", width)?;
    if n_out != plan.len() {
        return Err(Error::LengthMismatch {
            op: c.op,
            what: "out (tokens)",
            got: n_out,
            expected: plan.len(),
        });
    }
    c.aligned(src, "src")?;
    c.aligned(out, "out")?;
    c.disjoint(src, "src", out, "out")?;
    Ok(plan.table.view().arg())
}

/// `out[t] = plan[t] >= 0 ? src[plan[t]] : 0` over tokens of `width`
/// halves: any positive multiple of 8 (192, 384 and 768 have dedicated
/// kernels; other widths use a generic vector loop).
///
/// `src` is [plan.n_src(), width], `out` is [plan.len(), width]; both
/// 16-byte aligned and disjoint. Every check runs before the launch.
pub fn gather(
    q: &impl AsStream,
    plan: &GatherPlan,
    src: &View<'_, f16>,
    out: &mut ViewMut<'_, f16>,
    width: usize,
) -> Result<()> {
    let c = Check {
        q: q.as_stream(),
        op: "gather",
    };
    if width == 0 || !width.is_multiple_of(VEC_HALVES) {
        return Err(Error::BadParameter {
            op: c.op,
            what: "width",
            value: width.to_string(),
            why: "must be a positive multiple of 8 (16-byte vectors)",
        });
    }
    let (ss, os) = (Span::from(src), Span::from(&*out));
    let table = check_plan(&c, plan, &ss, &os, width)?;
    let n_out = plan.len();
    if n_out == 0 {
        return Ok(());
    }
    let fixed: Option<GatherKernel> = match width {
        192 => Some(launch::wf_gather_192),
        384 => Some(launch::wf_gather_384),
        768 => Some(launch::wf_gather_768),
        _ => None,
    };
    let (src, out) = (src.arg(), out.arg());
    let (n_out64, n_src64) = (n_out as u64, plan.n_src as u64);
    match (fixed, gather_layout(width)) {
        (Some(kernel), Some(layout)) => {
            let l = row_launch(&c, n_out, layout.blocks_for(n_out))?;
            // SAFETY: the table was validated against n_src and lives as
            // long as `plan`; extents, alignment and aliasing checked above.
            unsafe { kernel(c.q, l, src, table, out, n_out64, n_src64) }
        }
        _ => {
            let per_block = (ROW_BLOCK / GENERIC_LANES) as usize;
            let l = row_launch(&c, n_out, n_out.div_ceil(per_block))?;
            let vecs = (width / VEC_HALVES) as u64;
            // SAFETY: as above.
            unsafe { launch::wf_gather_generic(c.q, l, src, table, out, n_out64, n_src64, vecs) }
        }
    }
}

/// Floats per row of [`gather_to_f16`]: four, one 16-byte load.
pub const GATHER_F32_ROW: usize = 4;

/// `out[t] = plan[t] >= 0 ? f16(src[plan[t]]) : 0` over rows of
/// [`GATHER_F32_ROW`] floats: a gather that converts `f32` to `f16` in the
/// same pass, each value rounded to nearest even (beyond 65504 to
/// infinity, NaN to a NaN), padding rows `+0.0`. The plan's tokens are
/// these rows: `src` is `[plan.n_src(), 4]` `f32`, `out` `[plan.len(), 4]`
/// `f16`, both 16-byte aligned and disjoint. Every check runs before the
/// launch.
///
/// Pangu's patch embedding is one such gather: a patch's four longitudes
/// are adjacent in the fields, so zero padding, the patch layout and the
/// conversion to `f16` are one pass.
pub fn gather_to_f16(
    q: &impl AsStream,
    plan: &GatherPlan,
    src: &View<'_, f32>,
    out: &mut ViewMut<'_, f16>,
) -> Result<()> {
    let c = Check {
        q: q.as_stream(),
        op: "gather_to_f16",
    };
    let (ss, os) = (Span::from(src), Span::from(&*out));
    let table = check_plan(&c, plan, &ss, &os, GATHER_F32_ROW)?;
    let n_out = plan.len();
    if n_out == 0 {
        return Ok(());
    }
    let l = row_launch(&c, n_out, n_out.div_ceil(ROW_BLOCK as usize))?;
    let (n_out64, n_src64) = (n_out as u64, plan.n_src as u64);
    // SAFETY: the table was validated against n_src and lives as long as
    // `plan`; extents, alignment and aliasing checked above.
    unsafe { launch::wf_gather4_f32_to_f16(c.q, l, src.arg(), table, out.arg(), n_out64, n_src64) }
}

type GatherKernel = for<'a, 'b, 'c> unsafe fn(
    &Stream,
    Launch,
    In<'a, u16>,
    In<'b, i32>,
    Out<'c, u16>,
    u64,
    u64,
) -> Result<()>;

/// A one-dimensional launch of `blocks` row workgroups.
pub(crate) fn row_launch(c: &Check<'_>, rows: usize, blocks: usize) -> Result<Launch> {
    row_launch_of(c, rows, blocks, ROW_BLOCK)
}

/// [`row_launch`] in workgroups of `block` threads.
pub(crate) fn row_launch_of(
    c: &Check<'_>,
    rows: usize,
    blocks: usize,
    block: u32,
) -> Result<Launch> {
    Ok(Launch {
        grid: (c.grid(rows, blocks, block)?, 1),
        block,
        shared_bytes: 0,
    })
}
