//! Affine LayerNorm outputs within one f16 ulp of the exact
//! `y = o gamma + beta` for every finite f16 row and every finite `gamma`,
//! `beta`, also where the affine map cancels (`|y|` far below `|o gamma|`).
//!
//! The fast output `z = fma(o_hat, gamma, beta)` ([`super::ln_stats`],
//! step 5) is within one ulp unless it cancels: `o_hat` carries
//! `2^-20.3 |o| + 2^-29` of error, which `gamma` scales into `y`. So each
//! output goes through at most three tiers (u = 2^-24; `ulp16` the f16
//! spacing, half of it at least `max(2^-25, 2^-12 |y|)`):
//!
//! 1. **Filter**. Rows whose one-pass f64 variance is precise (`K <=
//!    2^20`, `K` below) get that variance's `rstd` ([`precise_stats`],
//!    straight from the row sums, before any f32 sum of squares):
//!    then `o_hat` is within `a |o| + c`, `a = 3.1 u`, `c = 2^-36.2` (the
//!    offset's, the `rstd`'s and the fused multiply-add's roundings;
//!    `|mu| rstd <= sqrt(K) <= 2^10` bounds the mean's part). For those
//!    rows the fast loop tests the packed f16 outputs `z_h` as stored
//!    ([`gpu::below_scaled_h2`], exact comparisons: one `fma.rn.f16x2` per
//!    two outputs and constant on NVIDIA): `z_h` is kept when `|z_h| >=
//!    KH_BETA |beta|` and `|z_h| >= KH_GAMMA |gamma|` ([`KH_BETA`] =
//!    2^-9.73, [`KH_GAMMA`] = 2^-19.36). Then, as `z` is rounded once,
//!    `|gamma o_hat| <= |z| (1 + u) + |beta|`, and `|z| <= |z_h| / (1 -
//!    2^-11) + 2^-25`, so `E1 = |gamma| (a |o| + c) <= Q |z_h| + 2^-47`
//!    with `Q = a (1 + 2^-10) + a / KH_BETA + c / KH_GAMMA = 2^-12.56`.
//!    Where `z_h` is normal, `|z_h| <= (1 + 2^-11) (|y| + |z - y|)` and
//!    `|z - y| <= E1 + u |y|` give `|z - y| < 2^-12.56 |y|`; where it is
//!    not (`|z_h| < 2^-14`), `|z - y| < 2^-26.5`. Either is below half an
//!    ulp16(y). The test needs no `o`: near a cancellation `|beta|` is
//!    `|o gamma|` within `|z|`, so it flags what a test on `|o gamma|`
//!    with the same constant would.
//!
//!    Other rows (a large offset, NaN, Inf) test every output in f32 from
//!    reloaded inputs ([`care_bits`], [`needs_care`]): with the fast
//!    path's own `rstd`, `|z - y| <= E1 + u |y|` with `E1 = |gamma|
//!    (2^-20.28 |o_hat| + 2^-28.98)`. If `|gamma| (K1 |o_hat| + K2) <= |z|`
//!    (the constants round `2^-7.78` and `2^-16.48` up, covering the
//!    test's own f32 roundings), then `E1 <= 2^-12.5 |z|`, `|y| >= |z| (1
//!    - 2^-12.5) / (1 + u)` and `|z - y| < 2^-12 |y|`: `z` is kept.
//! 2. **Row-precise** ([`Precise`], per lane, only for a lane with a
//!    flagged output): from the exact row sum `S` and the f64 sum of
//!    squares `S2` ([`super::ln_stats::RowSums`]): `var = S2/W - (S/W)^2`,
//!    whose relative error is `2^-47.8 K + 2^-51.9` with `K = (var +
//!    mu^2) / (var + eps)` (the cancellation of the one-pass variance),
//!    `rstd` by two Newton steps in f64 from an f32 seed within `2^-20.6`
//!    of it, and `o = D c` with `D = W x - S` exact in f64 (21-bit
//!    products, sums of multiples of 2^-24 below 2^26) and `c = rstd / W`.
//!    Then `|y2 - y| <= Ea = |gamma o2| (K + 1) 2^-48.7` (the `K` read back
//!    as `S2/W rstd^2`, trusted only when Newton converged and `K <=
//!    2^36`); `y2` is kept when `Ea <= 2^-12.5 |y2|`, or `Ea <= 2^-25.2`
//!    and `|y2| <= 2^-12`: in both cases `|f32(y2) - y| < half an
//!    ulp16(y)`. The root, `K` and the convergence test are tier 1's own
//!    ([`one_pass`], seeded by the f32 `rsqrt` of the variance, within
//!    `2^-22.5`) where they wait in workgroup memory
//!    ([`Precise::of_one_pass`]), and are formed again from the sums
//!    (seeded by the fast path's `rstd`) where the sums wait in registers
//!    ([`Precise::of`]).
//! 3. **Exact variance** ([`exact_factor`], the whole wave when any lane
//!    needs it): `Q = sum D_i^2` in f64 over the row (each `D_i` exact, 29
//!    roundings at most: `2^-48.1 Q`), `var = Q / W^3`, the same Newton
//!    steps: `o` within `2^-48.2 |o|`, so `|y3 - y| <= 2^-48.1 |gamma o| +
//!    2^-53 |y3|`. `|o| <= sqrt(W - 1)` and `|gamma| <= 65504` give
//!    `|gamma o| <= 2^20.8`: at most `2^-27.3` absolute, below half an
//!    ulp16 of any `y`. Rows with a large offset and a small spread (`K`
//!    up to 2^34) end here when an output cancels.
//!
//! So every affine output is within one ulp16 of the exact value (an
//! `f32` within half an ulp16 of `y` rounds to an f16 within one ulp16 of
//! `y`, see [`super::ln_stats`]).
//!
//! Cost: the fast loop's test is three instructions per two outputs on
//! NVIDIA (two `fma.rn.f16x2` and an OR), and its sign bits become the
//! lane's bit mask while the words are in registers ([`compact_flags`]:
//! two `prmt` and four shifts or masks per eight outputs). The fast
//! outputs are stored at once; a lane with flagged outputs then redoes
//! them one at a time ([`refine`], scalar reloads and
//! stores that overwrite the fast ones in the same thread's program
//! order; `x` and `y` never overlap). Tier 3 is entered by the whole wave
//! ([`gpu::wave_any`]) because it reduces over the row group. NaN rows
//! flag no output (every comparison is false on NaN) and infinite ones
//! none that matters: their outputs are NaN or infinite as before.
//! The row-precise statistics need only the f64 sums, so a wave whose
//! rows all have them skips the f32 sum of squares and its reduction
//! ([`super::ln_stats::moments`]); the affine LayerNorm and
//! LayerNorm+gather entries run in small workgroups
//! ([`wavefuse_shared::LN_AFFINE_BLOCK`]) so that these tiers' registers
//! cost fewer resident warps, and park the row sum and tier 1's root and
//! `K` in workgroup memory across the fast loop
//! (`layer_norm::Refine::Parked`: nothing of tiers 2 and 3 then lives in
//! the fast path's registers, and tier 2 has no Newton steps of its
//! own); the 192-wide
//! add+LayerNorm runs tiers 2 and 3 as a call on NVIDIA
//! (`layer_norm::refine_row`), its fast path held to 32 registers.
//! Measured on the H200 against the kernels without the exact path, on
//! random data: -2% to +1% for the affine LayerNorm, +2% to +4% for
//! LayerNorm+gather (tier 1's test in the fast loop), +1% to +2% for the
//! 192-wide add+LayerNorm, within 1% for the other affine entries.
use crate::gpu;
use crate::math;
use crate::vec::load8;

