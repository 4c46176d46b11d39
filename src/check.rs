//! Error measures in f16 ulps and the LayerNorm-family row check, shared by
//! the kernel suite and the harness.
use crate::oracle;
use half::f16;

/// f16 NaN with a payload no kernel produces: outputs are filled with it
/// before each launch, so an element a kernel did not write stays
/// recognisably poisoned.
pub const POISON: f16 = f16::from_bits(0x7e5a);

/// The f16 spacing at `v`: `2^(e - 10)` for `|v|` in `[2^e, 2^(e+1))`,
/// 2^-24 below the normal range.
pub fn ulp16(v: f64) -> f64 {
    let a = v.abs().max(f16::MIN_POSITIVE.to_f64());
    2f64.powf(a.log2().floor() - 10.0)
}

/// Distance in f16 ulps ([`ulp16`] of `want`) between `got` and the exact
/// value `want`. NaN against NaN is 0, NaN against a number infinite.
/// An infinite `got` against a finite `want` counts as `±65536` (the value
/// after 65504 on the f16 grid), so a result that overflowed by rounding is
/// one ulp from a reference just past 65504; infinities of the same sign
/// are 0 apart.
pub fn ulp_err(got: f16, want: f64) -> f64 {
    if got.is_nan() || want.is_nan() {
        return if got.is_nan() && want.is_nan() {
            0.0
        } else {
            f64::INFINITY
        };
    }
    if want.is_infinite() {
        return if got.to_f64() == want {
            0.0
        } else {
            f64::INFINITY
        };
    }
    let g = if got.is_infinite() {
        65536f64.copysign(got.to_f64())
    } else {
        got.to_f64()
    };
    (g - want).abs() / ulp16(want)
}

/// Checks one LayerNorm output row `got` against the exact LayerNorm of the
/// same f16 inputs `x` (the f64 oracle), every element:
/// - within one f16 ulp of the exact value (`ulp_err <= 1`);
/// - with affine, `y = o * gamma + beta` may also be off by the affine
///   map's own cancellation term: `|got - y| <= (1 + 2^-12) ulp16(y) +
///   2^-20 |o gamma| + 2^-28 |gamma|`, `o` the exact normalised value (the
///   kernels' bound, derived in `device/src/kernels/ln_stats.rs`; it is
///   within one ulp wherever `|y| >= 2^-8 |o gamma|`, and 0 where `o = 0`);
/// - a NaN reference needs a NaN output; no element may hold [`POISON`].
///
/// Returns the worst error in ulps.
pub fn check_ln_row(
    got: &[f16],
    x: &[f16],
    gamma: Option<&[f16]>,
    beta: Option<&[f16]>,
    eps: f32,
) -> Result<f64, String> {
    let o = oracle::layer_norm_row(x, None, None, f64::from(eps));
    let mut worst = 0.0f64;
    for i in 0..x.len() {
        let g = got[i];
        if g.to_bits() == POISON.to_bits() {
            return Err(format!("col {i}: not written"));
        }
        let (want, cancel) = match (gamma, beta) {
            (Some(gm), Some(bt)) => {
                let gi = gm[i].to_f64();
                (
                    o[i] * gi + bt[i].to_f64(),
                    2f64.powi(-20) * (o[i] * gi).abs() + 2f64.powi(-28) * gi.abs(),
                )
            }
            _ => (o[i], 0.0),
        };
        let e = ulp_err(g, want);
        if e <= 1.0 {
            worst = worst.max(e);
            continue;
        }
        let within = cancel > 0.0
            && want.is_finite()
            && g.is_finite()
            && (g.to_f64() - want).abs() <= (1.0 + 2f64.powi(-12)) * ulp16(want) + cancel;
        if !within {
            return Err(format!(
                "col {i}: got {g} ({:#06x}) want {want:e} ({e:.2} ulp{})",
                g.to_bits(),
                if cancel > 0.0 {
                    format!(", affine term {cancel:.3e}")
                } else {
                    String::new()
                }
            ));
        }
        worst = worst.max(e);
    }
    Ok(worst)
}
