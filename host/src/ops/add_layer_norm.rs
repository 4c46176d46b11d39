//! Residual add + LayerNorm in one pass.
//!
//! Contract (matches the unfused PyTorch path `r = residual + branch;
//! y = F.layer_norm(r, ...)` on f16 CUDA tensors):
//! - `r = f16(residual + branch)`: the f16 sum, rounded once to nearest-even
//!   (an f32 add of the two halves rounded to f16 is the correctly rounded
//!   f16 sum); an overflow gives ±Inf as in PyTorch. `r` is written out.
//! - `y` is the LayerNorm of the ROUNDED `r` (never of the unrounded f32
//!   sum), with the numerics of [`crate::layer_norm`]: within one f16 ulp
//!   of the exact LayerNorm of `r` (with or without affine), rounded once
//!   to f16. A row holding NaN or Inf gives NaN
//!   everywhere in that row of `y`.
//!
//! Engines keep the residual stream in one buffer and update it in place:
//! [`add_layer_norm`] takes `residual` as in/out. [`add_layer_norm_to`]
//! writes the sum to a separate buffer and leaves `residual` untouched.
//! The kernel reads each input element once and writes `r` and `y` once.
use super::Check;
use super::layer_norm::Affine;
use crate::backend::Launch;
use crate::buffer::{Span, View, ViewMut};
use crate::device::{AsStream, Stream};
use crate::registry::{In, Out, launch};
use crate::{Error, Result};
use half::f16;
use wavefuse_shared::AddLnShape;
use wavefuse_shared::layout::LN_WIDTHS;

const OP: &str = "add_layer_norm";

type AddLnKernel = for<'a, 'b, 'c, 'd, 'e, 'f> unsafe fn(
    &Stream,
    Launch,
    In<'a, u16>,
    In<'b, u16>,
    Out<'c, u16>,
    Out<'d, u16>,
    In<'e, u16>,
    In<'f, u16>,
    u64,
    f32,
) -> Result<()>;

/// The kernel for a width and affine flag (`None` when unsupported).
fn kernel(width: usize, affine: bool) -> Option<AddLnKernel> {
    Some(match (width, affine) {
        (192, false) => launch::wf_add_layer_norm_192,
        (384, false) => launch::wf_add_layer_norm_384,
        (768, false) => launch::wf_add_layer_norm_768,
        (192, true) => launch::wf_add_layer_norm_affine_192,
        (384, true) => launch::wf_add_layer_norm_affine_384,
        (768, true) => launch::wf_add_layer_norm_affine_768,
        _ => return None,
    })
}

/// A tensor's extent for the checks and its kernel argument.
struct Arg<A> {
    span: Span,
    arg: A,
}

/// In place: `residual = f16(residual + branch)`, then
/// `y = LayerNorm(residual)` (of the rounded sum), over rows of `width`
/// (192, 384 or 768).
///
/// `residual`, `branch` and `y` are [rows, width] (rows >= 1), 16-byte
/// aligned, pairwise disjoint. `gamma`/`beta` (when affine) are `width`
/// long, 16-byte aligned and must not overlap `residual` or `y`. Every
/// check runs before the launch; on an error nothing is written.
pub fn add_layer_norm(
    q: &impl AsStream,
    residual: &mut ViewMut<'_, f16>,
    branch: &View<'_, f16>,
    y: &mut ViewMut<'_, f16>,
    width: usize,
    affine: Option<Affine<'_, '_>>,
    eps: f32,
) -> Result<()> {
    let res = Arg {
        span: Span::from(&*residual),
        arg: residual.arg_in(),
    };
    let rout = Arg {
        span: res.span,
        arg: residual.arg(),
    };
    run(
        q.as_stream(),
        res,
        Arg {
            span: Span::from(branch),
            arg: branch.arg(),
        },
        rout,
        true,
        Arg {
            span: Span::from(&*y),
            arg: y.arg(),
        },
        width,
        affine,
        eps,
    )
}

