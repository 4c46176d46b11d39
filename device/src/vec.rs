//! 16-byte vector moves of eight halves.
//!
//! Halves cross the kernel ABI as `u16` bits (the host's `half::f16` has
//! the same bits); arithmetic converts them to `f32` with core's `f16`.

/// Eight halves, aligned so one access is one 16-byte load or store
/// (`global_load_dwordx4` on gfx9, `ld.global.v4.u32` on NVIDIA).
#[repr(C, align(16))]
#[derive(Clone, Copy)]
pub struct V8(pub [u32; 4]);

/// Loads eight halves at `p` and widens them to `f32`.
///
/// # Safety
/// `p` must be valid for 16 bytes and 16-byte aligned.
#[inline(always)]
pub unsafe fn load8(p: *const u16) -> [f32; 8] {
    // SAFETY: caller contract.
    widen8(unsafe { load8_bits(p) })
}

/// Loads eight halves at `p` as raw bits (so a caller can make only the
/// load conditional and widen unconditionally).
///
/// # Safety
/// `p` must be valid for 16 bytes and 16-byte aligned.
#[inline(always)]
pub unsafe fn load8_bits(p: *const u16) -> V8 {
    // SAFETY: caller contract.
    unsafe { core::ptr::read(p.cast::<V8>()) }
}

/// Widens eight halves (as loaded by [`load8_bits`]) to `f32`.
#[inline(always)]
pub fn widen8(v: V8) -> [f32; 8] {
    let mut out = [0.0f32; 8];
    for (i, o) in out.iter_mut().enumerate() {
        let bits = (v.0[i / 2] >> (16 * (i % 2))) as u16;
        *o = f16::from_bits(bits) as f32;
    }
    out
}

#[cfg(target_arch = "nvptx64")]
#[repr(simd)]
#[derive(Clone, Copy)]
struct H2([f16; 2]);

#[cfg(target_arch = "nvptx64")]
#[repr(simd)]
#[derive(Clone, Copy)]
struct F2([f32; 2]);

/// Two `f32` rounded to halves (nearest-even), `lo` in the low 16 bits: one
/// `cvt.rn.f16x2.f32` on NVIDIA (two conversions and a byte permute
/// otherwise).
#[inline(always)]
pub fn pack2(lo: f32, hi: f32) -> u32 {
    #[cfg(target_arch = "nvptx64")]
    {
        // SAFETY: an element-wise f32 -> f16 conversion of a two-lane
        // vector (`fptrunc <2 x float>`); H2 and u32 are both 4 bytes.
        unsafe {
            let h: H2 = core::intrinsics::simd::simd_cast(F2([lo, hi]));
            core::mem::transmute::<H2, u32>(h)
        }
    }
    #[cfg(not(target_arch = "nvptx64"))]
    {
        u32::from((lo as f16).to_bits()) | (u32::from((hi as f16).to_bits()) << 16)
    }
}

/// Rounds eight `f32` to halves (nearest-even) and stores them at `p`.
///
/// # Safety
/// `p` must be valid for 16 bytes and 16-byte aligned.
#[inline(always)]
pub unsafe fn store8(p: *mut u16, v: [f32; 8]) {
    let mut w = [0u32; 4];
    for (i, w) in w.iter_mut().enumerate() {
        *w = pack2(v[2 * i], v[2 * i + 1]);
    }
    // SAFETY: caller contract.
    unsafe { store8_bits(p, V8(w)) }
}

/// Stores eight halves given as raw bits at `p`.
///
/// # Safety
/// `p` must be valid for 16 bytes and 16-byte aligned.
#[inline(always)]
pub unsafe fn store8_bits(p: *mut u16, v: V8) {
    // SAFETY: caller contract.
    unsafe { core::ptr::write(p.cast::<V8>(), v) }
}

/// The two halves of `a` and `b` added pairwise, each sum rounded once to
/// f16 (the f32 sum of two halves rounded to f16 is the correctly rounded
/// f16 sum): one `add.rn.f16x2` (HADD2) on NVIDIA on the words as loaded.
#[inline(always)]
pub fn add_h2(a: u32, b: u32) -> u32 {
    #[cfg(target_arch = "nvptx64")]
    {
        // SAFETY: H2 and u32 are both 4 bytes; an element-wise f16 add.
        unsafe {
            let s: H2 = core::intrinsics::simd::simd_add(
                core::mem::transmute::<u32, H2>(a),
                core::mem::transmute::<u32, H2>(b),
            );
            core::mem::transmute::<H2, u32>(s)
        }
    }
    #[cfg(not(target_arch = "nvptx64"))]
    {
        let h = |w: u32, i: u32| f16::from_bits((w >> (16 * i)) as u16) as f32;
        pack2(h(a, 0) + h(b, 0), h(a, 1) + h(b, 1))
    }
}

/// The two halves of `w` widened to `f32` (low half first).
#[inline(always)]
pub fn widen2(w: u32) -> [f32; 2] {
    #[cfg(target_arch = "nvptx64")]
    {
        // SAFETY: H2 and u32 are both 4 bytes; an element-wise widening.
        unsafe {
            let f: F2 = core::intrinsics::simd::simd_cast(core::mem::transmute::<u32, H2>(w));
            core::mem::transmute::<F2, [f32; 2]>(f)
        }
    }
    #[cfg(not(target_arch = "nvptx64"))]
    {
        [
            f16::from_bits(w as u16) as f32,
            f16::from_bits((w >> 16) as u16) as f32,
        ]
    }
}
