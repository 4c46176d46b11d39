//! Fused `P = softmax(S + bias[type(w)] + mask[slot(w)])` over the last
//! axis of attention scores [windows, heads, 144, 144] (f16 in, f16 out).
//!
//! Numerics: `z = (f32(S) + f32(mask)) + f32(bias)` in f32 (as
//! [`super::bias_mask_add`], never rounded to f16), `m = max z` (f32),
//! `e = exp(z - m)` ([`crate::math::exp_hw`]: the hardware `exp2`, one
//! instruction, so the kernel stays memory-bound), `sum = sum e` in f32
//! (per thread over its 8 elements, then the 18 partials of the row in
//! order), `P = f16(e * (1 / sum))`: probabilities are rounded once. A row
//! with NaN, +inf, or only -inf gives NaN everywhere (as `torch.softmax`).
//!
//! Layout: rows of 144 halves are 18 16-byte vectors, and consecutive rows
//! are contiguous in the scores, the bias and the mask. A workgroup of
//! [`SOFTMAX_BLOCK`] = 576 = 18 x 32 threads owns [`SOFTMAX_ROWS`] = 96
//! consecutive rows; thread `t` takes vectors `t + 576 j` (j < 3) of that
//! chunk, so every load and store instruction of a wave covers contiguous
//! memory (fully used 128-byte lines: the earlier two-lanes-per-row layout
//! sent one 32-byte sector per row to L2 and was L2-request-bound at 57% of
//! a copy). Because 576 is a multiple of 18, thread `t` always holds vector
//! `t % 18` of rows `t / 18 + 32 j`: row reductions are two steps through
//! workgroup memory (per-thread partials, then one reducing thread per row
//! over its 18 partials; 7.5 KiB, [`SOFTMAX_SHARED_BYTES`]). Rows may span
//! (window, head) tiles: each row looks up its own bias type and mask slot.
//! Rows past the end are predicated off but join every barrier. Scores are
//! read once and probabilities written once; the output may be the input
//! (every read of a row precedes the barriers that precede its writes, and
//! a row belongs to one workgroup).
use crate::gpu;
use crate::math::exp_hw;
use crate::vec::{load8, store8};

/// Row length with a kernel.
pub const SOFTMAX_T: u32 = 144;
/// Threads per workgroup (9 waves of 64, 18 warps of 32).
pub const SOFTMAX_BLOCK: u32 = 576;
/// Vectors (of 8 halves) per thread.
const NV: usize = 3;
/// Vectors per row.
const VPR: u32 = SOFTMAX_T / 8;
/// Rows per workgroup.
pub const SOFTMAX_ROWS: u32 = SOFTMAX_BLOCK * NV as u32 / VPR;
/// Rows per vector slot `j` (rows `t / 18 + ROWS_J * j`).
const ROWS_J: u32 = SOFTMAX_BLOCK / VPR;
/// Workgroup memory: `NV * 576` partials and two per-row values.
pub const SOFTMAX_SHARED_BYTES: u32 = (NV as u32 * SOFTMAX_BLOCK + 2 * SOFTMAX_ROWS) * 4;
const _: () =
    assert!(SOFTMAX_BLOCK.is_multiple_of(VPR) && SOFTMAX_BLOCK.is_multiple_of(64) && NV == 3);
const _: () = assert!(SOFTMAX_ROWS <= SOFTMAX_BLOCK && VPR.is_multiple_of(2));

/// The row value (max, or 1 / sum) for row `r` of the workgroup from its
/// 18 partials: `part[j * 576 + 18 q ..][..18]` for `r = q + 32 j`, read
/// as pairs (8-byte aligned; on NVIDIA each half-warp then hits 32
/// distinct banks).
///
/// # Safety
/// `part` valid for `NV * 576` floats, 8-byte aligned; `r < SOFTMAX_ROWS`.
#[inline(always)]
unsafe fn row_partials(part: *const f32, r: u32) -> [f32; VPR as usize] {
    let base = (r / ROWS_J * SOFTMAX_BLOCK + r % ROWS_J * VPR) as usize;
    let mut v = [0.0f32; VPR as usize];
    for k in 0..VPR as usize / 2 {
        // SAFETY: base + 2k + 1 < NV * 576 and base is even (caller).
        let pair = unsafe { core::ptr::read(part.add(base + 2 * k).cast::<[f32; 2]>()) };
        v[2 * k] = pair[0];
        v[2 * k + 1] = pair[1];
    }
    v
}

