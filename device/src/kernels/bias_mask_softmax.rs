//! Fused `P = softmax(S + bias[type(w)] + mask[slot(w)])` over the last
//! axis of attention scores [windows, heads, 144, 144] (f16 in, f16 out).
//!
//! Numerics: `z = (f32(S) + f32(mask)) + f32(bias)` in f32 (as
//! [`super::bias_mask_add()`], never rounded to f16), `m = max z` (f32),
//! `e = exp(z - m)` ([`crate::math::exp_hw`]: the hardware `exp2`, one
//! instruction), `sum = sum e` in f32 (per lane over its 24 elements in
//! four chains, then over the lanes of the row in one fixed order, so every
//! lane of a row holds the same sum), `P = f16(e * (1 / sum))`:
//! probabilities are rounded once. A row with NaN, +inf, or only -inf gives
//! NaN everywhere (as `torch.softmax`). A table entry out of range (the
//! host validates tables when they are built, so this does not happen
//! through the API) makes its rows NaN instead of trapping: a trap check
//! would put a branch between the table reads and the data loads.
//!
//! Layout: a row of 144 halves = 18 16-byte vectors is owned by a group of
//! [`SOFTMAX_LANES`] = 6 consecutive lanes, lane `p` holding vectors
//! `6 k + p` (k < 3), so each load instruction of a group covers 96
//! contiguous bytes of its row. A wave32 holds 5 rows (2 lanes idle), a
//! wave64 10 rows (4 idle): a [`SOFTMAX_BLOCK`]-thread workgroup is
//! [`SOFTMAX_ROWS`] = 40 rows either way. The alternatives measured on the
//! H200: two lanes per row sent one 32-byte sector per row
//! and load to L2 and was L2-request-bound; a fully coalesced workgroup
//! layout with row reductions through workgroup memory spent its time at
//! barriers. Here the reductions are three lane exchanges
//! (one butterfly, then indexed reads of the three pairs) and no barrier.
//! Rows past the end are predicated off but join the exchanges. Scores are
//! read once and probabilities written once; the output may be the input
//! (a row's reads precede its writes and a row belongs to one lane group).
use crate::gpu;
use crate::math::exp_hw;
use crate::vec::{load8, store8};
use wavefuse_shared::geometry::{SOFTMAX_BLOCK, SOFTMAX_LANES, SOFTMAX_ROWS, SOFTMAX_T};

/// Vectors per lane.
const NV: usize = (SOFTMAX_T / 8 / SOFTMAX_LANES) as usize;
const _: () = assert!(NV == 3);
const _: () = assert!(SOFTMAX_BLOCK / 32 * (32 / SOFTMAX_LANES) == SOFTMAX_ROWS);
const _: () = assert!(SOFTMAX_BLOCK / 64 * (64 / SOFTMAX_LANES) == SOFTMAX_ROWS);

/// Butterfly over lane pairs, then `f` of the three pair values read from
/// the group's lanes 0, 2 and 4 in that order (the same order on every lane
/// of the group). `base` is the group's first lane; lanes outside any group
/// pass their own lane as `base` (they read only themselves).
#[inline(always)]
fn group6(v: f32, base: u32, f: impl Fn(f32, f32) -> f32) -> f32 {
    let v = f(v, gpu::shfl_xor_f32(v, 1));
    let a = gpu::shfl_idx_f32(v, base);
    let b = gpu::shfl_idx_f32(v, base + 2);
    let c = gpu::shfl_idx_f32(v, base + 4);
    f(f(a, b), c)
}

