//! f32 elementary functions for the kernels: `exp`, `erf` / `erfc` and the
//! two GELU forms.
//!
//! core has no transcendental functions on the GPU targets, and `libm`'s
//! `erff` left a private (scratch) segment in a gfx90a kernel. These are
//! branch-free polynomial forms (selects, no tables, no loops), evaluated
//! with fused multiply-adds, so they compile to straight-line register code
//! on every target and give the same bits on every target (IEEE f32
//! operations and correctly rounded FMAs only; no hardware approximations).
//! The exceptions are named as such: [`exp2_hw`], [`recip_approx`] and, on
//! NVIDIA, [`rsqrt`] use the hardware's approximate instructions.
//!
//! Measured accuracy (unit tests below, against `libm`'s f64 functions):
//! - [`exp`]: at most 1 ulp (f32) over the whole input range; exact 0 below
//!   -104, +inf above 89, NaN propagates.
//! - [`erf`]: 0.97 ulp (f32) worst measured over ~2.1M inputs spread over
//!   all of f32 plus the branch points (the test asserts <= 1.5).
//! - [`erfc`]: relative error below 1.5e-6 (the f32 rounding of
//!   the exponent, up to 18 * 2^-24, dominates) where
//!   erfc(x) >= 2.3e-9 (x <= 4.25); 0 above 4.25 (true value < 2.3e-9).
//! - [`gelu_erf`] / [`gelu_tanh`]: relative error below 3e-6 wherever
//!   `|gelu(x)| >= 2^-24` (the smallest f16 subnormal), including the
//!   negative tail (computed through `erfc` / a sigmoid, never as
//!   `1 + erf(x)` with its cancellation), and absolute error below 2^-26
//!   elsewhere; so results rounded to f16 are within 1 f16 ulp of the f64
//!   value (0.5 ulp of rounding plus a small margin). The f16 claim is also
//!   checked exhaustively over all 65536 f16 inputs by the host test suite.
//!
//! The coefficients are Chebyshev-economised fits (mpmath `chebyfit`) of:
//! `erf(sqrt(s)) / sqrt(s)` on s in [0, 1] (degree 6, error 1.5e-9),
//! `ln(erfc(t)) + t^2` on t in [1, 4.25] in the variable `t - 2.625`
//! (degree 9, absolute error 1.2e-8), and `e^f` on f in [-ln2/2, ln2/2]
//! (degree 6, error 2e-9).

// The coefficients are written as the fits printed them (f64 digits); the
// compiler rounds them to f32 once.
#![allow(clippy::excessive_precision)]

use crate::gpu;

/// Straight-line repetition of a block with `$k` bound to each literal in
/// turn: `unroll!(k in [0, 1, 2] { ... })`. Kernels that keep arrays in
/// registers index them only with constants; a loop whose body is too large
/// for LLVM's full-unroll threshold would otherwise index them dynamically
/// and move them to scratch memory.
#[macro_export]
macro_rules! unroll {
    ($k:ident in [$($i:literal),* $(,)?] $body:block) => {
        $({
            let $k: usize = $i;
            $body
        })*
    };
}

/// A launch argument used as a divisor, as `NonZeroU32` so that `/` and
/// `%` carry no divide-by-zero panic path; traps on 0 (the host API never
/// passes 0).
#[inline(always)]
pub fn divisor(v: u32) -> core::num::NonZeroU32 {
    match core::num::NonZeroU32::new(v) {
        Some(d) => d,
        None => gpu::trap(),
    }
}

/// `a * b + c` with one rounding ([`gpu::fma`]).
#[inline(always)]
pub fn fma(a: f32, b: f32, c: f32) -> f32 {
    gpu::fma(a, b, c)
}

/// The sum of eight values as a balanced tree: three dependent adds
/// instead of seven (LLVM may not reassociate a serial f32 sum).
#[inline(always)]
pub fn tree_sum8(v: [f32; 8]) -> f32 {
    ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]))
}

