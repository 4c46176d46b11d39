//! Bias + GELU: `y = gelu(x + bias)` over f16 rows.
//!
//! Contract (matches `torch.nn.functional.gelu(x + b)` on CUDA):
//! - f16 bias: `x + b` is an f16 tensor op, so it is rounded to f16 first;
//!   the GELU then runs in f32 on that f16 value and is rounded once:
//!   `y = f16(gelu_f32(f16(f32(x) + f32(b))))`.
//! - bf16 bias: f16 + bf16 promotes to f32 in PyTorch, so there is no f16
//!   rounding before the GELU: `y = f16(gelu_f32(f32(x) + f32(b)))`, i.e.
//!   `F.gelu(x + b).to(torch.float16)`.
//! - [`GeluMode::Erf`] (default): `x/2 * (1 + erf(x / sqrt 2))`;
//!   [`GeluMode::Tanh`]: `x/2 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))`
//!   (PyTorch's `approximate="tanh"`).
//! - Accuracy: within 1 f16 ulp of the GELU computed in f64 from the same
//!   (rounded) `x + b`, for every input (all 65536 f16 values are tested);
//!   see `wavefuse_device::math` for the f32 erf / exp (erf: under 1 f32 ulp
//!   measured). Special values follow the formula in IEEE f32, as PyTorch's
//!   CUDA kernel does: `gelu(+inf) = +inf`, `gelu(-inf) = NaN`
//!   (`-inf * 0`), NaN -> NaN; large negative finite inputs give `-0.0`;
//!   results beyond the f16 range (bf16 bias) become `±inf`.
//!
//! Paths: 16-byte vectors when `cols % 8 == 0` and `x`, `y` and `bias` are
//! 16-byte aligned, element by element otherwise (any `cols >= 1`, any
//! offset). Both give the same bits.
use super::{Check, VEC_ALIGN};
use crate::backend::Launch;
use crate::buffer::{Span, View, ViewMut};
use crate::device::{AsStream, Stream};
use crate::registry::{In, Out, launch};
use crate::{Error, Result};
use half::{bf16, f16};
use wavefuse_shared::geometry::{GELU_BLOCK, GELU_PER_THREAD};

/// Which GELU.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum GeluMode {
    /// Exact: `x * Phi(x)` through erf (PyTorch's default).
    #[default]
    Erf,
    /// The tanh approximation (PyTorch's `approximate="tanh"`).
    Tanh,
}

/// The bias vector, `cols` elements.
#[derive(Clone, Copy)]
pub enum GeluBias<'a> {
    /// f16 bias: `x + b` rounds to f16 before the GELU.
    F16(&'a View<'a, f16>),
    /// bf16 bias: `x + b` stays f32 (PyTorch promotes f16 + bf16 to f32).
    Bf16(&'a View<'a, bf16>),
}

type GeluKernel = for<'a, 'b, 'c> unsafe fn(
    &Stream,
    Launch,
    In<'a, u16>,
    In<'b, u16>,
    Out<'c, u16>,
    u32,
    u32,
) -> Result<()>;

/// The kernel for a (mode, bias dtype, path).
fn kernel(mode: GeluMode, bf16_bias: bool, vector: bool) -> GeluKernel {
    match (mode, bf16_bias, vector) {
        (GeluMode::Erf, false, true) => launch::wf_bias_gelu_f16,
        (GeluMode::Erf, true, true) => launch::wf_bias_gelu_bf16,
        (GeluMode::Tanh, false, true) => launch::wf_bias_gelu_tanh_f16,
        (GeluMode::Tanh, true, true) => launch::wf_bias_gelu_tanh_bf16,
        (GeluMode::Erf, false, false) => launch::wf_bias_gelu_f16_scalar,
        (GeluMode::Erf, true, false) => launch::wf_bias_gelu_bf16_scalar,
        (GeluMode::Tanh, false, false) => launch::wf_bias_gelu_tanh_f16_scalar,
        (GeluMode::Tanh, true, false) => launch::wf_bias_gelu_tanh_bf16_scalar,
    }
}

/// `y = gelu(x + bias)` over `x` [rows, cols] (see the module docs).
///
/// `x` and `y` have the same length (a multiple of `cols`; empty is a
/// no-op), `bias` has `cols` elements, and `y` overlaps neither input.
/// Errors, all before any launch: `cols == 0` ([`Error::BadParameter`]),
/// `x` not a multiple of `cols` ([`Error::RaggedRows`]),
/// `y` or `bias` of the wrong length ([`Error::LengthMismatch`]), buffers of
/// another device ([`Error::WrongDevice`]), overlap ([`Error::Aliasing`]),
/// more than `u32::MAX` elements ([`Error::TooLarge`]).
pub fn bias_gelu(
    q: &impl AsStream,
    x: &View<'_, f16>,
    bias: GeluBias<'_>,
    y: &mut ViewMut<'_, f16>,
    cols: usize,
    mode: GeluMode,
) -> Result<()> {
    let c = Check {
        q: q.as_stream(),
        op: "bias_gelu",
    };
    if cols == 0 {
        return Err(Error::BadParameter {
            op: c.op,
            what: "cols",
            value: "0".into(),
            why: "must be >= 1",
        });
    }
    let (xs, ys) = (Span::from(x), Span::from(&*y));
    let (bs, b_arg, bf16_bias) = match bias {
        GeluBias::F16(b) => (Span::from(b), b.arg(), false),
        // bf16 halves cross the kernel ABI as u16 bits too.
        GeluBias::Bf16(b) => (Span::from(b), b.arg(), true),
    };
    c.same_device(&xs, "x")?;
    c.same_device(&ys, "y")?;
    c.same_device(&bs, "bias")?;
    let rows = c.rows(&xs, "x", cols)?;
    c.len(&ys, "y", xs.len)?;
    c.len(&bs, "bias", cols)?;
    c.disjoint(&xs, "x", &ys, "y")?;
    c.disjoint(&bs, "bias", &ys, "y")?;
    let n = xs.len;
    if n > u32::MAX as usize {
        return Err(Error::TooLarge {
            op: c.op,
            rows,
            blocks: n.div_ceil((GELU_BLOCK * GELU_PER_THREAD) as usize),
        });
    }
    if rows == 0 {
        return Ok(());
    }
    let vector = cols.is_multiple_of(8) && [&xs, &ys, &bs].iter().all(|s| s.ptr % VEC_ALIGN == 0);
    let (items, per_row) = if vector { (n / 8, cols / 8) } else { (n, cols) };
    let grid = c.grid(
        rows,
        items.div_ceil((GELU_BLOCK * GELU_PER_THREAD) as usize),
        GELU_BLOCK,
    )?;
    let l = Launch {
        grid: (grid, 1),
        block: GELU_BLOCK,
        shared_bytes: 0,
    };
    let run = kernel(mode, bf16_bias, vector);
    // SAFETY: lengths, devices and aliasing checked above; the vector path
    // only with 16-byte alignment and cols % 8 == 0.
    unsafe {
        run(
            c.q,
            l,
            x.arg(),
            b_arg,
            y.arg(),
            items as u32,
            per_row as u32,
        )
    }
}
