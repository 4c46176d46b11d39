//! Gather of f16 tokens through an INT32 index table:
//! `out[t] = idx[t] >= 0 ? src[idx[t]] : 0`.
//!
//! Tokens move as raw 16-byte vectors (bits are copied, never converted);
//! [`wf_gather4_f32_to_f16`] is the one entry that converts, rows of four
//! `f32` to four halves.
//! The host validates the table once (every entry is `-1` or in `0..n_src`);
//! the kernel still never reads out of bounds: any entry outside `0..n_src`
//! (negative ones included) writes zeros.
//!
//! Fixed widths use [`wavefuse_shared::layout::gather_layout`] (`L` lanes
//! per token, `NV` vectors per lane); [`wf_gather_generic`] takes any width that is a
//! multiple of 8 halves, with [`GENERIC_LANES`] lanes striding over a token.
use super::layer_norm::{group_row, in_row};
use crate::gpu;
use crate::vec::V8;
use wavefuse_shared::ROW_BLOCK;
use wavefuse_shared::geometry::GENERIC_LANES;

/// The source token for output token `t`, or `None` for padding (and for
/// any entry outside `0..n_src`).
///
/// # Safety
/// `idx` valid for `t + 1` entries.
#[inline(always)]
pub unsafe fn source_of(idx: *const i32, t: u64, n_src: u64) -> Option<usize> {
    // SAFETY: caller contract. The table is reused by every launch: keep it
    // in L2.
    let s = unsafe { gpu::load_i32_keep(idx.add(t as usize)) };
    (s >= 0 && (s as u64) < n_src).then_some(s as usize)
}

/// [`source_of`] for output row `row`, or `None` past the end
/// (`row >= n_out`) as well as for padding.
///
/// # Safety
/// `idx` valid for `n_out` entries.
#[inline(always)]
pub unsafe fn source_of_row(idx: *const i32, row: u64, n_out: u64, n_src: u64) -> Option<usize> {
    if row < n_out {
        // SAFETY: row < n_out (caller contract on `idx`).
        unsafe { source_of(idx, row, n_src) }
    } else {
        None
    }
}

/// One row group's gather at a fixed width.
///
/// # Safety
/// `src` valid for `n_src * W` halves, `out` for `n_out * W`, `idx` for
/// `n_out` entries; `src`/`out` 16-byte aligned and disjoint.
#[inline(always)]
#[allow(clippy::needless_range_loop)]
pub unsafe fn gather_rows<const W: usize, const L: u32, const NV: usize>(
    src: *const u16,
    idx: *const i32,
    out: *mut u16,
    n_out: u64,
    n_src: u64,
) {
    let (lane, row) = group_row::<L>();
    if row >= n_out {
        // No collectives in this kernel: exiting early is allowed.
        return;
    }
    // SAFETY: row < n_out.
    let s = unsafe { source_of(idx, row, n_src) };
    // Plain u32 words with constant indices stay in registers (an array of
    // `V8` went to scratch on gfx90a); every load is issued before any store.
    let mut v = [[0u32; 4]; NV];
    if let Some(s) = s {
        for k in 0..NV {
            if !in_row::<W, L, NV>(k, lane) {
                continue;
            }
            let off = s * W + (k * L as usize + lane) * 8;
            // SAFETY: s < n_src; the vector lies inside the token; aligned.
            let r = unsafe { src.add(off).cast::<V8>().read() };
            for i in 0..4 {
                v[k][i] = r.0[i];
            }
        }
    }
    let base = row as usize * W;
    for k in 0..NV {
        if !in_row::<W, L, NV>(k, lane) {
            continue;
        }
        let off = base + (k * L as usize + lane) * 8;
        // SAFETY: row < n_out; the vector lies inside the token; aligned.
        unsafe { out.add(off).cast::<V8>().write(V8(v[k])) };
    }
}

/// Gather at any width of `vecs` 16-byte vectors per token:
/// [`GENERIC_LANES`] lanes per token, each striding over the vectors.
///
/// # Safety
/// `src` valid for `n_src * vecs * 8` halves, `out` for `n_out * vecs * 8`,
/// `idx` for `n_out` entries; `src`/`out` 16-byte aligned and disjoint.
#[inline(always)]
#[allow(clippy::manual_memcpy)] // word copies keep the vector in registers
pub unsafe fn gather_any(
    src: *const u16,
    idx: *const i32,
    out: *mut u16,
    n_out: u64,
    n_src: u64,
    vecs: u64,
) {
    let tid = gpu::thread_id();
    let lane = u64::from(tid % GENERIC_LANES);
    let row = u64::from(gpu::block_id()) * u64::from(ROW_BLOCK / GENERIC_LANES)
        + u64::from(tid / GENERIC_LANES);
    if row >= n_out {
        // No collectives in this kernel: exiting early is allowed.
        return;
    }
    // SAFETY: row < n_out.
    let s = unsafe { source_of(idx, row, n_src) };
    let src = src.cast::<V8>();
    let out = out.cast::<V8>();
    let mut j = lane;
    while j < vecs {
        // Plain words, copied one by one: a `V8` temporary went to local
        // memory on NVPTX.
        let mut w = [0u32; 4];
        if let Some(s) = s {
            // SAFETY: s < n_src, j < vecs; aligned.
            let r = unsafe { src.add(s * vecs as usize + j as usize).read() };
            for i in 0..4 {
                w[i] = r.0[i];
            }
        }
        // SAFETY: row < n_out, j < vecs; aligned.
        unsafe {
            out.add(row as usize * vecs as usize + j as usize)
                .write(V8(w))
        };
        j += u64::from(GENERIC_LANES);
    }
}