/// One row per group of six lanes.
///
/// # Safety
/// `s`, `p` valid for `rows * 144` halves (they may be equal, not partly
/// overlapping), `bias` for `n_types * heads * 144 * 144`, `mask` for
/// `n_slots * 144 * 144` when `MASK`; tables for `rows / (heads * 144)`
/// entries; all 16-byte aligned; `rows` a multiple of `heads * 144`;
/// launched with [`SOFTMAX_BLOCK`] threads.
#[inline(always)]
#[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
pub unsafe fn bias_mask_softmax<const MASK: bool>(
    s: *const u16,
    p: *mut u16,
    bias: *const u16,
    mask: *const u16,
    types: *const i32,
    slots: *const i32,
    rows: u32,
    heads: u32,
    n_types: u32,
    n_slots: u32,
) {
    const T: usize = SOFTMAX_T as usize;
    let tid = gpu::thread_id();
    let ws = gpu::wave_size();
    let lane = tid % ws;
    let groups = ws / SOFTMAX_LANES;
    let g = lane / SOFTMAX_LANES;
    let in_group = g < groups;
    // Idle lanes (past the last whole group) still join the exchanges; their
    // `base` keeps base + 4 inside the wave, and their results are unused.
    let base = if in_group {
        g * SOFTMAX_LANES
    } else {
        lane.min(ws - 5)
    };
    let q = (lane - g * SOFTMAX_LANES) as usize;
    let row = gpu::block_id() * SOFTMAX_ROWS + tid / ws * groups + g;
    let active = in_group && row < rows;
    let mut z = [[0.0f32; 8]; NV];
    if active {
        let so = row as usize * T;
        let mut sv = [[0.0f32; 8]; NV];
        crate::unroll!(k in [0, 1, 2] {
            // SAFETY: the row lies in the scores (caller).
            sv[k] = unsafe { load8(s.add(so + (6 * k + q) * 8)) };
        });
        // No branch may separate the score loads from the table reads and
        // the bias / mask loads (LLVM sinks loads past a trap check, and
        // the loads then wait for the table): entries are clamped for the
        // addresses and an out-of-range entry turns the row into NaN.
        let tile = row / SOFTMAX_T;
        let i = (row % SOFTMAX_T) as usize;
        // heads >= 1 (host); max(1) keeps the division free of a trap branch.
        let hd = core::num::NonZeroU32::MIN.saturating_add(heads.saturating_sub(1));
        let (w, h) = (tile / hd, (tile % hd) as usize);
        // SAFETY: w < windows (caller: tables hold one entry per window).
        let (ty, sl) = unsafe {
            let ty = *types.add(w as usize) as u32;
            let sl = if MASK {
                *slots.add(w as usize) as u32
            } else {
                0
            };
            (ty, sl)
        };
        let bad = ty >= n_types || (MASK && sl >= n_slots);
        let (ty, sl) = (ty.min(n_types - 1), sl.min(n_slots.max(1) - 1));
        let bo = ((ty as usize * heads as usize + h) * T + i) * T;
        let mo = (sl as usize * T + i) * T;
        crate::unroll!(k in [0, 1, 2] {
            let c = (6 * k + q) * 8;
            // SAFETY: the clamped entries address rows inside the tensors.
            let (bv, mv) = unsafe {
                (
                    load8(bias.add(bo + c)),
                    if MASK { load8(mask.add(mo + c)) } else { [0.0; 8] },
                )
            };
            z[k] = super::bias_mask_add::sum3::<MASK>(sv[k], bv, mv);
            if bad {
                z[k][0] = f32::NAN;
            }
        });
    }
    // Max (`f32::max` ignores NaN, one instruction): NaN needs no care here,
    // it reaches every output through the sum.
    let mut mv = [f32::NEG_INFINITY; 4];
    for k in 0..NV {
        for e in 0..8 {
            mv[e % 4] = mv[e % 4].max(z[k][e]);
        }
    }
    let m = group6((mv[0].max(mv[1])).max(mv[2].max(mv[3])), base, f32::max);
    let mut sv = [0.0f32; 4];
    crate::unroll!(k in [0, 1, 2] {
        for e in 0..8 {
            z[k][e] = exp_hw(z[k][e] - m);
            sv[e % 4] += z[k][e];
        }
    });
    let sum = group6((sv[0] + sv[1]) + (sv[2] + sv[3]), base, |a, b| a + b);
    let r = 1.0 / sum;
    if active {
        let so = row as usize * T;
        crate::unroll!(k in [0, 1, 2] {
            let mut o = [0.0f32; 8];
            for e in 0..8 {
                o[e] = z[k][e] * r;
            }
            // SAFETY: as for the loads.
            unsafe { store8(p.add(so + (6 * k + q) * 8), o) };
        });
    }
}

kernel! {
    /// softmax(S + earth bias + shift mask) over rows of 144.
    pub fn wf_bias_mask_softmax_144(s: *const u16, p: *mut u16, bias: *const u16, mask: *const u16, types: *const i32, slots: *const i32, rows: u32, heads: u32, n_types: u32, n_slots: u32) {
        // SAFETY: extents, alignment and tables checked by the host API.
        unsafe { bias_mask_softmax::<true>(s, p, bias, mask, types, slots, rows, heads, n_types, n_slots) }
    }
}

kernel! {
    /// softmax(S + earth bias) over rows of 144 (no mask).
    pub fn wf_bias_mask_softmax_nomask_144(s: *const u16, p: *mut u16, bias: *const u16, mask: *const u16, types: *const i32, slots: *const i32, rows: u32, heads: u32, n_types: u32, n_slots: u32) {
        // SAFETY: extents, alignment and tables checked by the host API.
        unsafe { bias_mask_softmax::<false>(s, p, bias, mask, types, slots, rows, heads, n_types, n_slots) }
    }
}