use super::layer_norm::{RowIo, in_row};
use super::ln_stats::{Mean, RowSums, Stats};

/// Tier 1's f32 constants for the fast path's own `rstd` (module docs):
/// `2^-7.78` and `2^-16.48` rounded up by 6% and 10%.
const K1: f32 = 4.82e-3;
const K2: f32 = 1.2e-5;
/// Rows up to this `K` get the row-precise `rstd` and the f16 test in
/// tier 1.
const K_FAST: f64 = 1048576.0;

/// Tier 1's constants in the fast loop for rows with the row-precise
/// `rstd`, as f16 bits ([`gpu::below_scaled_h2`] on the packed outputs):
/// an output `z_h` is kept when `|z_h| >= KH_BETA |beta|` and `|z_h| >=
/// KH_GAMMA |gamma|` (module docs). `0x14d6` = 1.18065e-3 (2^-9.726),
/// with `0x0019` = 25 2^-24 (2^-19.356) giving `Q = 2^-12.56`, 4.5%
/// inside the `2^-12.5` the bound needs.
pub const KH_BETA: u16 = 0x14d6;
/// See [`KH_BETA`].
pub const KH_GAMMA: u16 = 0x0019;

/// Tier 1 in f32, for rows without the row-precise `rstd`: whether `z =
/// fma(o_hat, g, b)` may be more than half an ulp16 from `o g + b`
/// (module docs). False on NaN.
#[inline(always)]
pub fn needs_care(o_hat: f32, g: f32, z: f32) -> bool {
    math::abs(g) * math::fma(math::abs(o_hat), K1, K2) > math::abs(z)
}