/// `s / d` for a divisor known at compile time, without the IEEE
/// division's range check and slow-path branch (`div.rn.f32`: FCHK, three
/// FMAs and a call on NVIDIA): `q = s * (1/d)`, then one correction step
/// with the exact remainder `s - q * d` (an FMA). The result is within an
/// ulp of `s / d`, and exact whenever `s / d` is representable (a constant
/// row's sum `W * c` gives back `c`, so its deviations are exactly 0;
/// checked for every f16 `c` by the tests below). NaN or inf `s` gives NaN.
#[inline(always)]
pub fn div_const(s: f32, d: f32) -> f32 {
    let inv = 1.0 / d;
    let q = s * inv;
    fma(fma(-q, d, s), inv, q)
}

/// `1 / sqrt(x)` ([`gpu::rsqrt`]: the hardware approximation on NVIDIA,
/// IEEE elsewhere). The NVIDIA result can therefore move a LayerNorm output
/// by one f16 ulp from the emulator's (tests assert that bound).
#[inline(always)]
pub fn rsqrt(x: f32) -> f32 {
    gpu::rsqrt(x)
}

/// `|x|` (clears the sign bit; NaN stays NaN).
#[inline(always)]
pub fn abs(x: f32) -> f32 {
    f32::from_bits(x.to_bits() & 0x7fff_ffff)
}

/// e^x in f32 (see the module docs for accuracy and special values).
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    const LOG2E: f32 = core::f32::consts::LOG2_E;
    // ln 2 split so that k * LN2_HI is exact for |k| <= 256 (Cody-Waite).
    const LN2_HI: f32 = 0.693_145_751_953_125;
    const LN2_LO: f32 = 1.428_606_765_330_187e-6;
    // 1.5 * 2^23: adding it rounds to an integer (|x * log2 e| < 2^22).
    const ROUND: f32 = 12_582_912.0;
    // Clamp (NaN compares false and passes through): e^-104 rounds to 0,
    // e^89 to +inf, and 2^k below stays a product of two normal numbers.
    let x = if x < -104.0 { -104.0 } else { x };
    let x = if x > 89.0 { 89.0 } else { x };
    let k = fma(x, LOG2E, ROUND) - ROUND;
    let f = fma(-k, LN2_HI, x);
    let f = fma(-k, LN2_LO, f);
    let mut p = 1.394_110_843_397_267_4e-3;
    p = fma(p, f, 8.375_126_398_153_335e-3);
    p = fma(p, f, 4.166_635_289_677_516e-2);
    p = fma(p, f, 1.666_641_551_465_327_7e-1);
    p = fma(p, f, 5.000_000_047_117_757e-1);
    p = fma(p, f, 1.000_000_037_716_214);
    p = fma(p, f, 1.0);
    // k in [-150, 128]; 2^k as two normal factors (the first product is
    // exact, the second rounds once, into the subnormals if need be).
    let n = k as i32;
    let n1 = n >> 1;
    let n2 = n - n1;
    let s1 = f32::from_bits(((n1 + 127) as u32) << 23);
    let s2 = f32::from_bits(((n2 + 127) as u32) << 23);
    p * s1 * s2
}

/// `erf(z) / z - 1` for `z^2 = s` in [0, 1] (so `erf(z) = z + z * q`
/// rounds once).
#[inline(always)]
fn erf_small(s: f32) -> f32 {
    let mut p = 7.875_875_062_685_488e-5;
    p = fma(p, s, -8.016_864_287_165_87e-4);
    p = fma(p, s, 5.189_087_423_433_974e-3);
    p = fma(p, s, -2.685_421_201_062_641_2e-2);
    p = fma(p, s, 1.128_359_471_516_021_8e-1);
    p = fma(p, s, -3.761_262_666_672_033_4e-1);
    fma(p, s, 1.283_791_658_483_509e-1)
}

/// Past this `t`, erfc(t) < 2.3e-9 is returned as 0.
const ERFC_CUT: f32 = 4.25;

