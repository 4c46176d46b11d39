//! LayerNorm fused with a token gather (the Swin window partition after a
//! LayerNorm), in one pass with no normalised intermediate.
//!
//! Contract: `out[t] = plan[t] >= 0 ? LayerNorm(src[plan[t]]) : 0`, where
//! LayerNorm has exactly the numerics of [`crate::layer_norm`] (f32 mean
//! and biased variance, affine in f32, rounded once to f16; a NaN/Inf row
//! gives a NaN row). Padding tokens are `+0.0` (also with affine: zero, not
//! `beta`), as PyTorch's `LN -> pad -> partition` order produces.
use super::Check;
use super::gather::{GatherPlan, check_plan};
use super::layer_norm::Affine;
use crate::backend::{Arg, Launch};
use crate::buffer::{Span, View, ViewMut};
use crate::device::Device;
use crate::{Error, Result};
use half::f16;
use wavefuse_shared::layout::{LN_WIDTHS, ROW_BLOCK, RowLayout};

/// The kernel entry point for a width (`None` when unsupported).
pub(crate) fn kernel_name(width: usize, affine: bool) -> Option<&'static str> {
    Some(match (width, affine) {
        (192, false) => "wf_layer_norm_gather_192",
        (384, false) => "wf_layer_norm_gather_384",
        (768, false) => "wf_layer_norm_gather_768",
        (192, true) => "wf_layer_norm_gather_affine_192",
        (384, true) => "wf_layer_norm_gather_affine_384",
        (768, true) => "wf_layer_norm_gather_affine_768",
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
    dev: &Device,
    plan: &GatherPlan,
    src: &View<'_, f16>,
    out: &mut ViewMut<'_, f16>,
    width: usize,
    affine: Option<Affine<'_, '_>>,
    eps: f32,
) -> Result<()> {
    let c = Check {
        dev,
        op: "layer_norm_gather",
    };
    let (Some(name), Some(layout)) = (
        kernel_name(width, affine.is_some()),
        RowLayout::for_width(width),
    ) else {
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
    let grid = c.grid(n_out, layout.blocks_for(n_out))?;
    let l = Launch {
        grid: (grid, 1),
        block: ROW_BLOCK,
        shared_bytes: 0,
    };
    let args = [
        Arg::Ptr(ss.ptr),
        Arg::Ptr(table),
        Arg::Ptr(os.ptr),
        Arg::Ptr(g),
        Arg::Ptr(b),
        Arg::U64(n_out as u64),
        Arg::U64(plan.n_src() as u64),
        Arg::F32(eps),
    ];
    // SAFETY: the table was validated against n_src and lives as long as
    // `plan`; extents, alignment and aliasing checked above; the argument
    // list matches the kernel signature in wavefuse-device.
    unsafe { dev.be.launch(name, l, &args) }
}
