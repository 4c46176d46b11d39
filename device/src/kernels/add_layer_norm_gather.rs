//! Residual add + LayerNorm + token gather (the Swin block's
//! `x = x + attn(...)`, `norm2`, window partition) in one pass:
//! `residual[s] = f16(residual[s] + branch[s])` for every source token `s`,
//! and `out[t] = idx[t] >= 0 ? LayerNorm(residual[idx[t]]) : 0`, the
//! LayerNorm reading the ROUNDED sum (see [`super::add_layer_norm()`]).
//!
//! Layout: [`wavefuse_shared::RowLayout::for_width`] over OUTPUT rows, the
//! layout of [`super::layer_norm_gather()`]: the same reduction order, so the
//! fused path gives the same bits as `add_layer_norm` followed by
//! `layer_norm_gather` (16 lanes x 2 at width 192 and 32 x 2 at 384 were
//! faster on the H200, at the price of that identity).
//! The group that owns output row `t` also updates source row `idx[t]`.
//! The host accepts only tables that name every source exactly once (a
//! partition with padding), so every residual row is updated once, by one
//! group, and each element is read and written by the same lane: in place
//! is race-free.
//! Padding rows and rows past the end load nothing but join the group
//! reductions; padding rows are written as zeros.
use super::gather::source_of_row;
use super::layer_norm::{Refine, group_row, in_row};
use super::layer_norm_gather::{source_row, store_gathered};
use super::ln_stats::moments;
use crate::gpu;
use crate::vec::{load8, store8};

/// One row group's residual add + LayerNorm + gather.
///
/// # Safety
/// `residual`, `branch`, `residual_out` valid for `n_src * W` halves,
/// `out` for `n_out * W`, `idx` for `n_out` entries naming each source at
/// most once, `gamma`/`beta` for `W` halves when `AFFINE`; halves 16-byte
/// aligned; `residual_out` may equal `residual`; no other overlap with
/// the outputs.
#[inline(always)]
#[allow(clippy::needless_range_loop, clippy::too_many_arguments)] // constant indices keep the row in registers
pub unsafe fn add_layer_norm_gather<
    const W: usize,
    const L: u32,
    const NV: usize,
    const AFFINE: bool,
>(
    residual: *const u16,
    branch: *const u16,
    residual_out: *mut u16,
    idx: *const i32,
    out: *mut u16,
    gamma: *const u16,
    beta: *const u16,
    n_out: u64,
    n_src: u64,
    eps: f32,
) {
    let (lane, row) = group_row::<L>();
    let active = row < n_out;
    // SAFETY: `idx` holds n_out entries.
    let s = unsafe { source_of_row(idx, row, n_out, n_src) };

    let mut v = [[0.0f32; 8]; NV];
    if let Some(s) = s {
        let mut a = [[0.0f32; 8]; NV];
        let mut b = [[0.0f32; 8]; NV];
        for k in 0..NV {
            if !in_row::<W, L, NV>(k, lane) {
                continue;
            }
            let off = s * W + (k * L as usize + lane) * 8;
            // SAFETY: s < n_src and the vector lies inside the token.
            unsafe {
                a[k] = load8(residual.add(off));
                b[k] = load8(branch.add(off));
            }
        }
        for k in 0..NV {
            if !in_row::<W, L, NV>(k, lane) {
                continue;
            }
            for i in 0..8 {
                // Round the sum to f16 once; LayerNorm reads the rounded value.
                v[k][i] = gpu::h2f(gpu::f2h(a[k][i] + b[k][i]));
            }
            let off = s * W + (k * L as usize + lane) * 8;
            // SAFETY: as for the loads; exact store of f16 values. This
            // group is the only one naming `s`, and this lane read `off`.
            unsafe { store8(residual_out.add(off), v[k]) };
        }
    }
    // Every lane of the group, active or not, joins the reductions.
    let (st, sums, precise, one_pass) = moments::<W, L, NV, AFFINE>(&mut v, lane, eps);
    // The LayerNorm's input row is the stored sum (this lane's own stores
    // are all a refinement reads back).
    let x_row = source_row::<W>(residual_out.cast_const(), s);
    // SAFETY: where active, row < n_out; the source row is inside
    // residual_out.
    unsafe {
        store_gathered::<W, L, NV, AFFINE>(
            &v,
            st,
            sums,
            precise,
            one_pass,
            x_row,
            s.is_some(),
            out.wrapping_add(row as usize * W),
            active,
            gamma,
            beta,
            eps,
            lane,
            Refine::Inline,
        )
    };
}

macro_rules! add_layer_norm_gather_entries {
    ($($plain:ident, $affine:ident: W = $w:literal, L = $l:literal, NV = $nv:literal;)*) => {$(
        kernel! {
            #[allow(clippy::too_many_arguments)]
            /// Residual add + LayerNorm + gather without affine, fixed width.
            pub fn $plain(residual: *const u16, branch: *const u16, residual_out: *mut u16, idx: *const i32, out: *mut u16, gamma: *const u16, beta: *const u16, n_out: u64, n_src: u64, eps: f32) {
                // SAFETY: extents and the table checked by the host API.
                unsafe { add_layer_norm_gather::<$w, $l, $nv, false>(residual, branch, residual_out, idx, out, gamma, beta, n_out, n_src, eps) }
            }
        }
        kernel! {
            #[allow(clippy::too_many_arguments)]
            /// Residual add + LayerNorm + gather with f16 gamma and beta, fixed width.
            pub fn $affine(residual: *const u16, branch: *const u16, residual_out: *mut u16, idx: *const i32, out: *mut u16, gamma: *const u16, beta: *const u16, n_out: u64, n_src: u64, eps: f32) {
                // SAFETY: extents and the table checked by the host API.
                unsafe { add_layer_norm_gather::<$w, $l, $nv, true>(residual, branch, residual_out, idx, out, gamma, beta, n_out, n_src, eps) }
            }
        }
    )*};
}

// L and NV must equal wavefuse_shared::RowLayout::for_width(W), the layout
// of layer_norm_gather, so that the fused and unfused paths give the same
// bits; the `layouts_match_shared` test below keeps them in step.
add_layer_norm_gather_entries! {
    wf_add_layer_norm_gather_192, wf_add_layer_norm_gather_affine_192: W = 192, L = 8, NV = 3;
    wf_add_layer_norm_gather_384, wf_add_layer_norm_gather_affine_384: W = 384, L = 16, NV = 3;
    wf_add_layer_norm_gather_768, wf_add_layer_norm_gather_affine_768: W = 768, L = 32, NV = 3;
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