/// Tier 1's statistics for one row when they are row-precise: where the
/// one-pass f64 variance is precise enough (`K <= 2^20`: relative error
/// below `2^-28`), `rstd` is that variance's, rounded once to f32, and
/// `o_hat` is within `3.1 u |o| + 2^-36.2` of `o` (module docs): the fast
/// loop's f16 test applies. `None` for other rows (a large offset, NaN,
/// Inf), which take the f32 two-pass statistics and [`care_bits`]. Needs
/// only the row sums: the f32 sum of squares of the offsets is formed only
/// where a row of the wave returns `None`. Newton starts from the f32
/// `rsqrt` of the one-pass variance itself, so it converges to the same
/// f64 root as from any close seed; a variance that cancelled badly has a
/// large `K` and is refused by the `K` test, not by convergence.
#[inline(always)]
pub fn precise_stats<const W: usize>(sums: RowSums, m: Mean, eps: f32) -> Option<Stats> {
    let v = one_pass_var::<W>(sums, eps);
    let (r, k, converged) = newton_rstd::<W>(v, sums.sq, math::rsqrt(v as f32));
    if converged && k <= K_FAST {
        Some(Stats::of(r as f32, m))
    } else {
        None
    }
}

/// The root and `K` [`precise_stats`] forms, for tier 2
/// ([`Precise::of_one_pass`]): the same operations on the same values, so
/// that where both are called the compiler forms them once.
#[inline(always)]
pub fn one_pass<const W: usize>(sums: RowSums, eps: f32) -> OnePass {
    let v = one_pass_var::<W>(sums, eps);
    let (r, k, converged) = newton_rstd::<W>(v, sums.sq, math::rsqrt(v as f32));
    OnePass {
        r,
        k: if converged { k } else { f64::NAN },
    }
}

/// The f64 root of a row's one-pass variance and that variance's `K`
/// (module docs, tier 2), as [`precise_stats`] formed them: `r` from two
/// Newton steps, `k = S2/W r^2`, NaN where Newton did not converge within
/// 2^-30 (so that no test on it passes).
#[derive(Clone, Copy)]
pub struct OnePass {
    /// The root, `(S2/W - (S/W)^2 + eps)^(-1/2)` in f64.
    pub r: f64,
    /// `K`, or NaN.
    pub k: f64,
}

