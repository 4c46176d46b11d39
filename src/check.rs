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
/// are 0 apart, and so are an infinity and a `want` of the same sign at or
/// beyond 65520, which rounds to it.
pub fn ulp_err(got: f16, want: f64) -> f64 {
    if got.is_nan() || want.is_nan() {
        return if got.is_nan() && want.is_nan() {
            0.0
        } else {
            f64::INFINITY
        };
    }
    if got.is_infinite() && want.abs() >= 65520.0 && got.to_f64().signum() == want.signum() {
        return 0.0;
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
/// same f16 inputs `x` (the f64 oracle), every element: within one f16 ulp
/// of the exact value (`ulp_err <= 1`), with or without affine (the
/// kernels' bound, derived in `device/src/kernels/ln_stats.rs` and
/// `ln_affine.rs`); a NaN reference needs a NaN output; no element may
/// hold [`POISON`].
///
/// Returns the worst error in ulps.
pub fn check_ln_row(
    got: &[f16],
    x: &[f16],
    gamma: Option<&[f16]>,
    beta: Option<&[f16]>,
    eps: f32,
) -> Result<f64, String> {
    let want = oracle::layer_norm_row(x, gamma, beta, f64::from(eps));
    let mut worst = 0.0f64;
    for i in 0..x.len() {
        let g = got[i];
        if g.to_bits() == POISON.to_bits() {
            return Err(format!("col {i}: not written"));
        }
        let e = ulp_err(g, want[i]);
        if e > 1.0 {
            return Err(format!(
                "col {i}: got {g} ({:#06x}) want {:e} ({e:.2} ulp)",
                g.to_bits(),
                want[i]
            ));
        }
        worst = worst.max(e);
    }
    Ok(worst)
}