/// Out of place: `residual_out = f16(residual + branch)`, then
/// `y = LayerNorm(residual_out)` (of the rounded sum); `residual` is only
/// read.
///
/// All four tensors are [rows, width] (rows >= 1), 16-byte aligned; the
/// outputs `residual_out` and `y` must not overlap each other or any
/// input (for in-place use call [`add_layer_norm`]). Every check runs
/// before the launch.
#[allow(clippy::too_many_arguments)]
pub fn add_layer_norm_to(
    q: &impl AsStream,
    residual: &View<'_, f16>,
    branch: &View<'_, f16>,
    residual_out: &mut ViewMut<'_, f16>,
    y: &mut ViewMut<'_, f16>,
    width: usize,
    affine: Option<Affine<'_, '_>>,
    eps: f32,
) -> Result<()> {
    run(
        q.as_stream(),
        Arg {
            span: Span::from(residual),
            arg: residual.arg(),
        },
        Arg {
            span: Span::from(branch),
            arg: branch.arg(),
        },
        Arg {
            span: Span::from(&*residual_out),
            arg: residual_out.arg(),
        },
        false,
        Arg {
            span: Span::from(&*y),
            arg: y.arg(),
        },
        width,
        affine,
        eps,
    )
}

/// Checks and launches; `in_place` means `rout` is `res` (`residual` is
/// written).
#[allow(clippy::too_many_arguments)]
fn run(
    q: &Stream,
    res: Arg<In<'_, u16>>,
    br: Arg<In<'_, u16>>,
    rout: Arg<Out<'_, u16>>,
    in_place: bool,
    y: Arg<Out<'_, u16>>,
    width: usize,
    affine: Option<Affine<'_, '_>>,
    eps: f32,
) -> Result<()> {
    let c = Check { q, op: OP };
    let rout_name = if in_place { "residual" } else { "residual_out" };
    let unsupported = Error::UnsupportedWidth {
        op: OP,
        width,
        supported: &LN_WIDTHS,
    };
    let (Some(kernel), Some(shape)) = (
        kernel(width, affine.is_some()),
        AddLnShape::for_entry(width, c.target(), affine.is_some()),
    ) else {
        return Err(unsupported);
    };
    let (
        Arg {
            span: res,
            arg: res_a,
        },
        Arg {
            span: br,
            arg: br_a,
        },
    ) = (res, br);
    let (
        Arg {
            span: rout,
            arg: rout_a,
        },
        Arg { span: ys, arg: y_a },
    ) = (rout, y);
    c.same_device(&res, "residual")?;
    c.same_device(&br, "branch")?;
    c.same_device(&rout, rout_name)?;
    c.same_device(&ys, "y")?;
    let rows = c.rows(&res, "residual", width)?;
    c.len(&br, "branch", res.len)?;
    c.len(&rout, rout_name, res.len)?;
    c.len(&ys, "y", res.len)?;
    c.aligned(&res, "residual")?;
    c.aligned(&br, "branch")?;
    c.aligned(&rout, rout_name)?;
    c.aligned(&ys, "y")?;
    // Outputs are disjoint from everything else (in place, `residual` IS
    // the residual output: the one allowed coincidence).
    c.disjoint(&br, "branch", &rout, rout_name)?;
    c.disjoint(&ys, "y", &rout, rout_name)?;
    c.disjoint(&br, "branch", &ys, "y")?;
    if !in_place {
        c.disjoint(&res, "residual", &rout, rout_name)?;
        c.disjoint(&res, "residual", &ys, "y")?;
    }
    c.finite_nonneg(eps, "eps")?;
    let (g, b) = Affine::check(affine, &c, width, &[(&ys, "y"), (&rout, rout_name)])?;
    if rows == 0 {
        return Ok(());
    }
    let grid = c.grid(rows, shape.blocks_for(rows), shape.block)?;
    let l = Launch {
        grid: (grid, 1),
        // The kernel build assumes exactly this workgroup size.
        block: shape.block,
        shared_bytes: 0,
    };
    // SAFETY: extents, alignment and aliasing checked above (the kernel
    // reads and writes each residual element from the same lane, so
    // `residual_out == residual` is race-free).
    unsafe { kernel(q, l, res_a, br_a, rout_a, y_a, g, b, rows as u64, eps) }
}