impl OnePass {
    /// Not formed (the entries without the affine refinement).
    pub const UNKNOWN: OnePass = OnePass {
        r: f64::NAN,
        k: f64::NAN,
    };
}

/// Tier 2's thresholds (module docs), rounded in the safe direction:
/// `Ea` is scaled by at least 2^-48.7, compared with at most `2^-12.5 |y2|`
/// or 2^-25.2 (for `|y2| <= 2^-12`); Newton counts as converged within
/// 2^-30, and `K` is trusted up to 2^36.
const ERR_SCALE: f64 = 2.19e-15;
const REL: f64 = 1.7263e-4;
const ABS: f64 = 2.59e-8;
const SMALL: f64 = 2.44140625e-4;
const CONVERGED: f64 = 9.313225746154785e-10;
const K_MAX: f64 = 68719476736.0;

/// `|v|` (core's `f64::abs` is not in every toolchain this crate builds
/// with).
#[inline(always)]
fn abs64(v: f64) -> f64 {
    f64::from_bits(v.to_bits() & !(1 << 63))
}

/// `rstd` in f64: two Newton steps for `v^(-1/2)` from the f32 `r0`.
#[inline(always)]
fn rsqrt_newton(r0: f32, v: f64) -> f64 {
    let mut r = f64::from(r0);
    for _ in 0..2 {
        r *= 1.5 - 0.5 * v * r * r;
    }
    r
}

/// Tier 2's row factors (module docs): `c = rstd / W` and `Ea / |gamma
/// o2|`, or not `valid`.
#[derive(Clone, Copy)]
pub struct Precise {
    c: f64,
    err: f64,
    valid: bool,
}

impl Precise {
    /// From the row's sums, the fast path's f32 `rstd` and `eps`.
    #[inline(always)]
    pub fn of<const W: usize>(sums: RowSums, rstd: f32, eps: f32) -> Self {
        let (r, k, converged) = one_pass_rstd::<W>(sums, rstd, eps);
        Precise {
            c: r * (1.0 / W as f64),
            err: (k + 1.0) * ERR_SCALE,
            valid: converged && k <= K_MAX,
        }
    }

    /// From tier 1's root and `K` ([`OnePass`]): the same factors as
    /// [`Precise::of`] with Newton seeded by the `rsqrt` of the variance
    /// in f32 (within `2^-22.5` of the root) rather than by the fast
    /// path's `rstd` (within `2^-20.6`): two steps from either converge to
    /// the root to f64 precision, and the convergence and `K` tests are the
    /// same ones. No f64 work left for the rare path but `c`.
    #[inline(always)]
    pub fn of_one_pass<const W: usize>(p: OnePass) -> Self {
        Precise {
            c: p.r * (1.0 / W as f64),
            err: (p.k + 1.0) * ERR_SCALE,
            valid: p.k <= K_MAX,
        }
    }
}

/// The one-pass f64 variance's `rstd` (module docs, tier 2): `var = S2/W -
/// (S/W)^2`, two Newton steps from the f32 `rstd`, `K = S2/W rstd^2`, and
/// whether Newton converged to within 2^-30 (`K` is meaningful only then).
#[inline(always)]
fn one_pass_rstd<const W: usize>(sums: RowSums, rstd: f32, eps: f32) -> (f64, f64, bool) {
    newton_rstd::<W>(one_pass_var::<W>(sums, eps), sums.sq, rstd)
}

/// [`one_pass_rstd`] from the variance plus `eps` (`v`), the sum of
/// squares `sq` and the f32 seed.
#[inline(always)]
fn newton_rstd<const W: usize>(v: f64, sq: f64, seed: f32) -> (f64, f64, bool) {
    let r = rsqrt_newton(seed, v);
    let k = sq * (1.0 / W as f64) * r * r;
    let conv = gpu::fma_f64(v * r, r, -1.0);
    (r, k, abs64(conv) <= CONVERGED)
}

