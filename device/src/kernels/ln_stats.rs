//! Row statistics of the LayerNorm family, and why every output is within
//! one f16 ulp of the exact LayerNorm of the same f16 row.
//!
//! # The computation
//!
//! For a row `x_1..x_W` of f16 values (`W` = 192, 384 or 768):
//! 1. `S = sum x_i` in **f64**, per lane and then across the row group
//!    ([`lane_sums`], [`group_sum_f64_n`]). Every f16 value is a
//!    multiple of 2^-24 below 2^16 in magnitude, so every partial sum of up
//!    to 768 of them is a multiple of 2^-24 below 2^26: at most 50
//!    significant bits, which f64 (53) holds. Every addition is exact, in
//!    any order, so `S` is the exact row sum on every target and layout.
//! 2. `mu = fl64(S * fl64(1/W))`, split into two f32 ([`Mean`]):
//!    `hi = f32(mu)`, `lo = f32(mu - hi)` ([`mean_of`]). A constant row
//!    (`S = W c`) gives `mu = c` exactly (`fl64(1/W) = (1/W)(1 + t)` with
//!    `|t| < 2^-53`, and `c` has 11 significant bits, so `c (1 + t)` is
//!    within half an f64 ulp of `c`; the tests below check every f16 `c`),
//!    so `hi = c`, `lo = 0`.
//! 3. `t_i = fl(x_i - hi)` in f32 ([`offsets`]); the deviations are
//!    `t_i - lo`, never formed one by one.
//! 4. `q = sum t_i^2` in f32 (squares fused into the adds, tree order:
//!    [`lane_sq_sum`], then `gpu::group_sum`; the affine entries form it
//!    only for rows without row-precise statistics, see
//!    [`super::ln_affine`]), variance
//!    `fma(-lo, lo, q * fl(1/W))` (the offsets' mean is `lo`),
//!    `rstd = rsqrt(variance + eps)`, `shift = fl(-lo * rstd)` ([`stats_of`]).
//! 5. `o_i = fma(t_i, rstd, shift)`; with affine `fma(o_i, gamma_i,
//!    beta_i)`; one rounding to f16.
//!
//! Constant rows give `t_i = 0`, `q = 0`, `shift = 0`: output exactly 0 (or
//! `beta`). Against the single-f32 mean this replaced, the per-element
//! cost is one f32 -> f64 conversion (the f64 add takes the f32 add's
//! place); the f64 group reduction costs one more lane exchange per
//! butterfly step, and the per-row scalar work a few f64 operations.
//!
//! # Error bound (u = 2^-24, first order, constants rounded up)
//!
//! Let `mu`, `sigma^2` be the exact mean and biased variance of the row,
//! `d = x - mu`, `R = 1/sqrt(sigma^2 + eps)`, `o = d R`.
//!
//! - Mean: `|mu_f64 - mu| <= 2^-52 |mu|` (two f64 roundings) and
//!   `|hi + lo - mu_f64| <= u |lo| <= 2^-48 |mu|`: `hi + lo` is within
//!   `2^-47.9 |mu|` of `mu`.
//! - Offsets: `fl(x - hi)` is exact or within `u |x - hi|`, and
//!   `|x - hi| <= |d| + |lo| + 2^-47.9 |mu|`, so `t - lo` is within
//!   `u |d| + 2^-46.9 |mu|` of `d`.
//! - Offset against spread: in a row that is not constant, let `M = max|x|`
//!   at `x_a` and `x_b != x_a`. Then `W sigma^2 >= (x_a - x_b)^2 / 2`, and
//!   `|x_a - x_b| >= M 2^-12` (if `x_b` has the other sign or `|x_b| <= M/2`
//!   the gap is at least `M/2`; otherwise both lie in `[M/2, M]`, where f16
//!   values are at least `M 2^-12` apart). So `|mu| <= M <= 2^12 sqrt(2W)
//!   sigma <= 2^17.3 sigma` (W = 768), and `|mu| R <= 2^17.3`: the
//!   absolute part of the deviation error, `2^-46.9 |mu|`, is at most
//!   `2^-29.6` once scaled by `R`. (A single f32 mean can be off by
//!   `2^-24 |mu|`, `2^-6.7` after scaling: the 19-ulp rows of mean 2048 and
//!   sigma 1. Subtracting one of the row's own elements before an f32 sum
//!   does not bound it either: tests/layer_norm.rs keeps a row where that
//!   leaves an output near 0 several ulps off, 7 to 19 depending on the
//!   order of the f32 sum.)
//! - Variance: each `t^2` passes through at most 11 roundings (square,
//!   `NV - 1` fused steps, 3 tree levels, `log2 L <= 5` group levels):
//!   relative `11 u`; `t` itself adds `2 u`, the scale by `fl(1/W)` `2 u`,
//!   the fused `- lo^2` and `+ eps` `2 u`. `(mu - hi)^2` and `lo^2` are
//!   below `2^-13.4 sigma^2` and cancel to `2^-36 sigma^2`, so
//!   `variance + eps` is within `17.1 u` (relative). `rstd`: IEEE `1 / sqrt`
//!   (gfx9, the emulator) adds `2 u`, NVIDIA's `rsqrt.approx.f32` (relative
//!   error below 2^-22.9 = 2.14 u) as much: `|rstd - R| <= 10.7 u R`.
//! - Output: `fma(t, rstd, shift)` rounds once, `shift` carries
//!   `u |lo| R <= 2^-30.7`: `|o_hat - o| <= 12.8 u |o| + 2^-29 =
//!   2^-20.3 |o| + 2^-29`.
//! - One f16 ulp: if `|z - y| <= ulp16(y) / 2` (`ulp16(y)` the f16 spacing
//!   at `y`, 2^-24 below the normal range), then `f16(z)` is within one
//!   `ulp16(y)` of `y`. Half an `ulp16(y)` is at least `max(2^-25,
//!   2^-12 |y|)`, and `2^-20.3 |o| + 2^-29` is below 7% of that. So
//!   **without affine, every output is within one f16 ulp of the exact
//!   value for every finite f16 row**, on every target.
//!
//! # Affine: `y = o gamma + beta`
//!
//! `fma(o_hat, gamma, beta)` rounds once: its error is `|gamma| |o_hat - o|
//! + u |y|`, within one ulp of `y` unless the affine map cancels (`|y|` far
//! below `|o gamma|`): even a correctly rounded f32 `o` carries
//! `2^-24 |o gamma|` into `y`, a whole f16 ulp when `|o gamma| = 1` and `y`
//! is near 0. [`super::ln_affine`] finds those outputs and redoes them in
//! f64 from the exact row sum, so that every affine output is within one
//! ulp too. Constant rows give exactly `beta` (`o = 0`).
//!
//! Rows holding NaN or Inf: `S` is NaN or infinite, `lo` NaN, and the whole
//! row NaN (as PyTorch).
use crate::gpu;
use crate::math;

