//! `y = gelu(x + bias)`: f16 `x` \[rows, cols\], f16 or bf16 `bias` \[cols\],
//! f16 `y`; exact (erf) or tanh GELU from [`crate::math`]
//! ([`crate::math::gelu_erf_fast`] / [`crate::math::gelu_tanh_fast`]: one
//! hardware `exp2` and one reciprocal per element, so the kernel stays
//! memory-bound; the polynomial-only forms cost twice the arithmetic).
//!
//! Rounding (PyTorch on CUDA): with an f16 bias, `x + b` is an f16 tensor op
//! (f32 add rounded to f16) and GELU runs in f32 on that f16 value, rounded
//! once: `y = f16(gelu(f16(x + b)))`. With a bf16 bias, f16 + bf16 promotes
//! to f32: `y = f16(gelu(f32(x) + f32(b)))` (one f32 add, no f16 rounding
//! before the GELU; the f32 result `.to(float16)`).
//!
//! Layout: a flat, element-wise kernel. Each thread of a [`GELU_BLOCK`]-thread
//! workgroup handles [`GELU_PER_THREAD`] items (16-byte vectors of 8 halves
//! on the vector path, single halves on the scalar path) `GELU_BLOCK` apart,
//! so every load instruction of a wave covers contiguous memory. No
//! collectives: out-of-range items are simply predicated off.
use crate::gpu;
use crate::math::{gelu_erf_fast, gelu_tanh_fast};
use crate::vec::{V8, store8};
use wavefuse_shared::geometry::{GELU_BLOCK, GELU_PER_THREAD};

// The `unroll!` lists below name 0..GELU_PER_THREAD.
const _: () = assert!(GELU_PER_THREAD == 4);

/// GELU of one f32 (erf or tanh form).
#[inline(always)]
fn gelu<const TANH: bool>(v: f32) -> f32 {
    if TANH {
        gelu_tanh_fast(v)
    } else {
        gelu_erf_fast(v)
    }
}

/// `x + b` as PyTorch rounds it (see the module docs).
#[inline(always)]
fn add_bias<const BF16: bool>(x: f32, b: f32) -> f32 {
    if BF16 {
        x + b
    } else {
        gpu::h2f(gpu::f2h(x + b))
    }
}

/// A bias half (f16 or bf16 bits) widened to f32.
#[inline(always)]
fn widen<const BF16: bool>(bits: u16) -> f32 {
    if BF16 {
        f32::from_bits(u32::from(bits) << 16)
    } else {
        gpu::h2f(bits)
    }
}

/// Vector path: `n_vec` vectors of 8 halves, `cols_vec` vectors per row.
///
/// # Safety
/// `x`, `y` valid for `n_vec * 8` halves, `b` for `cols_vec * 8`, all
/// 16-byte aligned; `cols_vec >= 1`.
#[inline(always)]
pub unsafe fn bias_gelu_vec<const TANH: bool, const BF16: bool>(
    x: *const u16,
    b: *const u16,
    y: *mut u16,
    n_vec: u32,
    cols_vec: u32,
) {
    const P: usize = GELU_PER_THREAD as usize;
    let base = u64::from(crate::gpu::block_id()) * u64::from(GELU_BLOCK * GELU_PER_THREAD)
        + u64::from(crate::gpu::thread_id());
    let cols_vec = crate::math::divisor(cols_vec);
    // All loads first (raw bits, few registers), then the math and stores.
    let mut xr = [V8([0; 4]); P];
    let mut br = [V8([0; 4]); P];
    let mut live = [false; P];
    // Column of each item: one division for the first, then steps of
    // GELU_BLOCK (mod cols_vec) by a compare-and-subtract.
    let step = GELU_BLOCK % cols_vec;
    // Past u32::MAX every item of this thread is dead (n_vec <= u32::MAX),
    // so the truncation only feeds unused columns.
    let mut c = (base as u32) % cols_vec;
    crate::unroll!(k in [0, 1, 2, 3] {
        let i = base + (k as u64) * u64::from(GELU_BLOCK);
        live[k] = i < u64::from(n_vec);
        if k > 0 {
            c += step;
            if c >= cols_vec.get() {
                c -= cols_vec.get();
            }
        }
        if live[k] {
            // SAFETY: i < n_vec and c < cols_vec; both aligned (caller).
            unsafe {
                xr[k] = core::ptr::read(x.add(i as usize * 8).cast::<V8>());
                br[k] = core::ptr::read(b.add(c as usize * 8).cast::<V8>());
            }
        }
    });
    crate::unroll!(k in [0, 1, 2, 3] {
        if live[k] {
            let mut o = [0.0f32; 8];
            for (e, o) in o.iter_mut().enumerate() {
                let sh = 16 * (e % 2);
                let xh = (xr[k].0[e / 2] >> sh) as u16;
                let bb = (br[k].0[e / 2] >> sh) as u16;
                // f16 bias: a native f16 add (one instruction; the same
                // bits as the f32 add rounded to f16, since f32 carries
                // 2*11+2 bits and double rounding is then innocuous).
                let v = if BF16 { gpu::h2f(xh) + widen::<true>(bb) } else { gpu::h2f(gpu::add_f16(xh, bb)) };
                *o = gelu::<TANH>(v);
            }
            let i = base + (k as u64) * u64::from(GELU_BLOCK);
            // SAFETY: as for the load.
            unsafe { store8(y.add(i as usize * 8), o) };
        }
    });
}

