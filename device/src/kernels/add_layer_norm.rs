//! Residual add + LayerNorm in one pass: `r = f16(residual + branch)` is
//! written to `residual_out`, and `y = LayerNorm(r)` is computed from the
//! ROUNDED `r` (exactly what the unfused PyTorch path does), never from the
//! unrounded f32 sum.
//!
//! The f16 add is an f32 add of the two widened halves rounded once to f16:
//! f32 carries 24 >= 2 * 11 + 2 significand bits, so this double rounding
//! is the correctly rounded f16 sum.
//!
//! Layout: [`wavefuse_shared::RowLayout::wide`]: 32 lanes per row, one
//! 16-byte vector per lane per step (at width 192, 8 of the 32 lanes load
//! nothing). On the H200 this ran 1-3% faster than three vectors per lane
//! at width 192 and no slower at 384. Each element is read once and
//! `residual_out` / `y` written once, by the lane that read it, so
//! `residual_out == residual` (in place) is race-free. Rows past the end and
//! steps past the row are predicated off; their lanes still join the group
//! reductions.
use super::layer_norm::{group_row, in_row, moments, normalise_store};
use crate::vec::{load8, store8};

/// One row group's residual add + LayerNorm.
///
/// # Safety
/// `residual`, `branch`, `residual_out`, `y` valid for `rows * W` halves,
/// `gamma`/`beta` for `W` halves when `AFFINE`; all 16-byte aligned.
/// `residual_out` may equal `residual`; no other overlap with the outputs.
#[inline(always)]
#[allow(clippy::needless_range_loop, clippy::too_many_arguments)] // constant indices keep the row in registers
pub unsafe fn add_layer_norm<const W: usize, const L: u32, const NV: usize, const AFFINE: bool>(
    residual: *const u16,
    branch: *const u16,
    residual_out: *mut u16,
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
        let mut a = [[0.0f32; 8]; NV];
        let mut b = [[0.0f32; 8]; NV];
        for k in 0..NV {
            if in_row::<W, L, NV>(k, lane) {
                let off = base + (k * L as usize + lane) * 8;
                // SAFETY: row < rows and the vector lies inside the row.
                unsafe {
                    a[k] = load8(residual.add(off));
                    b[k] = load8(branch.add(off));
                }
            }
        }
        for k in 0..NV {
            if in_row::<W, L, NV>(k, lane) {
                for i in 0..8 {
                    // Round the sum to f16 once; LayerNorm reads the rounded value.
                    v[k][i] = ((a[k][i] + b[k][i]) as f16) as f32;
                }
            }
        }
    }
    let (mean, rstd) = moments::<W, L, NV>(&v, lane, eps);
    if active {
        // SAFETY: row < rows; `y` row and affine vectors in bounds.
        unsafe {
            normalise_store::<W, L, NV, AFFINE>(&v, mean, rstd, y.add(base), gamma, beta, lane)
        };
        // The residual goes out last, after `y`: measured on the H200,
        // 0.35% faster at [521280,192] than storing it before the
        // reductions, the same within noise at the other Pangu shapes.
        for k in 0..NV {
            if in_row::<W, L, NV>(k, lane) {
                let off = base + (k * L as usize + lane) * 8;
                // SAFETY: as for the loads; `v` holds f16 values, so the
                // store's rounding is exact. In place, this lane already
                // read `off`.
                unsafe { store8(residual_out.add(off), v[k]) };
            }
        }
    }
}

macro_rules! add_layer_norm_entries {
    ($($plain:ident, $affine:ident: W = $w:literal, L = $l:literal, NV = $nv:literal;)*) => {$(
        kernel! {
            #[allow(clippy::too_many_arguments)]
            /// Residual add + LayerNorm without affine, fixed width.
            pub fn $plain(residual: *const u16, branch: *const u16, residual_out: *mut u16, y: *mut u16, gamma: *const u16, beta: *const u16, rows: u64, eps: f32) {
                // SAFETY: extents checked by the host API.
                unsafe { add_layer_norm::<$w, $l, $nv, false>(residual, branch, residual_out, y, gamma, beta, rows, eps) }
            }
        }
        kernel! {
            #[allow(clippy::too_many_arguments)]
            /// Residual add + LayerNorm with f16 gamma and beta, fixed width.
            pub fn $affine(residual: *const u16, branch: *const u16, residual_out: *mut u16, y: *mut u16, gamma: *const u16, beta: *const u16, rows: u64, eps: f32) {
                // SAFETY: extents checked by the host API.
                unsafe { add_layer_norm::<$w, $l, $nv, true>(residual, branch, residual_out, y, gamma, beta, rows, eps) }
            }
        }
    )*};
}

// L and NV must equal wavefuse_shared::RowLayout::wide(W); the
// `layouts_match_shared` test below keeps them in step.
add_layer_norm_entries! {
    wf_add_layer_norm_192, wf_add_layer_norm_affine_192: W = 192, L = 32, NV = 1;
    wf_add_layer_norm_384, wf_add_layer_norm_affine_384: W = 384, L = 32, NV = 2;
    wf_add_layer_norm_768, wf_add_layer_norm_affine_768: W = 768, L = 32, NV = 3;
}

#[cfg(test)]
mod tests {
    use wavefuse_shared::RowLayout;

    #[test]
    fn layouts_match_shared() {
        for (w, l, nv) in [(192, 32, 1), (384, 32, 2), (768, 32, 3)] {
            let s = RowLayout::wide(w).expect("supported");
            assert_eq!((s.lanes, s.vecs_per_lane), (l, nv));
        }
    }
}