use super::layer_norm::in_row;
use super::ln_affine::OnePass;

/// The row's exact sum and, for the affine outputs' refinement
/// ([`super::ln_affine`]), its sum of squares in f64.
#[derive(Clone, Copy)]
pub struct RowSums {
    /// `S = sum x_i`, exact.
    pub sum: f64,
    /// `sum x_i^2` in f64 (each square exact, the additions rounded); 0
    /// when not asked for.
    pub sq: f64,
}

/// The lane's share of the row sum, exact in f64 (see the module docs),
/// and with `SQ` of the sum of squares. Steps outside the row must hold
/// zeros.
///
/// One accumulator per sum: every addition to `sum` is exact, so the order
/// cannot change it, and a single chain keeps two registers live where
/// eight partial sums kept sixteen. Those sixteen cost the affine
/// LayerNorm and the 384-wide add+LayerNorm a workgroup per SM (52 and 72
/// registers) and about 1% of their speed on the H200. A square of an f16 is exact in f64 (22 bits), so the
/// fused multiply-add rounds only the sum.
#[inline(always)]
#[allow(clippy::needless_range_loop)] // constant indices keep the row in registers
pub fn lane_sums<const NV: usize, const SQ: bool>(v: &[[f32; 8]; NV]) -> RowSums {
    let mut s = 0.0f64;
    let mut q = 0.0f64;
    for k in 0..NV {
        for i in 0..8 {
            let x = f64::from(v[k][i]);
            s += x;
            if SQ {
                q = gpu::fma_f64(x, x, q);
            }
        }
    }
    RowSums { sum: s, sq: q }
}

