//! Fused `P = softmax(S + bias[type(w)] + mask[slot(w)])` over the last
//! axis of attention scores [windows, heads, 144, 144] (f16 in, f16 out).
//!
//! Numerics: `z = (f32(S) + f32(mask)) + f32(bias)` in f32 (as
//! [`super::bias_mask_add`], never rounded to f16), `m = max z` (f32),
//! `e = exp(z - m)` ([`crate::math::exp_hw`]: the hardware `exp2`, one
//! instruction, so the kernel stays memory-bound), `sum = sum e` in f32 (each lane
//! keeps eight partial sums, one per vector slot, adds them pairwise, then
//! one butterfly step),
//! `P = f16(e * (1 / sum))`: probabilities are rounded once. A row with
//! NaN, +inf, or only -inf gives NaN everywhere (as `torch.softmax`).
//!
//! Layout: a row of 144 halves = 18 16-byte vectors is owned by a pair of
//! lanes, each holding 9 vectors (lane `l` takes vectors `2k + l`, so one
//! load instruction of the pair covers 32 contiguous bytes). 144 / 8 = 18
//! vectors split over 2 lanes leaves no idle lane and no predicated tail
//! (8 lanes x 3 would idle a quarter of them, 16 x 2 almost half), and the
//! reductions are a single exchange. [`SOFTMAX_BLOCK`] threads = 128 rows per
//! workgroup; rows past the end are predicated off but still join the
//! exchanges. Scores are read once and probabilities written once; the
//! output may be the input (every read of a row precedes its writes and a
//! row belongs to one lane pair).
use crate::gpu;
use crate::math::exp_hw;
use crate::vec::{load8, store8};

/// Row length with a kernel.
pub const SOFTMAX_T: u32 = 144;
/// Lanes per row.
pub const SOFTMAX_LANES: u32 = 2;
/// Threads per workgroup.
pub const SOFTMAX_BLOCK: u32 = 256;
/// Vectors per lane.
const NV: usize = (SOFTMAX_T / 8 / SOFTMAX_LANES) as usize;
// The `unroll!` lists below name 0..NV.
const _: () = assert!(NV == 9);

/// One row per lane pair.
///
/// # Safety
/// `s`, `p` valid for `rows * 144` halves (they may be equal, not partly
/// overlapping), `bias` for `n_types * heads * 144 * 144`, `mask` for
/// `n_slots * 144 * 144` when `MASK`; tables for `rows / (heads * 144)`
/// entries; all 16-byte aligned; `rows` a multiple of `heads * 144`.
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
    let lane = (tid % SOFTMAX_LANES) as usize;
    let row = gpu::block_id() * (SOFTMAX_BLOCK / SOFTMAX_LANES) + tid / SOFTMAX_LANES;
    let active = row < rows;
    let mut z = [[0.0f32; 8]; NV];
    if active {
        let tile = row / SOFTMAX_T;
        let i = (row % SOFTMAX_T) as usize;
        let hd = crate::math::divisor(heads);
        let (w, h) = (tile / hd, (tile % hd) as usize);
        // SAFETY: w < windows.
        let (ty, sl) =
            unsafe { super::bias_mask_add::lookup::<MASK>(types, slots, w, n_types, n_slots) };
        let so = row as usize * T;
        let bo = ((ty as usize * heads as usize + h) * T + i) * T;
        let mo = (sl as usize * T + i) * T;
        crate::unroll!(k in [0, 1, 2, 3, 4, 5, 6, 7, 8] {
            let c = (2 * k + lane) * 8;
            // SAFETY: the rows lie in their tensors (caller).
            let (sv, bv, mv) = unsafe {
                (
                    load8(s.add(so + c)),
                    load8(bias.add(bo + c)),
                    if MASK { load8(mask.add(mo + c)) } else { [0.0; 8] },
                )
            };
            z[k] = super::bias_mask_add::sum3::<MASK>(sv, bv, mv);
        });
    }
    // Max: NaN needs no care here, it reaches every output through the sum.
    // Eight independent max / sum chains per lane (one per vector slot)
    // instead of one chain of 72: the reductions are latency-bound
    // otherwise.
    let mut mv = [f32::NEG_INFINITY; 8];
    for k in 0..NV {
        for e in 0..8 {
            mv[e] = if z[k][e] > mv[e] { z[k][e] } else { mv[e] };
        }
    }
    let mut m = mv[0];
    for v in &mv[1..] {
        m = if *v > m { *v } else { m };
    }
    let m = gpu::group_max::<SOFTMAX_LANES>(m);
    let mut sv = [0.0f32; 8];
    crate::unroll!(k in [0, 1, 2, 3, 4, 5, 6, 7, 8] {
        for e in 0..8 {
            z[k][e] = exp_hw(z[k][e] - m);
            sv[e] += z[k][e];
        }
    });
    let sum = ((sv[0] + sv[1]) + (sv[2] + sv[3])) + ((sv[4] + sv[5]) + (sv[6] + sv[7]));
    let r = 1.0 / gpu::group_sum::<SOFTMAX_LANES>(sum);
    if active {
        let so = row as usize * T;
        crate::unroll!(k in [0, 1, 2, 3, 4, 5, 6, 7, 8] {
            let mut o = [0.0f32; 8];
            for e in 0..8 {
                o[e] = z[k][e] * r;
            }
            // SAFETY: as for the loads.
            unsafe { store8(p.add(so + (2 * k + lane) * 8), o) };
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