/// The one-pass f64 variance plus `eps`: `S2/W - (S/W)^2 + eps`.
#[inline(always)]
fn one_pass_var<const W: usize>(sums: RowSums, eps: f32) -> f64 {
    let inv_w = 1.0 / W as f64;
    let mu = sums.sum * inv_w;
    let m2 = sums.sq * inv_w;
    (m2 - mu * mu) + f64::from(eps)
}

/// The halves at offset `i` of an input row and of gamma and beta, as f32.
///
/// # Safety
/// All three valid at `i`.
#[inline(always)]
unsafe fn inputs_at(x: *const u16, g: *const u16, b: *const u16, i: usize) -> [f32; 3] {
    // SAFETY: caller contract.
    unsafe {
        [
            gpu::h2f(x.add(i).read()),
            gpu::h2f(g.add(i).read()),
            gpu::h2f(b.add(i).read()),
        ]
    }
}

/// The offset in the row of output `j` of a lane (bit `j` of the masks
/// below: vector `j / 8` of the lane's [`RowLayout`](wavefuse_shared::RowLayout)
/// steps, half `j % 8`).
#[inline(always)]
fn offset_of<const L: u32>(j: u32, lane: usize) -> usize {
    ((j / 8) as usize * L as usize + lane) * 8 + (j % 8) as usize
}

/// The eight flags of one vector step's test words `d` (sign bits 15 and
/// 31 of each) in one word: output `m` (`m < 4`) at bit `8 m + 7`, output
/// `4 + m` at bit `8 m + 6`, every other bit clear. Shifted right by `2 k`
/// for step `k`, the steps' flags do not overlap ([`expand_flags`]).
/// Byte moves and masks: a few instructions per step, no branch.
#[inline(always)]
pub fn compact_flags(d: [u32; 4]) -> u32 {
    let (lo, hi) = (gpu::odd_bytes(d[0], d[1]), gpu::odd_bytes(d[2], d[3]));
    (lo & 0x8080_8080) | ((hi >> 1) & 0x4040_4040)
}

/// [`compact_flags`] of the steps, shifted and ORed, as one bit per output
/// at `8 k + i` (step `k`, half `i`: the layout [`refine`] reads,
/// `offset_of`).
#[inline(always)]
pub fn expand_flags(mut c: u32) -> u32 {
    let mut bits = 0u32;
    while c != 0 {
        let p = c.trailing_zeros();
        c &= c - 1;
        let (m, b) = (p / 8, 7 - p % 8);
        bits |= 1 << (8 * (b / 2) + m + 4 * (b % 2));
    }
    bits
}

/// Tier 1 in f32 for the lane's outputs of a row without the row-precise
/// `rstd` ([`precise_stats`]), from its reloaded inputs (L1): one bit per
/// output (`8 k + i`: vector step `k`, half `i`) that [`needs_care`].
///
/// # Safety
/// `io.x`, `g`, `b` valid for the row's `W` halves.
#[inline(always)]
#[allow(clippy::needless_range_loop)]
pub unsafe fn care_bits<const W: usize, const L: u32, const NV: usize>(
    io: RowIo,
    g: *const u16,
    b: *const u16,
    lane: usize,
    st: Stats,
) -> u32 {
    let mut bits = 0u32;
    for s in 0..NV {
        if in_row::<W, L, NV>(s, lane) {
            let col = (s * L as usize + lane) * 8;
            // SAFETY: the vector lies inside the row (caller contract).
            let (x, g, b) = unsafe { (load8(io.x.add(col)), load8(g.add(col)), load8(b.add(col))) };
            for i in 0..8 {
                let o = math::fma(x[i] - st.mean.hi, st.rstd, st.shift);
                let z = math::fma(o, g[i], b[i]);
                bits |= u32::from(needs_care(o, g[i], z)) << (8 * s + i);
            }
        }
    }
    bits
}

