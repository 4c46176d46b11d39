//! LayerNorm over f16 rows of a fixed width.
//!
//! Contract (`torch.nn.functional.layer_norm` on f16 tensors, more
//! accurate): biased variance, `y = (x - mean) / sqrt(var + eps)`, then
//! `* gamma + beta` when affine, rounded once to f16. Every output is within
//! one f16 ulp of the exact LayerNorm of the f16 row, with or without
//! affine, also where `gamma * o + beta` cancels (the row sum is exact, the
//! rest f32, and the few affine outputs an f32 computation cannot get
//! within an ulp are redone in f64; constant rows give exactly 0 or
//! `beta`). The derivations are in the device crate's `kernels/ln_stats.rs`
//! and `kernels/ln_affine.rs`. A row holding NaN or Inf gives NaN
//! everywhere in that row.
use super::Check;
use crate::backend::Launch;
use crate::buffer::{Span, View, ViewMut};
use crate::device::{AsStream, Stream};
use crate::registry::{In, Out, launch};
use crate::{Error, Result};
use half::f16;
use wavefuse_shared::layout::{LN_WIDTHS, RowLayout, ln_block, ln_shared_bytes};

/// Per-column scale and shift (f16, `width` each).
#[derive(Clone, Copy)]
pub struct Affine<'a, 'b> {
    /// Scale.
    pub gamma: &'a View<'a, f16>,
    /// Shift.
    pub beta: &'b View<'b, f16>,
}

impl<'a, 'b> Affine<'a, 'b> {
    /// Checks gamma and beta (this device, `width` long, 16-byte aligned,
    /// disjoint from every output) and returns them as kernel arguments;
    /// null without affine.
    pub(crate) fn check(
        affine: Option<Affine<'a, 'b>>,
        c: &Check<'_>,
        width: usize,
        outputs: &[(&Span, &'static str)],
    ) -> Result<(In<'a, u16>, In<'b, u16>)> {
        let Some(a) = affine else {
            return Ok((In::null(), In::null()));
        };
        let (gs, bs) = (Span::from(a.gamma), Span::from(a.beta));
        for (s, n) in [(&gs, "gamma"), (&bs, "beta")] {
            c.same_device(s, n)?;
            c.len(s, n, width)?;
            c.aligned(s, n)?;
            for (o, on) in outputs {
                c.disjoint(s, n, o, on)?;
            }
        }
        Ok((a.gamma.arg(), a.beta.arg()))
    }
}

/// The kernel for a width and affine flag (`None` when unsupported).
type LnKernel = for<'a, 'b, 'c, 'd> unsafe fn(
    &Stream,
    Launch,
    In<'a, u16>,
    Out<'b, u16>,
    In<'c, u16>,
    In<'d, u16>,
    u64,
    f32,
) -> Result<()>;

fn kernel(width: usize, affine: bool) -> Option<LnKernel> {
    Some(match (width, affine) {
        (192, false) => launch::wf_layer_norm_192,
        (384, false) => launch::wf_layer_norm_384,
        (768, false) => launch::wf_layer_norm_768,
        (192, true) => launch::wf_layer_norm_affine_192,
        (384, true) => launch::wf_layer_norm_affine_384,
        (768, true) => launch::wf_layer_norm_affine_768,
        _ => return None,
    })
}

/// `y = LayerNorm(x)` over rows of `width` (192, 384 or 768).
///
/// `x` and `y` are [rows, width], 16-byte aligned, and must not overlap.
/// Every check runs before the launch; zero rows is a no-op.
pub fn layer_norm(
    q: &impl AsStream,
    x: &View<'_, f16>,
    y: &mut ViewMut<'_, f16>,
    width: usize,
    affine: Option<Affine<'_, '_>>,
    eps: f32,
) -> Result<()> {
    let c = Check {
        q: q.as_stream(),
        op: "layer_norm",
    };
    let run = kernel(width, affine.is_some()).ok_or(Error::UnsupportedWidth {
        op: c.op,
        width,
        supported: &LN_WIDTHS,
    })?;
    let layout = RowLayout::for_width(width).ok_or(Error::UnsupportedWidth {
        op: c.op,
        width,
        supported: &LN_WIDTHS,
    })?;
    let (xs, ys) = (Span::from(x), Span::from(&*y));
    c.same_device(&xs, "x")?;
    c.same_device(&ys, "y")?;
    let rows = c.rows(&xs, "x", width)?;
    c.len(&ys, "y", xs.len)?;
    c.aligned(&xs, "x")?;
    c.aligned(&ys, "y")?;
    c.disjoint(&xs, "x", &ys, "y")?;
    c.finite_nonneg(eps, "eps")?;
    let (g, b) = Affine::check(affine, &c, width, &[(&ys, "y")])?;
    if rows == 0 {
        return Ok(());
    }
    // The kernel build assumes exactly this workgroup size.
    let block = ln_block(affine.is_some());
    let grid = c.grid(rows, layout.blocks_for_of(rows, block), block)?;
    let l = Launch {
        grid: (grid, 1),
        block,
        shared_bytes: ln_shared_bytes(affine.is_some()),
    };
    // SAFETY: extents, alignment and aliasing checked above.
    unsafe { run(c.q, l, x.arg(), y.arg(), g, b, rows as u64, eps) }
}
