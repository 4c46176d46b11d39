//! 16-byte vector moves of eight halves.
//!
//! Halves cross the kernel ABI as `u16` bits (the host's `half::f16` has
//! the same bits); arithmetic converts them to `f32` through [`gpu`].
use crate::gpu;

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
        *o = gpu::h2f((v.0[i / 2] >> (16 * (i % 2))) as u16);
    }
    out
}

/// Two `f32` rounded to halves, packed ([`gpu::pack2`]).
#[inline(always)]
pub fn pack2(lo: f32, hi: f32) -> u32 {
    gpu::pack2(lo, hi)
}

/// Rounds eight `f32` to halves (nearest-even) and stores them at `p`.
///
/// # Safety
/// `p` must be valid for 16 bytes and 16-byte aligned.
#[inline(always)]
pub unsafe fn store8(p: *mut u16, v: [f32; 8]) {
    // SAFETY: caller contract.
    unsafe { store8_bits(p, pack8(v)) }
}

/// Eight `f32` rounded to halves (nearest-even), packed.
#[inline(always)]
pub fn pack8(v: [f32; 8]) -> V8 {
    let mut w = [0u32; 4];
    for (i, w) in w.iter_mut().enumerate() {
        *w = pack2(v[2 * i], v[2 * i + 1]);
    }
    V8(w)
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

/// Pairwise f16 sums of two packed words ([`gpu::add_h2`]).
#[inline(always)]
pub fn add_h2(a: u32, b: u32) -> u32 {
    gpu::add_h2(a, b)
}

/// The two halves of `w` widened to `f32` ([`gpu::widen2`]).
#[inline(always)]
pub fn widen2(w: u32) -> [f32; 2] {
    gpu::widen2(w)
}
