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
    let v = unsafe { core::ptr::read(p.cast::<V8>()) };
    let mut out = [0.0f32; 8];
    for (i, o) in out.iter_mut().enumerate() {
        let bits = (v.0[i / 2] >> (16 * (i % 2))) as u16;
        *o = f16::from_bits(bits) as f32;
    }
    out
}

/// Rounds eight `f32` to halves (nearest-even) and stores them at `p`.
///
/// # Safety
/// `p` must be valid for 16 bytes and 16-byte aligned.
#[inline(always)]
pub unsafe fn store8(p: *mut u16, v: [f32; 8]) {
    let mut w = [0u32; 4];
    for (i, x) in v.iter().enumerate() {
        w[i / 2] |= u32::from((*x as f16).to_bits()) << (16 * (i % 2));
    }
    // SAFETY: caller contract.
    unsafe { core::ptr::write(p.cast::<V8>(), V8(w)) }
}
