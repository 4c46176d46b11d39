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
//! `T * T / 8` vectors; each thread takes seven vectors per pass,
//! `ADD_BLOCK` apart (for T = 144: 2592 vectors = 2 passes of 1344, 96% of
//! lanes busy), all loads of a pass in flight before its stores. The table
//! lookup is per workgroup, issued after the first score loads. No
//! collectives.
use crate::gpu;
use crate::vec::{V8, store8};
use wavefuse_shared::geometry::ADD_BLOCK;

/// Vectors per thread per pass (the `unroll!` lists name 0..7).
const ADD_VECS: usize = 7;

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
    let tid = crate::gpu::thread_id();
    let tile_len = tile_vec as usize * 8;
    // SAFETY: each tile lies in its tensor (caller).
    let sp = unsafe { s.add(tile as usize * tile_len) };
    // Score loads do not depend on the table lookup: each pass issues them
    // first, so the lookup's latency hides behind them, then the bias and
    // mask loads, and only then the stores (which the compiler may not move
    // loads across: `s` may alias `bias` as far as it knows).
    let mut e0 = 0u32;
    let mut looked_up: Option<(*const u16, *const u16)> = None;
    while e0 < tile_vec {
        let mut sr = [V8([0; 4]); ADD_VECS];
        let mut live = [false; ADD_VECS];
        crate::unroll!(k in [0, 1, 2, 3, 4, 5, 6] {
            let e = e0 + tid + k as u32 * ADD_BLOCK;
            live[k] = e < tile_vec;
            if live[k] {
                // SAFETY: e < tile_vec.
                sr[k] = unsafe { core::ptr::read(sp.add(e as usize * 8).cast::<V8>()) };
            }
        });
        let (bp, mp) = match looked_up {
            Some(p) => p,
            None => {
                let hd = crate::math::divisor(heads);
                let (w, h) = (tile / hd, tile % hd);
                // SAFETY: w < windows (one workgroup per tile).
                let (ty, sl) = unsafe { lookup::<MASK>(types, slots, w, n_types, n_slots) };
                // SAFETY: the bias and mask tiles lie in their tensors (caller).
                let p = unsafe {
                    (
                        bias.add((ty as usize * heads as usize + h as usize) * tile_len),
                        mask.add(sl as usize * tile_len),
                    )
                };
                looked_up = Some(p);
                p
            }
        };
        let mut br = [V8([0; 4]); ADD_VECS];
        let mut mr = [V8([0; 4]); ADD_VECS];
        crate::unroll!(k in [0, 1, 2, 3, 4, 5, 6] {
            if live[k] {
                let o = (e0 + tid + k as u32 * ADD_BLOCK) as usize * 8;
                // SAFETY: inside the tiles.
                unsafe {
                    br[k] = core::ptr::read(bp.add(o).cast::<V8>());
                    if MASK {
                        mr[k] = core::ptr::read(mp.add(o).cast::<V8>());
                    }
                }
            }
        });
        crate::unroll!(k in [0, 1, 2, 3, 4, 5, 6] {
            if live[k] {
                let o = (e0 + tid + k as u32 * ADD_BLOCK) as usize * 8;
                let v = sum3::<MASK>(widen(sr[k]), widen(br[k]), widen(mr[k]));
                // SAFETY: inside the tile.
                unsafe { store8(sp.add(o), v) };
            }
        });
        e0 += ADD_VECS as u32 * ADD_BLOCK;
    }
}

/// Eight halves (raw bits) widened to f32.
#[inline(always)]
fn widen(v: V8) -> [f32; 8] {
    let mut o = [0.0f32; 8];
    for (i, o) in o.iter_mut().enumerate() {
        *o = gpu::h2f((v.0[i / 2] >> (16 * (i % 2))) as u16);
    }
    o
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
