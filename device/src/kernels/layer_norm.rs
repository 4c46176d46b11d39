//! LayerNorm over fixed-width f16 rows: f32 mean and biased variance (two
//! passes over registers, so no E[x^2] - mean^2 cancellation), output
//! `(x - mean) * rstd [* gamma + beta]` rounded once to f16, `rstd` from
//! [`math::rsqrt`] (hardware on NVIDIA: within one f16 ulp of the
//! emulator's result, bit-identical on gfx9 and between emulator modes).
//!
//! Layout: [`wavefuse_shared::RowLayout`] (a group of `L` lanes per row,
//! three 16-byte vectors per lane). Rows past the end are predicated off,
//! never returned early from: their lanes still join the group reductions.
use crate::gpu;
use crate::math;
use crate::vec::{load8, store8};
use wavefuse_shared::ROW_BLOCK;

/// This lane's index in its row group and the group's row: groups of `L`
/// consecutive lanes, [`ROW_BLOCK`]` / L` rows per workgroup (the
/// [`wavefuse_shared::RowLayout`] launch shape every row kernel shares).
#[inline(always)]
pub fn group_row<const L: u32>() -> (usize, u64) {
    let tid = gpu::thread_id();
    let lane = (tid % L) as usize;
    let row = u64::from(gpu::block_id()) * u64::from(ROW_BLOCK / L) + u64::from(tid / L);
    (lane, row)
}

/// One row group's LayerNorm.
///
/// # Safety
/// `x`, `y` valid for `rows * W` halves, `gamma`/`beta` for `W` halves when
/// `AFFINE`; all 16-byte aligned.
#[inline(always)]
#[allow(clippy::needless_range_loop)] // constant indices keep the row in registers
pub unsafe fn layer_norm<const W: usize, const L: u32, const NV: usize, const AFFINE: bool>(
    x: *const u16,
    y: *mut u16,
    gamma: *const u16,
    beta: *const u16,
    rows: u64,
    eps: f32,
) {
    let (lane, row) = group_row::<L>();
    let active = row < rows;
    let base = row as usize * W;

    let mut v = [[0.0f32; 8]; NV];
    if active {
        for k in 0..NV {
            if in_row::<W, L, NV>(k, lane) {
                // SAFETY: row < rows and the vector lies inside the row.
                v[k] = unsafe { load8(x.add(base + (k * L as usize + lane) * 8)) };
            }
        }
    }
    let (mean, rstd) = moments::<W, L, NV>(&v, lane, eps);
    if active {
        // SAFETY: row < rows; `y` row and affine vectors in bounds.
        unsafe {
            normalise_store::<W, L, NV, AFFINE>(&v, mean, rstd, y.add(base), gamma, beta, lane)
        };
    }
}

/// Writes `(v - mean) * rstd [* gamma + beta]` as halves: the lane's `NV`
/// vectors of one row (vector `k * L + lane`, those inside the row)
/// starting at `y_row`.
///
/// # Safety
/// `y_row` valid for `W` halves, `gamma`/`beta` for `W` halves when
/// `AFFINE`; all 16-byte aligned; `lane < L`.
#[inline(always)]
#[allow(clippy::needless_range_loop)]
pub unsafe fn normalise_store<const W: usize, const L: u32, const NV: usize, const AFFINE: bool>(
    v: &[[f32; 8]; NV],
    mean: f32,
    rstd: f32,
    y_row: *mut u16,
    gamma: *const u16,
    beta: *const u16,
    lane: usize,
) {
    for k in 0..NV {
        if !in_row::<W, L, NV>(k, lane) {
            continue;
        }
        let col = (k * L as usize + lane) * 8;
        let mut o = [0.0f32; 8];
        for i in 0..8 {
            o[i] = (v[k][i] - mean) * rstd;
        }
        if AFFINE {
            // SAFETY: col + 8 <= W.
            let (g, b) = unsafe { (load8(gamma.add(col)), load8(beta.add(col))) };
            for i in 0..8 {
                o[i] = o[i] * g[i] + b[i];
            }
        }
        // SAFETY: col + 8 <= W.
        unsafe { store8(y_row.add(col), o) };
    }
}

/// Whether vector step `k` of `lane` lies inside the row. Always true, and
/// known at compile time, when `L * NV` vectors cover the row exactly
/// ([`wavefuse_shared::RowLayout::for_width`]); the last step of a
/// [`wavefuse_shared::RowLayout::with_lanes`] row may leave some lanes out.
/// 32-bit arithmetic (one compare, where `usize` costs two on NVIDIA).
#[inline(always)]
pub fn in_row<const W: usize, const L: u32, const NV: usize>(k: usize, lane: usize) -> bool {
    L as usize * NV * 8 == W || (k as u32 * L + lane as u32) * 8 < W as u32
}

