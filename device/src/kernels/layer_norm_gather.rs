//! LayerNorm fused with a token gather (e.g. a window partition):
//! `out[t] = idx[t] >= 0 ? LayerNorm(src[idx[t]]) : 0`, in one pass with no
//! normalised intermediate. Numerics are exactly those of
//! [`super::layer_norm()`] ([`super::ln_stats`]: exact row sum, two-float
//! mean, f32 deviations and variance, output rounded once).
//!
//! Layout: [`wavefuse_shared::RowLayout`] over OUTPUT rows. A padding row
//! (and a row past the end) loads nothing but its lanes still join the
//! group reductions; padding rows are written as zeros. An entry outside
//! `0..n_src` (impossible after the host's validation) is treated as
//! padding, never read.
use super::gather::source_of_row;
use super::layer_norm::{Refine, RowIo, group_row_in, in_row, normalise_store};
use super::ln_affine::OnePass;
use super::ln_stats::{RowSums, Stats, moments};
use crate::vec::{V8, load8};
use wavefuse_shared::ln_block;

/// One row group's gathered LayerNorm.
///
/// # Safety
/// `src` valid for `n_src * W` halves, `out` for `n_out * W`, `idx` for
/// `n_out` entries, `gamma`/`beta` for `W` halves when `AFFINE`; halves
/// 16-byte aligned; `out` disjoint from every input; with `AFFINE`,
/// launch-sized workgroup memory of [`wavefuse_shared::ln_shared_bytes`].
#[inline(always)]
#[allow(clippy::needless_range_loop, clippy::too_many_arguments)] // constant indices keep the row in registers
pub unsafe fn layer_norm_gather<
    const W: usize,
    const L: u32,
    const NV: usize,
    const AFFINE: bool,
>(
    src: *const u16,
    idx: *const i32,
    out: *mut u16,
    gamma: *const u16,
    beta: *const u16,
    n_out: u64,
    n_src: u64,
    eps: f32,
) {
    let (lane, row) = group_row_in::<L>(ln_block(AFFINE));
    let active = row < n_out;
    // SAFETY: `idx` holds n_out entries.
    let s = unsafe { source_of_row(idx, row, n_out, n_src) };

    let mut v = [[0.0f32; 8]; NV];
    if let Some(s) = s {
        for k in 0..NV {
            if in_row::<W, L, NV>(k, lane) {
                // SAFETY: s < n_src and the vector lies inside the token.
                v[k] = unsafe { load8(src.add(s * W + (k * L as usize + lane) * 8)) };
            }
        }
    }
    // Every lane of the group, active or not, joins the reductions.
    let (st, sums, precise, one_pass) = moments::<W, L, NV, AFFINE>(&mut v, lane, eps);
    let x_row = source_row::<W>(src, s);
    // SAFETY: where active, row < n_out and the source row is inside src.
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
            Refine::Parked,
        )
    };
}

/// The first half of source row `s` of the rows at `base` (`base` itself
/// for a padding row, which is never read).
#[inline(always)]
pub fn source_row<const W: usize>(base: *const u16, s: Option<usize>) -> *const u16 {
    match s {
        Some(s) => base.wrapping_add(s * W),
        None => base,
    }
}

/// Writes one gathered output row: the normalised row (`t`, the offsets,
/// see [`normalise_store`], its input row at `x_row`) when it has a
/// source, zeros for a padding row. Every lane of the wave must call it;
/// `active` says which lanes own an output row; `refine` as for
/// [`normalise_store`].
///
/// # Safety
/// As for [`normalise_store`], with `x_row` valid where `active &&
/// has_source`, `out_row` where `active`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub unsafe fn store_gathered<const W: usize, const L: u32, const NV: usize, const AFFINE: bool>(
    t: &[[f32; 8]; NV],
    st: Stats,
    sums: RowSums,
    precise: bool,
    one_pass: OnePass,
    x_row: *const u16,
    has_source: bool,
    out_row: *mut u16,
    active: bool,
    gamma: *const u16,
    beta: *const u16,
    eps: f32,
    lane: usize,
    refine: Refine,
) {
    let io = RowIo {
        x: x_row,
        y: out_row,
        active: active && has_source,
    };
    // SAFETY: caller contract.
    unsafe {
        normalise_store::<W, L, NV, AFFINE>(
            t, st, sums, precise, one_pass, io, gamma, beta, eps, lane, refine,
        )
    };
    if !active || has_source {
        return;
    }
    for k in 0..NV {
        if in_row::<W, L, NV>(k, lane) {
            // SAFETY: the vector lies inside the row; aligned (caller contract).
            unsafe {
                out_row
                    .add((k * L as usize + lane) * 8)
                    .cast::<V8>()
                    .write(V8([0; 4]))
            };
        }
    }
}

macro_rules! layer_norm_gather_entries {
    ($($plain:ident, $affine:ident: W = $w:literal, L = $l:literal, NV = $nv:literal;)*) => {$(
        kernel! {
            #[allow(clippy::too_many_arguments)]
            /// Gathered LayerNorm without affine, fixed width.
            pub fn $plain(src: *const u16, idx: *const i32, out: *mut u16, gamma: *const u16, beta: *const u16, n_out: u64, n_src: u64, eps: f32) {
                // SAFETY: extents checked by the host API.
                unsafe { layer_norm_gather::<$w, $l, $nv, false>(src, idx, out, gamma, beta, n_out, n_src, eps) }
            }
        }
        kernel! {
            #[allow(clippy::too_many_arguments)]
            /// Gathered LayerNorm with f16 gamma and beta, fixed width.
            pub fn $affine(src: *const u16, idx: *const i32, out: *mut u16, gamma: *const u16, beta: *const u16, n_out: u64, n_src: u64, eps: f32) {
                // SAFETY: extents checked by the host API.
                unsafe { layer_norm_gather::<$w, $l, $nv, true>(src, idx, out, gamma, beta, n_out, n_src, eps) }
            }
        }
    )*};
}

// L and NV must equal wavefuse_shared::RowLayout::for_width(W); the
// `layouts_match_shared` test below keeps them in step.
layer_norm_gather_entries! {
    wf_layer_norm_gather_192, wf_layer_norm_gather_affine_192: W = 192, L = 8, NV = 3;
    wf_layer_norm_gather_384, wf_layer_norm_gather_affine_384: W = 384, L = 16, NV = 3;
    wf_layer_norm_gather_768, wf_layer_norm_gather_affine_768: W = 768, L = 32, NV = 3;
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