/// Scalar path: `n` halves, `cols` per row (any alignment of 2 bytes).
///
/// # Safety
/// `x`, `y` valid for `n` halves, `b` for `cols`; `cols >= 1`.
#[inline(always)]
#[allow(clippy::needless_range_loop)] // constant trip counts keep values in registers
pub unsafe fn bias_gelu_scalar<const TANH: bool, const BF16: bool>(
    x: *const u16,
    b: *const u16,
    y: *mut u16,
    n: u32,
    cols: u32,
) {
    const P: usize = GELU_PER_THREAD as usize;
    let base = u64::from(crate::gpu::block_id()) * u64::from(GELU_BLOCK * GELU_PER_THREAD)
        + u64::from(crate::gpu::thread_id());
    let cols = crate::math::divisor(cols);
    let mut v = [0.0f32; P];
    let mut live = [false; P];
    for k in 0..P {
        let i = base + (k as u64) * u64::from(GELU_BLOCK);
        live[k] = i < u64::from(n);
        if live[k] {
            let c = (i as u32) % cols;
            // SAFETY: i < n, c < cols (caller).
            let (xr, br) = unsafe { (*x.add(i as usize), *b.add(c as usize)) };
            v[k] = add_bias::<BF16>(gpu::h2f(xr), widen::<BF16>(br));
        }
    }
    for k in 0..P {
        if live[k] {
            let i = base + (k as u64) * u64::from(GELU_BLOCK);
            // SAFETY: i < n.
            unsafe { *y.add(i as usize) = gpu::f2h(gelu::<TANH>(v[k])) };
        }
    }
}

macro_rules! bias_gelu_entries {
    ($($vec:ident, $scalar:ident: TANH = $t:literal, BF16 = $b:literal, $doc:literal;)*) => {$(
        kernel! {
            #[doc = concat!("bias + GELU, 16-byte vector path: ", $doc)]
            pub fn $vec(x: *const u16, b: *const u16, y: *mut u16, n_vec: u32, cols_vec: u32) {
                // SAFETY: extents and alignment checked by the host API.
                unsafe { bias_gelu_vec::<$t, $b>(x, b, y, n_vec, cols_vec) }
            }
        }
        kernel! {
            #[doc = concat!("bias + GELU, scalar path (any width / alignment): ", $doc)]
            pub fn $scalar(x: *const u16, b: *const u16, y: *mut u16, n: u32, cols: u32) {
                // SAFETY: extents checked by the host API.
                unsafe { bias_gelu_scalar::<$t, $b>(x, b, y, n, cols) }
            }
        }
    )*};
}

bias_gelu_entries! {
    wf_bias_gelu_f16, wf_bias_gelu_f16_scalar: TANH = false, BF16 = false, "erf GELU, f16 bias.";
    wf_bias_gelu_bf16, wf_bias_gelu_bf16_scalar: TANH = false, BF16 = true, "erf GELU, bf16 bias.";
    wf_bias_gelu_tanh_f16, wf_bias_gelu_tanh_f16_scalar: TANH = true, BF16 = false, "tanh GELU, f16 bias.";
    wf_bias_gelu_tanh_bf16, wf_bias_gelu_tanh_bf16_scalar: TANH = true, BF16 = true, "tanh GELU, bf16 bias.";
}
