//! QKV split: the QKV Linear's output [windows * T, 3C] (per token
//! `[q(C) | k(C) | v(C)]`, each C = heads x 32, head-major) to q, k, v
//! [windows, heads, T, 32] contiguous, with q scaled.
//!
//! Rounding: without bias `q = f16(f32(x) * scale)` (one rounding), k and v
//! are bit copies. With the fused bias (f16 \[3C\]) `k = f16(x + b)`,
//! `v = f16(x + b)`, `q = f16(f16(x + b) * scale)`: the bias add rounds to
//! f16 before the scale, as PyTorch's `(x @ W.T + b)` f16 output does before
//! `q * scale`.
//!
//! Layout: one 16-byte vector (8 halves, a quarter of a head row) per item,
//! items numbered in source order so reads are contiguous; each head row
//! lands as 64 contiguous bytes. [`QKV_PER_THREAD`] items per thread,
//! [`QKV_BLOCK`] apart. No collectives.
use crate::gpu;
use crate::vec::V8;
use wavefuse_shared::geometry::{QKV_BLOCK, QKV_HEAD_DIM, QKV_PER_THREAD};

/// Applies `x -> f16((x [+ b]) * s)` to eight packed halves (see the module
/// docs for where rounding happens).
#[inline(always)]
fn scale8<const BIAS: bool>(x: V8, b: V8, s: f32) -> V8 {
    let mut w = [0u32; 4];
    for e in 0..8 {
        let sh = 16 * (e % 2);
        let mut v = gpu::h2f((x.0[e / 2] >> sh) as u16);
        if BIAS {
            v = gpu::h2f(gpu::f2h(v + gpu::h2f((b.0[e / 2] >> sh) as u16)));
        }
        w[e / 2] |= u32::from(gpu::f2h(v * s)) << sh;
    }
    V8(w)
}

/// One launch over `n_vec = tokens * 12 * heads` source vectors.
///
/// # Safety
/// `qkv` valid for `n_vec * 8` halves, `q`/`k`/`v` for a third of that
/// each, `bias` for `3 * heads * 32` halves when `BIAS`; all 16-byte
/// aligned; `heads >= 1`, `tokens >= 1`, `tokens * 12 * heads` divides
/// `n_vec`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub unsafe fn qkv_split<const BIAS: bool>(
    qkv: *const u16,
    bias: *const u16,
    q: *mut u16,
    k: *mut u16,
    v: *mut u16,
    n_vec: u32,
    heads: u32,
    tokens: u32,
    scale: f32,
) {
    const P: usize = QKV_PER_THREAD as usize;
    let base = u64::from(crate::gpu::block_id()) * u64::from(QKV_BLOCK * QKV_PER_THREAD)
        + u64::from(crate::gpu::thread_id());
    let per_token = crate::math::divisor(12 * heads); // vectors per token (3C / 8)
    let per_part = crate::math::divisor(4 * heads); // vectors per q, k or v part
    let tokens_nz = crate::math::divisor(tokens);
    let mut src = [V8([0; 4]); P];
    let mut bv = [V8([0; 4]); P];
    let mut dst = [core::ptr::null_mut::<u16>(); P];
    let mut is_q = [false; P];
    let mut live = [false; P];
    for j in 0..P {
        let i = base + (j as u64) * u64::from(QKV_BLOCK);
        live[j] = i < u64::from(n_vec);
        if live[j] {
            let i = i as u32; // < n_vec
            let token = i / per_token;
            let r = i % per_token;
            let part = r / per_part;
            let r = r % per_part; // head * 4 + quarter
            let (w, t) = (token / tokens_nz, token % tokens_nz);
            let (h, quarter) = (r / 4, r % 4);
            let row =
                (u64::from(w) * u64::from(heads) + u64::from(h)) * u64::from(tokens) + u64::from(t);
            let off = row as usize * QKV_HEAD_DIM as usize + quarter as usize * 8;
            let out = match part {
                0 => q,
                1 => k,
                _ => v,
            };
            // SAFETY: i < n_vec; the bias vector index r + part * per_part
            // < 12 * heads; aligned (caller).
            unsafe {
                src[j] = core::ptr::read(qkv.add(i as usize * 8).cast::<V8>());
                if BIAS {
                    bv[j] = core::ptr::read(
                        bias.add((part * per_part.get() + r) as usize * 8)
                            .cast::<V8>(),
                    );
                }
                dst[j] = out.add(off);
            }
            is_q[j] = part == 0;
        }
    }
    for j in 0..P {
        if live[j] {
            let o = if BIAS || is_q[j] {
                scale8::<BIAS>(src[j], bv[j], if is_q[j] { scale } else { 1.0 })
            } else {
                src[j]
            };
            // SAFETY: the destination row lies in its output (caller).
            unsafe { core::ptr::write(dst[j].cast::<V8>(), o) };
        }
    }
}

kernel! {
    /// QKV split with q scale, no bias.
    pub fn wf_qkv_split(qkv: *const u16, bias: *const u16, q: *mut u16, k: *mut u16, v: *mut u16, n_vec: u32, heads: u32, tokens: u32, scale: f32) {
        // SAFETY: extents and alignment checked by the host API.
        unsafe { qkv_split::<false>(qkv, bias, q, k, v, n_vec, heads, tokens, scale) }
    }
}

kernel! {
    /// QKV split with the fused f16 qkv bias, then the q scale.
    pub fn wf_qkv_split_bias(qkv: *const u16, bias: *const u16, q: *mut u16, k: *mut u16, v: *mut u16, n_vec: u32, heads: u32, tokens: u32, scale: f32) {
        // SAFETY: extents and alignment checked by the host API.
        unsafe { qkv_split::<true>(qkv, bias, q, k, v, n_vec, heads, tokens, scale) }
    }
}
