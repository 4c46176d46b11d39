//! Residual add + LayerNorm in one pass: `r = f16(residual + branch)` is
//! written to `residual_out`, and `y = LayerNorm(r)` is computed from the
//! ROUNDED `r` (exactly what the unfused PyTorch path does), never from the
//! unrounded f32 sum.
//!
//! The f16 sum is rounded once to nearest-even: `add.rn.f16x2` on NVIDIA;
//! elsewhere an f32 add of the two widened halves rounded to f16, the same
//! correctly rounded sum (f32 carries 24 >= 2 * 11 + 2 significand bits,
//! so the double rounding is harmless).
//!
//! Layout: [`wavefuse_shared::AddLnShape`]: 32 lanes per row, one 16-byte
//! vector per lane per step (at width 192, 8 of the 32 lanes load nothing),
//! `R` rows per 32-lane group, `B`-thread workgroups. All `R` rows' loads
//! are issued before any arithmetic waits on them, the rounded sums stay
//! packed f16x2 until they are widened for the statistics, and the rows'
//! reductions run interleaved. Only the loads and stores are conditional;
//! everything between them is straight-line code. Each element is read
//! once and `residual_out` / `y` written once, by the lane that read it,
//! so `residual_out == residual` (in place) is race-free. Rows past the end
//! and steps past the row are predicated off; their lanes still join the
//! group reductions.
use super::layer_norm::{Refine, RowIo, in_row, normalise_store};
use super::ln_affine::{OnePass, precise_stats};
use super::ln_stats::{
    Mean, RowSums, group_sum_f64_n, lane_sq_sum, lane_sums, mean_of, offsets, stats_of,
};
use crate::gpu;
use crate::vec::{V8, add_h2, load8_bits, store8_bits, widen2};
use wavefuse_shared::AddLnShape;

/// `R` rows' residual add + LayerNorm per 32-lane group.
///
/// # Safety
/// Launched in `B`-thread workgroups. `residual`, `branch`, `residual_out`,
/// `y` valid for `rows * W` halves, `gamma`/`beta` for `W` halves when
/// `AFFINE`; all 16-byte aligned. `residual_out` may equal `residual`; no
/// other overlap with the outputs.
#[inline(always)]
#[allow(clippy::needless_range_loop, clippy::too_many_arguments)] // constant indices keep the rows in registers
pub unsafe fn add_layer_norm<
    const W: usize,
    const L: u32,
    const NV: usize,
    const R: usize,
    const B: u32,
    const AFFINE: bool,
>(
    residual: *const u16,
    branch: *const u16,
    residual_out: *mut u16,
    y: *mut u16,
    gamma: *const u16,
    beta: *const u16,
    rows: u64,
    eps: f32,
) {
    let tid = gpu::thread_id();
    // SAFETY: the host launches B-thread workgroups (AddLnShape::block);
    // with B = L (one warp) the group index folds to the block index.
    unsafe { core::hint::assert_unchecked(tid < B) };
    let lane = (tid % L) as usize;
    let first = (u64::from(gpu::block_id()) * u64::from(B / L) + u64::from(tid / L)) * R as u64;
    let off = |row: u64, k: usize| row as usize * W + (k * L as usize + lane) * 8;

    let mut v = [[[0.0f32; 8]; NV]; R];
    let mut sum_bits = [[V8([0; 4]); NV]; R];
    for r in 0..R {
        let row = first + r as u64;
        for k in 0..NV {
            let (a, b) = if row < rows && in_row::<W, L, NV>(k, lane) {
                // SAFETY: row < rows and the vector lies inside the row.
                unsafe {
                    (
                        load8_bits(residual.add(off(row, k))),
                        load8_bits(branch.add(off(row, k))),
                    )
                }
            } else {
                (V8([0; 4]), V8([0; 4]))
            };
            for j in 0..4 {
                // The f16 sum, rounded once (masked steps: +0.0). LayerNorm
                // reads the rounded value; the residual is stored from the
                // same bits.
                let s = add_h2(a.0[j], b.0[j]);
                sum_bits[r][k].0[j] = s;
                let f = widen2(s);
                v[r][k][2 * j] = f[0];
                v[r][k][2 * j + 1] = f[1];
            }
        }
    }
    // Statistics as in `ln_stats::moments`, the rows' reductions interleaved.
    let mut sums = [0.0f64; R];
    let mut sqs = [0.0f64; R];
    for r in 0..R {
        let p = lane_sums::<NV, AFFINE>(&v[r]);
        sums[r] = p.sum;
        sqs[r] = p.sq;
    }
    // The residual goes out before the statistics: its packed sums then
    // need no registers across the reductions (the 384-wide kernel: 56
    // registers instead of 72, a workgroup more per SM). Storing it last
    // measured the same at 192 on the H200.
    for r in 0..R {
        let row = first + r as u64;
        for k in 0..NV {
            if row < rows && in_row::<W, L, NV>(k, lane) {
                // SAFETY: as for the loads. In place, this lane already
                // read this vector.
                unsafe { store8_bits(residual_out.add(off(row, k)), sum_bits[r][k]) };
            }
        }
    }
    let sums = group_sum_f64_n::<L, R>(sums);
    let sqs = if AFFINE {
        group_sum_f64_n::<L, R>(sqs)
    } else {
        sqs
    };
    let mut mean = [Mean { hi: 0.0, lo: 0.0 }; R];
    let mut pst = [None; R];
    let mut need = false;
    for r in 0..R {
        mean[r] = mean_of::<W>(sums[r]);
        offsets::<W, L, NV>(&mut v[r], mean[r].hi, lane);
        if AFFINE {
            let rs = RowSums {
                sum: sums[r],
                sq: sqs[r],
            };
            pst[r] = precise_stats::<W>(rs, mean[r], eps);
            need |= pst[r].is_none();
        }
    }
    // The f32 sum of squares only where a row of the wave needs it (the
    // affine entries' other rows have row-precise statistics).
    let mut sq = [0.0f32; R];
    if !AFFINE || gpu::wave_any(need) {
        for r in 0..R {
            sq[r] = lane_sq_sum(&v[r]);
        }
        sq = gpu::group_sum_n::<L, R>(sq);
    }
    const { assert!(R <= 2) };
    // Unrolled by hand: the affine refinement's loops over set bits left
    // this loop rolled, and `v` went to local memory.
    crate::unroll!(r in [0, 1] {
        if r < R {
        let row = first + r as u64;
        let (st, precise) = match pst[r] {
            Some(p) => (p, true),
            None => (stats_of::<W>(sq[r], mean[r], eps), false),
        };
        // The LayerNorm's input row is the stored sum: this lane's own
        // stores are all a refinement reads back.
        let io = RowIo {
            x: residual_out.cast_const().wrapping_add(row as usize * W),
            y: y.wrapping_add(row as usize * W),
            active: row < rows,
        };
        let rs = RowSums {
            sum: sums[r],
            sq: sqs[r],
        };
        // SAFETY: where active, row < rows: the rows lie inside
        // residual_out and y; affine vectors in bounds.
        unsafe { normalise_store::<W, L, NV, AFFINE>(&v[r], st, rs, precise, OnePass::UNKNOWN, io, gamma, beta, eps, lane, refine(W)) };
        }
    });
}