/// erfc(t) for t >= 1 (0 past [`ERFC_CUT`]); `t` = |z|.
#[inline(always)]
fn erfc_large(t: f32) -> f32 {
    let u = t - 2.625;
    let mut r = -1.015_135_261_036_222_4e-7;
    r = fma(r, u, 1.503_226_405_410_717_2e-6);
    r = fma(r, u, -1.123_490_043_101_714_8e-5);
    r = fma(r, u, 6.687_570_334_906_882e-5);
    r = fma(r, u, -3.670_009_541_838_201_5e-4);
    r = fma(r, u, 1.919_334_401_442_627_2e-3);
    r = fma(r, u, -9.838_254_251_071_757e-3);
    r = fma(r, u, 5.222_964_920_658_082e-2);
    r = fma(r, u, -3.391_467_360_332_236e-1);
    r = fma(r, u, -1.600_044_402_232_471_8);
    // ln erfc(t) = -t^2 + r, with -t*t + r rounded once.
    let e = exp(fma(-t, t, r));
    if t > ERFC_CUT { 0.0 } else { e }
}

/// The error function in f32 (under 1 ulp measured; see the module docs).
#[inline(always)]
pub fn erf(z: f32) -> f32 {
    let t = abs(z);
    let small = fma(z, erf_small(z * z), z);
    let large = 1.0 - erfc_large(t);
    let large = f32::from_bits(large.to_bits() | (z.to_bits() & 0x8000_0000));
    if t < 1.0 { small } else { large }
}

/// The complementary error function in f32 (relative error below 1.5e-6
/// down to 2.3e-9; 0 past z = 4.25).
#[inline(always)]
pub fn erfc(z: f32) -> f32 {
    let t = abs(z);
    let small = 1.0 - fma(z, erf_small(z * z), z);
    let tail = erfc_large(t);
    let large = if z < 0.0 { 2.0 - tail } else { tail };
    if t < 1.0 { small } else { large }
}

/// Exact GELU `x * Phi(x) = x/2 * (1 + erf(x / sqrt 2))` in f32.
///
/// Special values follow the formula in IEEE f32, as PyTorch's CUDA kernel
/// (`x * 0.5 * (1 + erf(x * M_SQRT1_2))`) computes it: `gelu(+inf) = +inf`,
/// `gelu(-inf) = -inf * 0 = NaN`, NaN gives NaN, and large negative finite
/// `x` gives `-0.0`. For `|x / sqrt 2| >= 1` the value is computed as
/// `x * erfc(-x / sqrt 2) / 2` (no cancellation in the negative tail).
#[inline(always)]
pub fn gelu_erf(x: f32) -> f32 {
    let z = x * core::f32::consts::FRAC_1_SQRT_2;
    let t = abs(z);
    let h = 0.5 * x;
    // |z| < 1: h + h * erf(z), one rounding.
    let small = fma(h, fma(z, erf_small(z * z), z), h);
    // |z| >= 1: x * Phi(x), Phi from erfc(|z|).
    let ec = erfc_large(t);
    let phi = if z < 0.0 {
        0.5 * ec
    } else {
        fma(-0.5, ec, 1.0)
    };
    let large = x * phi;
    if t < 1.0 { small } else { large }
}

/// GELU, tanh approximation: `x/2 * (1 + tanh(u))` with
/// `u = sqrt(2/pi) * (x + 0.044715 x^3)`, computed as the identical
/// `x / (1 + e^(-2u))` (no cancellation in the negative tail). `u` is formed
/// as PyTorch forms it (`x * x * x`, then `kBeta * (x + kKappa * x3)`).
/// Special values: `+inf -> +inf`, `-inf -> -inf / inf = NaN` (PyTorch:
/// `-inf * 0 = NaN`), NaN gives NaN, large negative finite `x` gives `-0.0`.
#[inline(always)]
pub fn gelu_tanh(x: f32) -> f32 {
    const BETA: f32 = 0.797_884_560_802_865_4; // sqrt(2 / pi)
    const KAPPA: f32 = 0.044_715;
    let x3 = x * x * x;
    let u = BETA * (x + KAPPA * x3);
    x / (1.0 + exp(-2.0 * u))
}

