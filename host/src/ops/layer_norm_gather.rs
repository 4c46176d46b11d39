//! LayerNorm fused with a token gather (the Swin window partition after a
//! LayerNorm), in one pass with no normalised intermediate.
//!
//! Contract: `out[t] = plan[t] >= 0 ? LayerNorm(src[plan[t]]) : 0`, where
//! LayerNorm has exactly the numerics of [`crate::layer_norm`] (within one
//! f16 ulp of the exact LayerNorm, with or without affine; rounded once to
//! f16; a NaN/Inf row gives a NaN row). Padding tokens are `+0.0` (also with affine: zero, not
//! `beta`), as PyTorch's `LN -> pad -> partition` order produces.
use super::Check;
use super::gather::{GatherPlan, check_plan, row_launch_of};
use super::layer_norm::Affine;
use crate::backend::Launch;
use crate::buffer::{Span, View, ViewMut};
use crate::device::{AsStream, Stream};
use crate::registry::{In, Out, launch};
use crate::{Error, Result};
use half::f16;
use wavefuse_shared::layout::{LN_WIDTHS, RowLayout, ln_block, ln_shared_bytes};

type LnGatherKernel = for<'a, 'b, 'c, 'd, 'e> unsafe fn(
    &Stream,
    Launch,
    In<'a, u16>,
    In<'b, i32>,
    Out<'c, u16>,
    In<'d, u16>,
    In<'e, u16>,
    u64,
    u64,
    f32,
) -> Result<()>;

/// The kernel for a width and affine flag (`None` when unsupported).
fn kernel(width: usize, affine: bool) -> Option<LnGatherKernel> {
    Some(match (width, affine) {
        (192, false) => launch::wf_layer_norm_gather_192,
        (384, false) => launch::wf_layer_norm_gather_384,
        (768, false) => launch::wf_layer_norm_gather_768,
        (192, true) => launch::wf_layer_norm_gather_affine_192,
        (384, true) => launch::wf_layer_norm_gather_affine_384,
        (768, true) => launch::wf_layer_norm_gather_affine_768,
        _ => return None,
    })
}

/// `out[t] = plan[t] >= 0 ? LayerNorm(src[plan[t]]) : 0` over rows of
/// `width` (192, 384 or 768).
///
/// `src` is [plan.n_src(), width], `out` is [plan.len(), width]; both
/// 16-byte aligned and disjoint; `gamma`/`beta` (when affine) are `width`
/// long, aligned, and must not overlap `out`. Every check runs before the
/// launch.
pub fn layer_norm_gather(
    q: &impl AsStream,
    plan: &GatherPlan,
    src: &View<'_, f16>,
    out: &mut ViewMut<'_, f16>,
    width: usize,
    affine: Option<Affine<'_, '_>>,
    eps: f32,
) -> Result<()> {
    let c = Check {
        q: q.as_stream(),
        op: "layer_norm_gather",
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
    let (ss, os) = (Span::from(src), Span::from(&*out));
    let table = check_plan(&c, plan, &ss, &os, width)?;
    c.finite_nonneg(eps, "eps")?;
    let (g, b) = Affine::check(affine, &c, width, &[(&os, "out")])?;
    let n_out = plan.len();
    if n_out == 0 {
        return Ok(());
    }
    // The kernel build assumes exactly this workgroup size.
    let block = ln_block(affine.is_some());
    let l = Launch {
        shared_bytes: ln_shared_bytes(affine.is_some()),
        ..row_launch_of(&c, n_out, layout.blocks_for_of(n_out, block), block)?
    };
    // SAFETY: the table was validated against n_src and lives as long as
    // `plan`; extents, alignment and aliasing checked above.
    unsafe {
        kernel(
            c.q,
            l,
            src.arg(),
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