/// Tier 2 for the lane's outputs `bits` (bit `j`: vector `j / 8`, half
/// `j % 8`) of the row `io`, whose fast outputs are already stored: each
/// one whose tier-2 bound holds is overwritten with tier 2's value, the
/// others are left to tier 3 and returned. `sum` is the row's exact sum,
/// `p` its factors ([`Precise::of`] or [`Precise::of_one_pass`]). One
/// output at a time through a loop over the set bits, with scalar reloads
/// (L1) and stores: the rare path stays within the fast path's registers.
///
/// # Safety
/// `io.x`, `io.y`, `g`, `b` valid for the row's `W` halves.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub unsafe fn refine<const W: usize, const L: u32>(
    mut bits: u32,
    io: RowIo,
    g: *const u16,
    b: *const u16,
    lane: usize,
    sum: f64,
    p: Precise,
) -> u32 {
    let mut hard = 0u32;
    while bits != 0 {
        let j = bits.trailing_zeros();
        bits &= bits - 1;
        let at = offset_of::<L>(j, lane);
        // SAFETY: the output lies inside the row (caller contract).
        let [x, g, b] = unsafe { inputs_at(io.x, g, b, at) };
        let d = W as f64 * f64::from(x) - sum;
        let go = d * p.c * f64::from(g);
        let y = go + f64::from(b);
        let ea = abs64(go) * p.err;
        if p.valid && (ea <= REL * abs64(y) || (ea <= ABS && abs64(y) <= SMALL)) {
            // SAFETY: as for the loads.
            unsafe { io.y.add(at).write(gpu::f2h(y as f32)) };
        } else {
            hard |= 1 << j;
        }
    }
    hard
}

/// Tier 3's `c = rstd / W` from the exact deviations of the row: every lane
/// of the wave must call it (group reduction); `x_row` is read only where
/// `active`.
///
/// # Safety
/// Where `active`, `x_row` valid for `W` halves, 16-byte aligned.
#[inline(always)]
#[allow(clippy::needless_range_loop)]
pub unsafe fn exact_factor<const W: usize, const L: u32, const NV: usize>(
    x_row: *const u16,
    sum: f64,
    rstd: f32,
    eps: f32,
    lane: usize,
    active: bool,
) -> f64 {
    let mut q = 0.0f64;
    if active {
        for k in 0..NV {
            if in_row::<W, L, NV>(k, lane) {
                // SAFETY: the vector lies inside the row (caller contract).
                let x = unsafe { load8(x_row.add((k * L as usize + lane) * 8)) };
                for i in 0..8 {
                    let d = W as f64 * f64::from(x[i]) - sum;
                    q = gpu::fma_f64(d, d, q);
                }
            }
        }
    }
    let [q] = super::ln_stats::group_sum_f64_n::<L, 1>([q]);
    let w = W as f64;
    let v = q * (1.0 / (w * w * w)) + f64::from(eps);
    rsqrt_newton(rstd, v) * (1.0 / w)
}