/// `2^x` through the hardware's approximation on the GPU targets
/// (`ex2.approx.ftz.f32` on NVIDIA: relative error below 2^-22; `v_exp_f32`
/// on AMD, about 1 ulp), `exp2f` on the host. Subnormal inputs and results
/// are flushed to zero on the GPUs (results below 2^-126 only arise where
/// every caller multiplies them into values that round to f16 zero). One
/// MUFU / transcendental-unit instruction instead of a polynomial: the
/// throughput-bound kernels (softmax, GELU) spend their arithmetic budget
/// here. Results therefore differ between a GPU and the emulator by a few
/// f32 ulps, far below the f16 rounding of every output that uses it.
#[inline(always)]
pub fn exp2_hw(x: f32) -> f32 {
    gpu::exp2_approx(x)
}

/// `1 / x` from the hardware's approximate reciprocal (`rcp.approx.ftz.f32`
/// on NVIDIA, `v_rcp_f32` on AMD: within 1 ulp, one instruction; the
/// correctly rounded `rcp.rn` costs five plus a slow-path branch), exact
/// division on the host. For the GELU forms, whose argument lies in
/// [1, inf].
#[inline(always)]
pub fn recip_approx(x: f32) -> f32 {
    gpu::recip_approx(x)
}

/// `e^x` for softmax: `2^(x log2 e)` through [`exp2_hw`]. The product
/// rounds once (relative 2^-24 of the exponent: 1e-5 relative at x = -100),
/// and `exp_hw(0) = 1` exactly.
#[inline(always)]
pub fn exp_hw(x: f32) -> f32 {
    exp2_hw(x * core::f32::consts::LOG2_E)
}

/// Exact-erf GELU for throughput: `x * Phi(x)`, with
/// `h = Phi(-|x|) = erfc(|x| / sqrt 2) / 2` from one formula valid on all of
/// `a = |x|`: `h = u * 2^(Q(u) - a^2 log2(e) / 2)`, `u = 1 / (1 + p a)`,
/// `p = 0.4 / sqrt 2`, `Q` of degree 6 in `u` (a Chebyshev fit of
/// `log2(h / u) + a^2 log2(e) / 2` for `|x| / sqrt 2` in [0, 4.2], the range
/// where GELU is not below half the smallest f16 subnormal; absolute error of
/// the fit 1.5e-6 in log2 units). Then `Phi = h` for `x < 0` (the negative
/// tail keeps its relative accuracy: no `1 + erf` cancellation) and
/// `1 - h` otherwise. Cost: one hardware reciprocal, one hardware `exp2`,
/// eight FMAs / multiplies and the select; `a^2` is exact for f16 inputs.
///
/// Error (f32 model of the GPU sequence against mpmath, checked by
/// `tools/gelu_fit.py` and, on every backend, by the exhaustive f16 test):
/// relative error below 2.5e-6 wherever `|gelu(x)| >= 2^-24`; over all 63488
/// finite f16 inputs the f16 result is the correctly rounded one except for
/// 57 inputs, each within 1 ulp. Special values as the f32 formula gives
/// them: `+inf -> +inf`, `-inf -> -inf * 0 = NaN` (as PyTorch), NaN -> NaN.
#[inline(always)]
pub fn gelu_erf_fast(x: f32) -> f32 {
    const HALF_LOG2E: f32 = 0.721_347_520_444_481_7; // log2(e) / 2
    const P: f32 = 0.282_842_712_474_619; // 0.4 / sqrt 2
    let a = abs(x);
    let u = recip_approx(fma(a, P, 1.0));
    let mut q = 0.255_661_457_777_023_3;
    q = fma(q, u, -0.716_580_331_325_531);
    q = fma(q, u, 0.260_425_984_859_466_55);
    q = fma(q, u, 0.422_035_455_703_735_35);
    q = fma(q, u, 0.436_455_041_170_120_24);
    q = fma(q, u, 1.495_522_618_293_762_2);
    q = fma(q, u, -3.153_518_676_757_812_5);
    let h = u * exp2_hw(fma(-(a * a), HALF_LOG2E, q));
    let phi = if x < 0.0 { h } else { 1.0 - h };
    x * phi
}

