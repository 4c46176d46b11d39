//! Attention scores += earth-specific bias (+ shift mask), in place.
//!
//! `S` [windows, heads, T, T] f16, `bias` [types, heads, T, T] f16 picked by
//! an INT32 window -> type table, `mask` [slots, T, T] f16 picked by an INT32
//! window -> slot table (optional). One rounding:
//! `S = f16((f32(S) + f32(mask)) + f32(bias))`, two f32 adds in that order.
//! The mask goes first: for the planner's masks (0, -100) `S + mask` is
//! exact in f32 whenever it cancels (Sterbenz), so the sum is the exact sum
//! rounded once even where the mask wipes out most of the score. (PyTorch's
//! unfused `(S + bias) + mask` rounds `S + bias` to f16 first.)
//!
//! The mask is f16 on the device: the planner's values (0, -100, and -inf if
//! used) are exact in f16, and it halves the mask's bytes and registers.
//!
//! Layout: one workgroup of [`ADD_BLOCK`] threads per (window, head) tile of
//! `T * T / 8` vectors; each thread takes two vectors per step,
//! `ADD_BLOCK` apart (for T = 144: 2592 vectors = 6.75 steps of 384, 96%
//! of lanes busy). The table lookups are per workgroup. No collectives.
use crate::vec::{load8, store8};

/// Threads per workgroup (3 waves of 64, 6 warps of 32).
pub const ADD_BLOCK: u32 = 192;

/// Table entries for `window`: (bias type, mask slot); traps on an entry
/// out of range (the host API validates tables when they are built, so
/// this never fires).
///
/// # Safety
/// `types` (and `slots` when `MASK`) valid for `window + 1` entries.
#[inline(always)]
pub unsafe fn lookup<const MASK: bool>(
    types: *const i32,
    slots: *const i32,
    window: u32,
    n_types: u32,
    n_slots: u32,
) -> (u32, u32) {
    // SAFETY: caller contract.
    let ty = unsafe { *types.add(window as usize) } as u32;
    let sl = if MASK {
        // SAFETY: caller contract.
        unsafe { *slots.add(window as usize) as u32 }
    } else {
        0
    };
    if ty >= n_types || (MASK && sl >= n_slots) {
        crate::gpu::trap();
    }
    (ty, sl)
}

/// One (window, head) tile per workgroup (`block_id` = window * heads + head).
///
/// # Safety
/// Extents as in the module docs; `tile_vec = T * T / 8`; all buffers
/// 16-byte aligned; tables hold one entry per window.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub unsafe fn bias_mask_add<const MASK: bool>(
    s: *mut u16,
    bias: *const u16,
    mask: *const u16,
    types: *const i32,
    slots: *const i32,
    heads: u32,
    tile_vec: u32,
    n_types: u32,
    n_slots: u32,
) {
    let tile = crate::gpu::block_id();
    let hd = crate::math::divisor(heads);
    let (w, h) = (tile / hd, tile % hd);
    // SAFETY: w < windows (one workgroup per tile).
    let (ty, sl) = unsafe { lookup::<MASK>(types, slots, w, n_types, n_slots) };
    let tile_len = tile_vec as usize * 8;
    // SAFETY: each tile lies in its tensor (caller).
    let (sp, bp, mp) = unsafe {
        (
            s.add(tile as usize * tile_len),
            bias.add((ty as usize * heads as usize + h as usize) * tile_len),
            mask.add(sl as usize * tile_len),
        )
    };
    let mut e = crate::gpu::thread_id();
    while e < tile_vec {
        let e2 = e + ADD_BLOCK;
        let two = e2 < tile_vec;
        // SAFETY: e (and e2 when `two`) < tile_vec.
        let (s1, b1, m1) = unsafe { load3::<MASK>(sp, bp, mp, e) };
        let (s2, b2, m2) = if two {
            // SAFETY: as above.
            unsafe { load3::<MASK>(sp, bp, mp, e2) }
        } else {
            ([0.0; 8], [0.0; 8], [0.0; 8])
        };
        // SAFETY: as above.
        unsafe { store8(sp.add(e as usize * 8), sum3::<MASK>(s1, b1, m1)) };
        if two {
            // SAFETY: as above.
            unsafe { store8(sp.add(e2 as usize * 8), sum3::<MASK>(s2, b2, m2)) };
        }
        e += 2 * ADD_BLOCK;
    }
}

/// Vector `e` of the score, bias and (when `MASK`) mask tiles.
///
/// # Safety
/// `e` inside the tiles.
#[inline(always)]
#[allow(clippy::type_complexity)]
unsafe fn load3<const MASK: bool>(
    sp: *const u16,
    bp: *const u16,
    mp: *const u16,
    e: u32,
) -> ([f32; 8], [f32; 8], [f32; 8]) {
    let o = e as usize * 8;
    // SAFETY: caller contract.
    unsafe {
        (
            load8(sp.add(o)),
            load8(bp.add(o)),
            if MASK { load8(mp.add(o)) } else { [0.0; 8] },
        )
    }
}

/// `(s [+ m]) + b` in f32, per element.
#[inline(always)]
pub fn sum3<const MASK: bool>(s: [f32; 8], b: [f32; 8], m: [f32; 8]) -> [f32; 8] {
    let mut o = [0.0f32; 8];
    for (i, o) in o.iter_mut().enumerate() {
        *o = if MASK {
            (s[i] + m[i]) + b[i]
        } else {
            s[i] + b[i]
        };
    }
    o
}

kernel! {
    /// Scores += earth bias + shift mask, in place.
    pub fn wf_bias_mask_add(s: *mut u16, bias: *const u16, mask: *const u16, types: *const i32, slots: *const i32, heads: u32, tile_vec: u32, n_types: u32, n_slots: u32) {
        // SAFETY: extents, alignment and tables checked by the host API.
        unsafe { bias_mask_add::<true>(s, bias, mask, types, slots, heads, tile_vec, n_types, n_slots) }
    }
}

kernel! {
    /// Scores += earth bias (no mask), in place.
    pub fn wf_bias_mask_add_nomask(s: *mut u16, bias: *const u16, mask: *const u16, types: *const i32, slots: *const i32, heads: u32, tile_vec: u32, n_types: u32, n_slots: u32) {
        // SAFETY: extents, alignment and tables checked by the host API.
        unsafe { bias_mask_add::<false>(s, bias, mask, types, slots, heads, tile_vec, n_types, n_slots) }
    }
}