/// Tier 3 for the lane's outputs `bits` (see [`refine`]), `c` from
/// [`exact_factor`].
///
/// # Safety
/// As for [`refine`].
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub unsafe fn exact<const W: usize, const L: u32>(
    mut bits: u32,
    io: RowIo,
    g: *const u16,
    b: *const u16,
    lane: usize,
    sum: f64,
    c: f64,
) {
    while bits != 0 {
        let j = bits.trailing_zeros();
        bits &= bits - 1;
        let at = offset_of::<L>(j, lane);
        // SAFETY: the output lies inside the row (caller contract).
        let [x, g, b] = unsafe { inputs_at(io.x, g, b, at) };
        let d = W as f64 * f64::from(x) - sum;
        let y = d * c * f64::from(g) + f64::from(b);
        // SAFETY: as for the loads.
        unsafe { io.y.add(at).write(gpu::f2h(y as f32)) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::vec;
    use std::vec::Vec;

    /// The f64 sums of a row of halves, as the kernels form them.
    fn sums_of(x: &[f32]) -> RowSums {
        let (mut sum, mut sq) = (0.0f64, 0.0f64);
        for &v in x {
            let v = f64::from(v);
            sum += v;
            sq = v.mul_add(v, sq);
        }
        RowSums { sum, sq }
    }

    #[test]
    fn precise_stats_are_precise_or_refused() {
        // Rows of 192 halves with offsets from 0 to 60000 and spreads from
        // 2^-6 to 2^6, plus sparse outliers: where the exact K is at most
        // 2^19 the row-precise rstd must be within 2^-23 of the exact one
        // (one f32 rounding of a converged f64 root); where it is at least
        // 2^21 the row must be refused. Between the two either is fine.
        const W: usize = 192;
        let eps = 1e-5f32;
        let mut s = 0x9e37_79b9u32;
        let mut rnd = || {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            f64::from(s) / f64::from(u32::MAX)
        };
        let (mut kept, mut refused) = (0, 0);
        let mut tier2 = [0; 2];
        for case in 0..3000 {
            let offset = [0.0, 1.0, 100.0, 2048.0, 30000.0, 60000.0][case % 6];
            let spread = 2f64.powi((case / 6 % 13) as i32 - 6);
            let outliers = case % 5 == 0;
            let x: Vec<f32> = (0..W)
                .map(|i| {
                    let d = if outliers {
                        if i % 61 == 0 { spread } else { 0.0 }
                    } else {
                        (rnd() - 0.5) * 2.0 * spread
                    };
                    gpu::h2f(gpu::f2h((offset + d) as f32))
                })
                .collect();
            let sums = sums_of(&x);
            let m = super::super::ln_stats::mean_of::<W>(sums.sum);
            let mu = x.iter().map(|&v| f64::from(v)).sum::<f64>() / W as f64;
            let var = x.iter().map(|&v| (f64::from(v) - mu).powi(2)).sum::<f64>() / W as f64;
            let k = (var + mu * mu) / (var + f64::from(eps));
            let exact = 1.0 / (var + f64::from(eps)).sqrt();
            let (st1, one_pass) = (precise_stats::<W>(sums, m, eps), one_pass::<W>(sums, eps));
            // Tier 2's factors from tier 1's root and K agree with those
            // formed again from a seed within 2^-21 of the root.
            let seed = (exact * (1.0 + 2f64.powi(-21))) as f32;
            let (a, b) = (
                Precise::of_one_pass::<W>(one_pass),
                Precise::of::<W>(sums, seed, eps),
            );
            assert_eq!(a.valid, b.valid, "case {case}: K = 2^{}", k.log2());
            tier2[usize::from(a.valid)] += 1;
            if a.valid {
                assert!((a.c / b.c - 1.0).abs() <= 2f64.powi(-50), "case {case}: c");
                assert!(
                    (a.err / b.err - 1.0).abs() <= 2f64.powi(-40),
                    "case {case}: err"
                );
            }
            match st1 {
                Some(st) => {
                    assert!(k < 2f64.powi(21), "case {case}: K = 2^{} kept", k.log2());
                    let rel = (f64::from(st.rstd) - exact).abs() / exact;
                    assert!(
                        rel <= 2f64.powi(-23),
                        "case {case}: rstd off by 2^{}",
                        rel.log2()
                    );
                    assert_eq!(st.mean.hi, m.hi);
                    kept += 1;
                }
                None => {
                    assert!(k > 2f64.powi(19), "case {case}: K = 2^{} refused", k.log2());
                    refused += 1;
                }
            }
        }
        // Both kinds were drawn.
        assert!(
            kept > 1000 && refused > 100,
            "kept {kept} refused {refused}"
        );
        assert!(tier2[0] > 100 && tier2[1] > 1000, "tier 2 {tier2:?}");
        // A constant row with eps 0 has no rstd; NaN and Inf sums none.
        let c = sums_of(&[3.0; W]);
        assert!(precise_stats::<W>(c, super::super::ln_stats::mean_of::<W>(c.sum), 0.0).is_none());
        for bad in [f64::NAN, f64::INFINITY] {
            let b = RowSums { sum: bad, sq: bad };
            let m = super::super::ln_stats::mean_of::<W>(bad);
            assert!(precise_stats::<W>(b, m, eps).is_none());
        }
    }

    #[test]
    fn f16_filter_constants_meet_the_bound() {
        // Q = a (1 + 2^-10) + a / KH_BETA + c / KH_GAMMA <= 2^-12.5 (module
        // docs), a = 3.1 u, c = 2^-36.2.
        let (a, c) = (3.1 * 2f64.powi(-24), 2f64.powf(-36.2));
        let kb = f64::from(gpu::h2f(KH_BETA));
        let kg = f64::from(gpu::h2f(KH_GAMMA));
        let q = a * (1.0 + 2f64.powi(-10)) + a / kb + c / kg;
        assert!(q <= 2f64.powf(-12.5) * 0.96, "Q = 2^{}", q.log2());
    }

    #[test]
    fn below_scaled_h2_is_the_exact_comparison() {
        // Every sign, zeros, subnormals, normals, the largest half, Inf and
        // NaN, against |z| < k |x| in f64 (both products exact there).
        let mut vals: Vec<u16> = vec![0x0000, 0x0001, 0x0019, 0x03ff, 0x0400, 0x14d6, 0x3c00];
        vals.extend([0x7bff, 0x7c00, 0x7e00]);
        let mut s = 0x2545_f491u32;
        for _ in 0..200 {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            vals.push((s & 0x7fff) as u16);
        }
        let all: Vec<u16> = vals.iter().flat_map(|&v| [v, v | 0x8000]).collect();
        for k in [KH_BETA, KH_GAMMA] {
            let kf = f64::from(gpu::h2f(k));
            for &z in &all {
                for &x in &all {
                    let (zf, xf) = (f64::from(gpu::h2f(z)), f64::from(gpu::h2f(x)));
                    let want = zf.abs() < kf * xf.abs();
                    let w = gpu::below_scaled_h2(
                        u32::from(z) | (u32::from(x) << 16),
                        u32::from(x) | (u32::from(z) << 16),
                        k,
                    );
                    let want_hi = xf.abs() < kf * zf.abs();
                    assert_eq!((w >> 15) & 1 == 1, want, "z {z:#06x} x {x:#06x} k {k:#06x}");
                    assert_eq!(w >> 31 == 1, want_hi, "z {x:#06x} x {z:#06x} k {k:#06x}");
                }
            }
        }
    }

    #[test]
    fn flag_bits_reach_their_outputs() {
        // Every single flag (step k, half i) and all of them at once come
        // back as bit 8 k + i; the words' other bits are ignored.
        for k in 0..4 {
            for i in 0..8 {
                let mut d = [0x7fff_7fffu32; 4];
                d[i / 2] |= 1 << (15 + 16 * (i % 2));
                let c = compact_flags(d) >> (2 * k);
                assert_eq!(expand_flags(c), 1 << (8 * k + i), "k {k} i {i}");
            }
        }
        let all = (0..4).fold(0, |c, k| c | (compact_flags([u32::MAX; 4]) >> (2 * k)));
        assert_eq!(expand_flags(all), u32::MAX);
    }

    #[test]
    fn offsets_follow_the_row_layout() {
        // Lane 3 of 8: vector k covers halves (8k + 3) * 8 ..
        assert_eq!(offset_of::<8>(0, 3), 24);
        assert_eq!(offset_of::<8>(7, 3), 31);
        assert_eq!(offset_of::<8>(8, 3), 88);
        assert_eq!(offset_of::<8>(23, 3), (2 * 8 + 3) * 8 + 7);
    }
}