/// This lane's share of the row sum. Steps outside the row must hold zeros.
/// Starts from the first step, not from 0.0 (`x + 0.0` is not an identity
/// in IEEE arithmetic, so it would cost an add), and sums as a tree.
#[inline(always)]
#[allow(clippy::needless_range_loop)]
pub fn lane_sum<const NV: usize>(v: &[[f32; 8]; NV]) -> f32 {
    let mut s = v[0];
    for k in 1..NV {
        for i in 0..8 {
            s[i] += v[k][i];
        }
    }
    math::tree_sum8(s)
}

/// This lane's share of the squared deviations from `mean`; steps outside
/// the row ([`in_row`]) are left out by a select, not a branch.
#[inline(always)]
#[allow(clippy::needless_range_loop)]
pub fn lane_sq_dev<const W: usize, const L: u32, const NV: usize>(
    v: &[[f32; 8]; NV],
    mean: f32,
    lane: usize,
) -> f32 {
    let mut q = [0.0f32; 8];
    for k in 0..NV {
        let inside = in_row::<W, L, NV>(k, lane);
        for i in 0..8 {
            let d = v[k][i] - mean;
            let dd = if inside { d * d } else { 0.0 };
            q[i] = if k == 0 { dd } else { q[i] + dd };
        }
    }
    math::tree_sum8(q)
}

/// The mean from the row sum: [`math::div_const`] (exact for a constant
/// row, so its deviations are exactly 0).
#[inline(always)]
pub fn mean_of<const W: usize>(sum: f32) -> f32 {
    math::div_const(sum, W as f32)
}

/// `1 / sqrt(biased variance + eps)` from the sum of squared deviations
/// ([`math::rsqrt`]).
#[inline(always)]
pub fn rstd_of<const W: usize>(sq_dev_sum: f32, eps: f32) -> f32 {
    math::rsqrt(sq_dev_sum * (1.0 / W as f32) + eps)
}

/// Mean and 1/sqrt(biased variance + eps) of the group's row (f32).
/// Steps outside the row ([`in_row`]) must hold zeros. The per-row scalar
/// work is kept short because every warp waits on it between its loads
/// and its stores (no IEEE division or square root with their slow-path
/// branches; see [`mean_of`], [`rstd_of`]).
#[inline(always)]
pub fn moments<const W: usize, const L: u32, const NV: usize>(
    v: &[[f32; 8]; NV],
    lane: usize,
    eps: f32,
) -> (f32, f32) {
    let mean = mean_of::<W>(gpu::group_sum::<L>(lane_sum(v)));
    let q = gpu::group_sum::<L>(lane_sq_dev::<W, L, NV>(v, mean, lane));
    (mean, rstd_of::<W>(q, eps))
}

macro_rules! layer_norm_entries {
    ($($plain:ident, $affine:ident: W = $w:literal, L = $l:literal, NV = $nv:literal;)*) => {$(
        kernel! {
            /// LayerNorm without affine, fixed width.
            pub fn $plain(x: *const u16, y: *mut u16, gamma: *const u16, beta: *const u16, rows: u64, eps: f32) {
                // SAFETY: extents checked by the host API.
                unsafe { layer_norm::<$w, $l, $nv, false>(x, y, gamma, beta, rows, eps) }
            }
        }
        kernel! {
            /// LayerNorm with f16 gamma and beta, fixed width.
            pub fn $affine(x: *const u16, y: *mut u16, gamma: *const u16, beta: *const u16, rows: u64, eps: f32) {
                // SAFETY: extents checked by the host API.
                unsafe { layer_norm::<$w, $l, $nv, true>(x, y, gamma, beta, rows, eps) }
            }
        }
    )*};
}

// L and NV must equal wavefuse_shared::RowLayout::for_width(W); the
// `layouts_match_shared` test below keeps them in step.
layer_norm_entries! {
    wf_layer_norm_192, wf_layer_norm_affine_192: W = 192, L = 8, NV = 3;
    wf_layer_norm_384, wf_layer_norm_affine_384: W = 384, L = 16, NV = 3;
    wf_layer_norm_768, wf_layer_norm_affine_768: W = 768, L = 32, NV = 3;
}

#[cfg(test)]
mod tests {
    use wavefuse_shared::RowLayout;

    #[test]
    fn layouts_match_shared() {
        for (w, l, nv) in [(192, 8, 3), (384, 16, 3), (768, 32, 3)] {
            let s = RowLayout::for_width(w).expect("supported");
            assert_eq!((s.lanes, s.vecs_per_lane), (l, nv));
        }
    }
}