/// [`lane_sums`] summed over the row group of `L` lanes.
#[inline(always)]
pub fn row_sums<const L: u32, const NV: usize, const SQ: bool>(v: &[[f32; 8]; NV]) -> RowSums {
    let p = lane_sums::<NV, SQ>(v);
    if SQ {
        let [sum, sq] = group_sum_f64_n::<L, 2>([p.sum, p.sq]);
        RowSums { sum, sq }
    } else {
        let [sum] = group_sum_f64_n::<L, 1>([p.sum]);
        RowSums { sum, sq: 0.0 }
    }
}

/// Sums of `N` f64 values over aligned groups of `L` consecutive lanes
/// (each value crosses lanes as two 32-bit exchanges), one exchange of
/// each per butterfly step so that their latencies overlap. Used on exact
/// sums only, so the order of additions cannot change the result.
#[inline(always)]
#[allow(clippy::needless_range_loop)]
pub fn group_sum_f64_n<const L: u32, const N: usize>(mut v: [f64; N]) -> [f64; N] {
    let mut mask = 1;
    while mask < L {
        let mut o = [0.0f64; N];
        for r in 0..N {
            let b = v[r].to_bits();
            let lo = gpu::shfl_xor_u32(b as u32, mask);
            let hi = gpu::shfl_xor_u32((b >> 32) as u32, mask);
            o[r] = f64::from_bits((u64::from(hi) << 32) | u64::from(lo));
        }
        for r in 0..N {
            v[r] += o[r];
        }
        mask <<= 1;
    }
    v
}

/// The row mean as an unevaluated sum of two f32, `hi + lo`, within
/// `2^-47.9 |mean|` of the exact mean.
#[derive(Clone, Copy)]
pub struct Mean {
    /// The mean rounded to f32.
    pub hi: f32,
    /// What `hi` leaves out, rounded to f32.
    pub lo: f32,
}

/// The mean from the exact row sum (module docs, step 2).
#[inline(always)]
pub fn mean_of<const W: usize>(sum: f64) -> Mean {
    let mu = sum * (1.0 / W as f64);
    let hi = mu as f32;
    Mean {
        hi,
        lo: (mu - f64::from(hi)) as f32,
    }
}

/// Replaces the lane's row values `x` by `t = x - hi`, their offsets
/// from the f32 part of the mean, and steps outside the row ([`in_row`])
/// by zeros (a select, not a branch). The deviations are `t - lo`; the
/// variance (`rstd_of`) and the output ([`Stats::shift`]) take `lo` into
/// account without a second subtraction per element.
#[inline(always)]
#[allow(clippy::needless_range_loop)]
pub fn offsets<const W: usize, const L: u32, const NV: usize>(
    v: &mut [[f32; 8]; NV],
    hi: f32,
    lane: usize,
) {
    for k in 0..NV {
        let inside = in_row::<W, L, NV>(k, lane);
        for i in 0..8 {
            let t = v[k][i] - hi;
            v[k][i] = if inside { t } else { 0.0 };
        }
    }
}

/// The lane's share of `sum t^2` ([`offsets`]): squares fused into the adds
/// per position, then a tree over the eight positions.
#[inline(always)]
#[allow(clippy::needless_range_loop)]
pub fn lane_sq_sum<const NV: usize>(d: &[[f32; 8]; NV]) -> f32 {
    let mut q = [0.0f32; 8];
    for i in 0..8 {
        q[i] = d[0][i] * d[0][i];
    }
    for k in 1..NV {
        for i in 0..8 {
            q[i] = math::fma(d[k][i], d[k][i], q[i]);
        }
    }
    math::tree_sum8(q)
}

/// What a row's output needs: `o = fma(t, rstd, shift)` is `(t - lo) * rstd`
/// with `shift = -lo * rstd`.
#[derive(Clone, Copy)]
pub struct Stats {
    /// `1 / sqrt(biased variance + eps)`.
    pub rstd: f32,
    /// `-lo * rstd`.
    pub shift: f32,
    /// The mean's parts ([`Mean`]): the affine refinement recomputes the
    /// offsets and refines `rstd` from them.
    pub mean: Mean,
}