/// Where the affine entry of width `w` runs its refinement
/// (`normalise_store`'s `refine`): as a call in the 192-wide one, which
/// the NVIDIA build holds to 32 registers
/// ([`wavefuse_shared::ADD_LN_AFFINE_192_MIN_BLOCKS_SM`]). At 384 and 768
/// the inline tiers fit the entries' budgets as they are, with the sums in
/// registers (parked in workgroup memory, they measured the same on the
/// H200).
const fn refine(w: usize) -> Refine {
    if w == 192 {
        Refine::Call
    } else {
        Refine::Inline
    }
}

/// The launch shape of one width in this build (see [`AddLnShape`]).
const fn shape(width: usize, affine: bool) -> AddLnShape {
    match AddLnShape::for_entry(width, gpu::TARGET, affine) {
        Some(s) => s,
        None => panic!("add_layer_norm: width without a launch shape"),
    }
}
const S192: AddLnShape = shape(192, false);
const S384: AddLnShape = shape(384, false);
const S768: AddLnShape = shape(768, false);
const A192: AddLnShape = shape(192, true);
const A384: AddLnShape = shape(384, true);
const A768: AddLnShape = shape(768, true);

macro_rules! add_layer_norm_entries {
    ($($plain:ident, $affine:ident: W = $w:literal, S = $s:ident, A = $a:ident, NV = $nv:literal;)*) => {$(
        kernel! {
            #[allow(clippy::too_many_arguments)]
            /// Residual add + LayerNorm without affine, fixed width.
            pub fn $plain(residual: *const u16, branch: *const u16, residual_out: *mut u16, y: *mut u16, gamma: *const u16, beta: *const u16, rows: u64, eps: f32) {
                // SAFETY: extents and launch shape checked by the host API.
                unsafe { add_layer_norm::<$w, 32, $nv, { $s.rows_per_group }, { $s.block }, false>(residual, branch, residual_out, y, gamma, beta, rows, eps) }
            }
        }
        kernel! {
            #[allow(clippy::too_many_arguments)]
            /// Residual add + LayerNorm with f16 gamma and beta, fixed width.
            pub fn $affine(residual: *const u16, branch: *const u16, residual_out: *mut u16, y: *mut u16, gamma: *const u16, beta: *const u16, rows: u64, eps: f32) {
                // SAFETY: extents and launch shape checked by the host API.
                unsafe { add_layer_norm::<$w, 32, $nv, { $a.rows_per_group }, { $a.block }, true>(residual, branch, residual_out, y, gamma, beta, rows, eps) }
            }
        }
    )*};
}

// NV must equal the shape's layout.vecs_per_lane (and 32 its lanes); the
// `layouts_match_shared` test below keeps them in step.
add_layer_norm_entries! {
    wf_add_layer_norm_192, wf_add_layer_norm_affine_192: W = 192, S = S192, A = A192, NV = 1;
    wf_add_layer_norm_384, wf_add_layer_norm_affine_384: W = 384, S = S384, A = A384, NV = 2;
    wf_add_layer_norm_768, wf_add_layer_norm_affine_768: W = 768, S = S768, A = A768, NV = 3;
}

#[cfg(test)]
mod tests {
    use wavefuse_shared::RowLayout;

    #[test]
    fn layouts_match_shared() {
        for (w, s, nv) in [
            (192, super::S192, 1),
            (384, super::S384, 2),
            (768, super::S768, 3),
            (192, super::A192, 1),
            (384, super::A384, 2),
            (768, super::A768, 3),
        ] {
            assert_eq!(Some(s.layout), RowLayout::wide(w));
            assert_eq!((s.layout.lanes, s.layout.vecs_per_lane), (32, nv));
        }
    }
}