/// Tanh-GELU for throughput: [`gelu_tanh`]'s `x / (1 + e^(-2u))` with
/// [`exp_hw`] and [`recip_approx`].
#[inline(always)]
pub fn gelu_tanh_fast(x: f32) -> f32 {
    const BETA: f32 = 0.797_884_560_802_865_4; // sqrt(2 / pi)
    const KAPPA: f32 = 0.044_715;
    let x3 = x * x * x;
    let u = BETA * (x + KAPPA * x3);
    x * recip_approx(1.0 + exp_hw(-2.0 * u))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Distance in f32 ulps of `got` from the exact `want` (ulp of `want`,
    /// floored at the smallest normal's).
    fn ulps(got: f32, want: f64) -> f64 {
        if got as f64 == want {
            return 0.0;
        }
        let a = want.abs().max(f32::MIN_POSITIVE as f64);
        let ulp = 2f64.powi(a.log2().floor() as i32 - 23);
        (got as f64 - want).abs() / ulp
    }

    /// Every f32 with a stride, plus the neighbourhood of the branch points.
    fn samples() -> impl Iterator<Item = f32> {
        let strided = (0..=u32::MAX / 4093).map(|i| f32::from_bits(i * 4093));
        let near = [1.0f32, 4.25, 2.625, 0.5, 89.0, -104.0, -87.0, 88.7]
            .into_iter()
            .flat_map(|c| {
                (-2000i32..=2000).map(move |d| f32::from_bits((c.to_bits() as i32 + d) as u32))
            });
        strided.chain(near).flat_map(|x| [x, -x])
    }

    #[test]
    fn div_const_exact_for_constant_rows_and_within_1_ulp() {
        for w in [192.0f32, 384.0, 768.0] {
            // A row of W copies of one f16 value: the sum is exact in f32
            // and the mean must come back exactly (deviations exactly 0).
            for bits in 0..=u16::MAX {
                let c = gpu::h2f(bits);
                if !c.is_finite() {
                    continue;
                }
                // (-0.0 comes back as +0.0: the same deviations.)
                let got = div_const(w * c, w);
                assert!(
                    got == c && (c == 0.0 || got.to_bits() == c.to_bits()),
                    "W {w} c {c}: {got}"
                );
            }
            for s in samples().filter(|s| s.is_finite() && s.abs() < 1e36 && s.abs() > 1e-30) {
                let e = ulps(div_const(s, w), s as f64 / w as f64);
                assert!(e <= 1.0, "W {w} s {s}: {e} ulp");
            }
            assert!(div_const(f32::INFINITY, w).is_nan());
            assert!(div_const(f32::NAN, w).is_nan());
        }
    }

    #[test]
    fn exp_within_1_ulp() {
        let mut worst = (0.0, 0.0f32);
        for x in samples().filter(|x| x.is_finite() && *x > -110.0 && *x < 90.0) {
            let want = libm::exp(x as f64);
            let got = exp(x);
            if want > f32::MAX as f64 {
                assert!(got == f32::INFINITY || got == f32::MAX, "exp({x}) = {got}");
                continue;
            }
            // Below the normal range `ulps` measures absolutely (2^-149).
            let e = ulps(got, want);
            if e > worst.0 {
                worst = (e, x);
            }
        }
        std::println!("exp: max {:.3} ulp at {:e}", worst.0, worst.1);
        assert!(worst.0 <= 1.0, "exp: {} ulp at {:e}", worst.0, worst.1);
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp(f32::INFINITY), f32::INFINITY);
        assert!(exp(f32::NAN).is_nan());
        assert_eq!(exp(0.0), 1.0);
        assert_eq!(exp(-200.0), 0.0);
    }

    #[test]
    fn erf_within_1_5_ulp() {
        let mut worst = (0.0, 0.0f32);
        for x in samples().filter(|x| x.is_finite()) {
            let e = ulps(erf(x), libm::erf(x as f64));
            if e > worst.0 {
                worst = (e, x);
            }
        }
        std::println!("erf: max {:.3} ulp at {:e}", worst.0, worst.1);
        assert!(worst.0 <= 1.5, "erf: {} ulp at {:e}", worst.0, worst.1);
        assert_eq!(erf(f32::INFINITY), 1.0);
        assert_eq!(erf(f32::NEG_INFINITY), -1.0);
        assert!(erf(f32::NAN).is_nan());
        assert_eq!(erf(0.0).to_bits(), 0);
        assert_eq!(erf(-0.0).to_bits(), 0x8000_0000);
    }

    #[test]
    fn erfc_relative_error() {
        let mut worst = (0.0, 0.0f32);
        for x in samples().filter(|x| x.is_finite() && *x <= ERFC_CUT) {
            let want = libm::erfc(x as f64);
            let e = ((erfc(x) as f64 - want) / want).abs();
            if e > worst.0 {
                worst = (e, x);
            }
        }
        std::println!("erfc: max rel {:.3e} at {:e}", worst.0, worst.1);
        assert!(worst.0 < 1.5e-6, "erfc: rel {:e} at {:e}", worst.0, worst.1);
        assert_eq!(erfc(4.3), 0.0);
        assert_eq!(erfc(f32::NEG_INFINITY), 2.0);
    }

    fn gelu_erf_f64(x: f64) -> f64 {
        // Tail through erfc so that the reference has no cancellation.
        0.5 * x * libm::erfc(-x / core::f64::consts::SQRT_2)
    }

    fn gelu_tanh_f64(x: f64) -> f64 {
        let u = (2.0 / core::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x);
        x / (1.0 + libm::exp(-2.0 * u))
    }

    #[test]
    fn gelu_relative_error() {
        for (name, f, r) in [
            (
                "erf",
                gelu_erf as fn(f32) -> f32,
                gelu_erf_f64 as fn(f64) -> f64,
            ),
            ("tanh", gelu_tanh, gelu_tanh_f64),
            ("erf_fast", gelu_erf_fast, gelu_erf_f64),
            ("tanh_fast", gelu_tanh_fast, gelu_tanh_f64),
        ] {
            let mut worst = (0.0, 0.0f32);
            for x in samples().filter(|x| x.is_finite()) {
                let want = r(x as f64);
                let got = f(x) as f64;
                // Below the smallest f16 subnormal, measure absolutely
                // (against 2^-24 / 4 = 2^-26, scaled to compare with 3e-6).
                let e = if want.abs() >= 2f64.powi(-24) {
                    (got - want).abs() / want.abs()
                } else {
                    (got - want).abs() / 2f64.powi(-26) * 3e-6
                };
                if e > worst.0 {
                    worst = (e, x);
                }
            }
            std::println!("gelu_{name}: max rel {:.3e} at {:e}", worst.0, worst.1);
            assert!(
                worst.0 < 3e-6,
                "gelu_{name}: rel {:e} at {:e}",
                worst.0,
                worst.1
            );
            assert_eq!(f(f32::INFINITY), f32::INFINITY);
            assert!(f(f32::NEG_INFINITY).is_nan());
            assert!(f(f32::NAN).is_nan());
            assert_eq!(f(-1e4).to_bits(), 0x8000_0000, "gelu_{name}(-1e4) = -0");
            assert_eq!(f(1e4), 1e4);
            assert_eq!(f(0.0).to_bits(), 0);
        }
    }
}