macro_rules! gather_entries {
    ($($name:ident: W = $w:literal, L = $l:literal, NV = $nv:literal;)*) => {$(
        kernel! {
            /// Token gather through an INT32 table, fixed width.
            pub fn $name(src: *const u16, idx: *const i32, out: *mut u16, n_out: u64, n_src: u64) {
                // SAFETY: extents checked by the host API.
                unsafe { gather_rows::<$w, $l, $nv>(src, idx, out, n_out, n_src) }
            }
        }
    )*};
}

// L and NV must equal wavefuse_shared::layout::gather_layout(W); the
// `layouts_match_shared` test below keeps them in step.
gather_entries! {
    wf_gather_192: W = 192, L = 16, NV = 2;
    wf_gather_384: W = 384, L = 32, NV = 2;
    wf_gather_768: W = 768, L = 32, NV = 3;
}

kernel! {
    /// Token gather through an INT32 table, any width of `vecs` 16-byte
    /// vectors (8 halves each) per token.
    pub fn wf_gather_generic(src: *const u16, idx: *const i32, out: *mut u16, n_out: u64, n_src: u64, vecs: u64) {
        // SAFETY: extents checked by the host API.
        unsafe { gather_any(src, idx, out, n_out, n_src, vecs) }
    }
}

/// Four halves, aligned so one store is one 8-byte store.
#[repr(C, align(8))]
#[derive(Clone, Copy)]
struct H4([u32; 2]);

/// Gather of 16-byte rows of four `f32` into rows of four halves, each
/// rounded to nearest even (`x as f16`: overflow to infinity, NaN stays
/// NaN): output row `t` = `f16(src row idx[t])`, or zeros. One thread per
/// output row: one 16-byte load and one 8-byte store. Pangu's patch
/// embedding is such a gather: a patch's four longitudes are adjacent in
/// the `f32` fields, so its feature vector is 48 (upper air) or 28
/// (surface) of these rows, padding included.
///
/// # Safety
/// `src` valid for `n_src * 4` floats, `out` for `n_out * 4` halves, `idx`
/// for `n_out` entries; `src` 16-byte aligned, `out` 8-byte aligned, the
/// two disjoint.
#[inline(always)]
pub unsafe fn gather_rows4_to_f16(
    src: *const f32,
    idx: *const i32,
    out: *mut u16,
    n_out: u64,
    n_src: u64,
) {
    let row = u64::from(gpu::block_id()) * u64::from(ROW_BLOCK) + u64::from(gpu::thread_id());
    if row >= n_out {
        // No collectives in this kernel: exiting early is allowed.
        return;
    }
    // SAFETY: row < n_out.
    let s = unsafe { source_of(idx, row, n_src) };
    let mut h = [0u32; 2];
    if let Some(s) = s {
        // SAFETY: s < n_src: the row lies inside `src`; 16-byte aligned.
        let r = unsafe { src.cast::<V8>().add(s).read() };
        let f = |i: usize| f32::from_bits(r.0[i]);
        h = [gpu::pack2(f(0), f(1)), gpu::pack2(f(2), f(3))];
    }
    // SAFETY: row < n_out; 8-byte aligned.
    unsafe { out.cast::<H4>().add(row as usize).write(H4(h)) };
}

kernel! {
    /// Gather of rows of four `f32` into rows of four halves through an
    /// INT32 table, rounding to nearest even.
    pub fn wf_gather4_f32_to_f16(src: *const f32, idx: *const i32, out: *mut u16, n_out: u64, n_src: u64) {
        // SAFETY: extents checked by the host API.
        unsafe { gather_rows4_to_f16(src, idx, out, n_out, n_src) }
    }
}

#[cfg(test)]
mod tests {
    use wavefuse_shared::layout::gather_layout;

    #[test]
    fn layouts_match_shared() {
        for (w, l, nv) in [(192, 16, 2), (384, 32, 2), (768, 32, 3)] {
            let s = gather_layout(w).expect("supported");
            assert_eq!((s.lanes, s.vecs_per_lane), (l, nv));
        }
    }
}