impl Stats {
    /// The statistics of a row with mean `mean` and `rstd`.
    #[inline(always)]
    pub fn of(rstd: f32, mean: Mean) -> Self {
        Stats {
            rstd,
            shift: -mean.lo * rstd,
            mean,
        }
    }
}

/// The row's [`Stats`] from `q = sum t^2` and the mean: the biased variance
/// is `q / W - lo^2` (the offsets' mean is `lo`; `lo^2` is below
/// `2^-13 sigma^2`, so nothing cancels), `rstd` from [`math::rsqrt`]
/// (IEEE on gfx9 and in the emulator, the hardware approximation on
/// NVIDIA; both within the module docs' bound).
#[inline(always)]
pub fn stats_of<const W: usize>(q: f32, m: Mean, eps: f32) -> Stats {
    let var = math::fma(-m.lo, m.lo, q * (1.0 / W as f32));
    Stats::of(math::rsqrt(var + eps), m)
}

/// One row group's statistics: replaces `v` (the row, zeros outside it)
/// by its [`offsets`] and returns what the output needs, with `SQ` (the
/// affine outputs) also the sum of squares and whether the statistics are
/// row-precise ([`super::ln_affine::precise_stats`]; always false without
/// `SQ`) and, with `SQ`, tier 1's root and `K` ([`OnePass`], unknown
/// without). Every lane of the wave must call it (group reductions, and
/// with `SQ` a wave vote).
#[inline(always)]
pub fn moments<const W: usize, const L: u32, const NV: usize, const SQ: bool>(
    v: &mut [[f32; 8]; NV],
    lane: usize,
    eps: f32,
) -> (Stats, RowSums, bool, OnePass) {
    let sums = row_sums::<L, NV, SQ>(v);
    let m = mean_of::<W>(sums.sum);
    offsets::<W, L, NV>(v, m.hi, lane);
    if SQ {
        // The affine entries: row-precise statistics from the sums where
        // they hold (tier 1 of [`super::ln_affine`]); the f32 sum of
        // squares of the offsets only when a row of the wave lacks them
        // (the group reduction takes the whole wave).
        let p = super::ln_affine::precise_stats::<W>(sums, m, eps);
        let one_pass = super::ln_affine::one_pass::<W>(sums, eps);
        let q = if gpu::wave_any(p.is_none()) {
            gpu::group_sum::<L>(lane_sq_sum(v))
        } else {
            0.0
        };
        return match p {
            Some(p) => (p, sums, true, one_pass),
            None => (stats_of::<W>(q, m, eps), sums, false, one_pass),
        };
    }
    (
        stats_of::<W>(gpu::group_sum::<L>(lane_sq_sum(v)), m, eps),
        sums,
        false,
        OnePass::UNKNOWN,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constant_rows_have_an_exact_mean() {
        for bits in 0..=u16::MAX {
            let c = gpu::h2f(bits);
            if !c.is_finite() {
                continue;
            }
            for w in [192usize, 384, 768] {
                let s = f64::from(c) * w as f64;
                let m = match w {
                    192 => mean_of::<192>(s),
                    384 => mean_of::<384>(s),
                    _ => mean_of::<768>(s),
                };
                // -0.0 may come back as +0.0: the same deviations.
                assert!(m.hi == c && m.lo == 0.0, "W {w} c {c}: {} + {}", m.hi, m.lo);
            }
        }
    }

    #[test]
    fn sums_of_halves_are_exact_in_f64() {
        // The worst case for the bit count: the largest and the smallest
        // magnitudes in one row; the f64 sum must lose nothing.
        let big = gpu::h2f(0x7bff); // 65504
        let tiny = gpu::h2f(0x0001); // 2^-24
        let mut v = [[big; 8]; 3];
        v[2][7] = tiny;
        let s = lane_sums::<3, false>(&v).sum * 32.0; // 32 such lanes: 768 values
        assert_eq!(s - 32.0 * 23.0 * f64::from(big), 32.0 * f64::from(tiny));
    }

    #[test]
    fn special_sums_give_nan_rows() {
        for s in [f64::INFINITY, f64::NEG_INFINITY, f64::NAN] {
            let m = mean_of::<192>(s);
            let st = stats_of::<192>(1.0, m, 1e-5);
            assert!(st.shift.is_nan(), "sum {s}");
        }
    }
}