/// One workgroup per [`SOFTMAX_ROWS`] rows.
///
/// # Safety
/// `s`, `p` valid for `rows * 144` halves (they may be equal, not partly
/// overlapping), `bias` for `n_types * heads * 144 * 144`, `mask` for
/// `n_slots * 144 * 144` when `MASK`; tables for `rows / (heads * 144)`
/// entries; all 16-byte aligned; `rows` a multiple of `heads * 144`;
/// launched with [`SOFTMAX_BLOCK`] threads and [`SOFTMAX_SHARED_BYTES`] of
/// workgroup memory.
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
    let part = gpu::workgroup_mem::<f32>();
    // SAFETY: the workgroup memory holds NV * 576 + 2 * 96 floats (launch).
    let (rmax, rinv) = unsafe {
        let r = part.add(NV * SOFTMAX_BLOCK as usize);
        (r, r.add(SOFTMAX_ROWS as usize))
    };
    let tid = gpu::thread_id();
    let col = ((tid % VPR) * 8) as usize;
    let first = gpu::block_id() * SOFTMAX_ROWS + tid / VPR;
    let hd = crate::math::divisor(heads);
    let mut z = [[0.0f32; 8]; NV];
    let mut live = [false; NV];
    crate::unroll!(j in [0, 1, 2] {
        let row = first + ROWS_J * j as u32;
        live[j] = row < rows;
        if live[j] {
            let tile = row / SOFTMAX_T;
            let i = (row % SOFTMAX_T) as usize;
            let (w, h) = (tile / hd, (tile % hd) as usize);
            // SAFETY: w < windows.
            let (ty, sl) =
                unsafe { super::bias_mask_add::lookup::<MASK>(types, slots, w, n_types, n_slots) };
            let so = row as usize * T + col;
            let bo = ((ty as usize * heads as usize + h) * T + i) * T + col;
            let mo = (sl as usize * T + i) * T + col;
            // SAFETY: the rows lie in their tensors (caller).
            let (sv, bv, mv) = unsafe {
                (
                    load8(s.add(so)),
                    load8(bias.add(bo)),
                    if MASK { load8(mask.add(mo)) } else { [0.0; 8] },
                )
            };
            z[j] = super::bias_mask_add::sum3::<MASK>(sv, bv, mv);
        }
    });
    // Max: NaN needs no care here, it reaches every output through the sum.
    crate::unroll!(j in [0, 1, 2] {
        let mut m = z[j][0];
        for e in 1..8 {
            m = if z[j][e] > m { z[j][e] } else { m };
        }
        // SAFETY: j * 576 + tid < NV * 576.
        unsafe { *part.add(j * SOFTMAX_BLOCK as usize + tid as usize) = m };
    });
    gpu::barrier();
    if tid < SOFTMAX_ROWS {
        // SAFETY: tid < SOFTMAX_ROWS.
        let v = unsafe { row_partials(part, tid) };
        let mut m = v[0];
        for x in &v[1..] {
            m = if *x > m { *x } else { m };
        }
        // SAFETY: tid < SOFTMAX_ROWS.
        unsafe { *rmax.add(tid as usize) = m };
    }
    gpu::barrier();
    crate::unroll!(j in [0, 1, 2] {
        // SAFETY: the row index is below SOFTMAX_ROWS.
        let m = unsafe { *rmax.add((tid / VPR + ROWS_J * j as u32) as usize) };
        let mut sum = 0.0f32;
        for e in 0..8 {
            z[j][e] = exp_hw(z[j][e] - m);
            sum += z[j][e];
        }
        // SAFETY: as for the max partials (read before the last barrier).
        unsafe { *part.add(j * SOFTMAX_BLOCK as usize + tid as usize) = sum };
    });
    gpu::barrier();
    if tid < SOFTMAX_ROWS {
        // SAFETY: tid < SOFTMAX_ROWS.
        let v = unsafe { row_partials(part, tid) };
        let mut sum = 0.0f32;
        for x in v {
            sum += x;
        }
        // SAFETY: tid < SOFTMAX_ROWS.
        unsafe { *rinv.add(tid as usize) = 1.0 / sum };
    }
    gpu::barrier();
    crate::unroll!(j in [0, 1, 2] {
        if live[j] {
            // SAFETY: the row index is below SOFTMAX_ROWS.
            let r = unsafe { *rinv.add((tid / VPR + ROWS_J * j as u32) as usize) };
            let mut o = [0.0f32; 8];
            for e in 0..8 {
                o[e] = z[j][e] * r;
            }
            let row = first + ROWS_J * j as u32;
            // SAFETY: as for the loads.
            unsafe { store8(p.add(row as usize * T + col), o) };
        }
    });
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
