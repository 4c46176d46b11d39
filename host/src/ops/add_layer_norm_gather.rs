//! Residual add + LayerNorm + token gather in one pass (the Swin block's
//! residual add, `norm2`/next `norm1`, and window partition).
//!
//! Contract: `residual[s] = f16(residual[s] + branch[s])` for every source
//! token `s` (updated in place, rounded once as in
//! [`crate::add_layer_norm`]), and `out[t] = plan[t] >= 0 ?
//! LayerNorm(residual[plan[t]]) : 0`, the LayerNorm reading the ROUNDED
//! sum with the numerics of [`crate::layer_norm`]. Padding tokens are
//! `+0.0`. The plan must be a partition ([`GatherPlan::is_partition`]:
//! every source named exactly once), so every residual token is updated
//! exactly once.
use super::Check;
use super::gather::{GatherPlan, check_plan, row_launch};
use super::layer_norm::Affine;
use crate::backend::Launch;
use crate::buffer::{Span, View, ViewMut};
use crate::device::{AsStream, Stream};
use crate::registry::{In, Out, launch};
use crate::{Error, Result};
use half::f16;
use wavefuse_shared::layout::{LN_WIDTHS, RowLayout};

type AddLnGatherKernel = for<'a, 'b, 'c, 'd, 'e, 'f, 'g> unsafe fn(
    &Stream,
    Launch,
    In<'a, u16>,
    In<'b, u16>,
    Out<'c, u16>,
    In<'d, i32>,
    Out<'e, u16>,
    In<'f, u16>,
    In<'g, u16>,
    u64,
    u64,
    f32,
) -> Result<()>;

/// The kernel for a width and affine flag (`None` when unsupported).
fn kernel(width: usize, affine: bool) -> Option<AddLnGatherKernel> {
    Some(match (width, affine) {
        (192, false) => launch::wf_add_layer_norm_gather_192,
        (384, false) => launch::wf_add_layer_norm_gather_384,
        (768, false) => launch::wf_add_layer_norm_gather_768,
        (192, true) => launch::wf_add_layer_norm_gather_affine_192,
        (384, true) => launch::wf_add_layer_norm_gather_affine_384,
        (768, true) => launch::wf_add_layer_norm_gather_affine_768,
        _ => return None,
    })
}

/// In place: `residual = f16(residual + branch)`, then
/// `out[t] = plan[t] >= 0 ? LayerNorm(residual[plan[t]]) : 0`, over rows of
/// `width` (192, 384 or 768).
///
/// `residual` and `branch` are [plan.n_src(), width], `out` is
/// [plan.len(), width]; all 16-byte aligned and pairwise disjoint;
/// `gamma`/`beta` (when affine) are `width` long, aligned, and must not
/// overlap `residual` or `out`. `plan` must be a partition
/// ([`GatherPlan::is_partition`]), else [`Error::BadParameter`] with
/// `what == "plan"`. Every check runs before the launch.
#[allow(clippy::too_many_arguments)]
pub fn add_layer_norm_gather(
    q: &impl AsStream,
    plan: &GatherPlan,
    residual: &mut ViewMut<'_, f16>,
    branch: &View<'_, f16>,
    out: &mut ViewMut<'_, f16>,
    width: usize,
    affine: Option<Affine<'_, '_>>,
    eps: f32,
) -> Result<()> {
    let c = Check {
        q: q.as_stream(),
        op: "add_layer_norm_gather",
    };
    let (Some(kernel), Some(layout)) =
        (kernel(width, affine.is_some()), RowLayout::for_width(width))
    else {
        return Err(Error::UnsupportedWidth {
            op: c.op,
            width,
            supported: &LN_WIDTHS,
        });
    };
    let (rs, bs, os) = (
        Span::from(&*residual),
        Span::from(branch),
        Span::from(&*out),
    );
    // `residual` plays the gather's source: tokens, alignment, disjoint
    // from `out`, and the plan's device.
    let table = check_plan(&c, plan, &rs, &os, width)?;
    c.same_device(&bs, "branch")?;
    c.len(&bs, "branch", rs.len)?;
    c.aligned(&bs, "branch")?;
    c.disjoint(&bs, "branch", &rs, "residual")?;
    c.disjoint(&bs, "branch", &os, "out")?;
    if !plan.is_partition() {
        return Err(Error::BadParameter {
            op: c.op,
            what: "plan",
            value: format!("{plan:?}"),
            why: "must name every source token exactly once (a partition with padding)",
        });
    }
    c.finite_nonneg(eps, "eps")?;
    let (g, b) = Affine::check(affine, &c, width, &[(&os, "out"), (&rs, "residual")])?;
    let n_out = plan.len();
    if n_out == 0 {
        return Ok(());
    }
    let l = row_launch(&c, n_out, layout.blocks_for(n_out))?;
    // SAFETY: the table was validated against n_src and names each source
    // once, so each residual element is read and written by one lane;
    // extents, alignment and aliasing checked above.
    unsafe {
        kernel(
            c.q,
            l,
            residual.arg_in(),
            branch.arg(),
            residual.arg(),
            table,
            out.arg(),
            g,
            b,
            n_out as u64,
            plan.n_src() as u64,
            eps,
        )
    }
}
