//! Packed-f16 bit operations in plain arithmetic, for the targets without
//! an instruction for them (gfx9 and the host emulator); NVIDIA's forms
//! are in `nvptx.rs`. Both give the same bits ([`super::below_scaled_h2`],
//! [`super::odd_bytes`]). Also the copies between global and workgroup
//! memory of those targets, which have no asynchronous copy: plain 16-byte
//! copies (through registers), so the fences and waits have nothing to do.
use super::imp::h2f;

#[inline(always)]
pub unsafe fn copy_to_workgroup(dst: *mut u16, src: *const u16) {
    // SAFETY: caller contract (16 readable / writable, aligned bytes).
    unsafe { dst.cast::<[u32; 4]>().write(src.cast::<[u32; 4]>().read()) }
}

#[inline(always)]
pub unsafe fn copy_from_workgroup(dst: *mut u16, src: *const u16) {
    // SAFETY: caller contract (16 readable / writable, aligned bytes).
    unsafe { dst.cast::<[u32; 4]>().write(src.cast::<[u32; 4]>().read()) }
}

#[inline(always)]
pub fn copy_to_workgroup_fence() {}

#[inline(always)]
pub fn copy_to_workgroup_wait_older() {}

#[inline(always)]
pub fn copy_to_workgroup_wait() {}

#[inline(always)]
pub fn odd_bytes(a: u32, b: u32) -> u32 {
    ((a >> 8) & 0xff) | ((a >> 16) & 0xff00) | ((b << 8) & 0xff_0000) | (b & 0xff00_0000)
}

/// `|z| < k |x|` per half, in f32: the product of two halves is exact
/// there, so the comparison is exact.
#[inline(always)]
pub fn below_scaled_h2(z: u32, x: u32, k: u16) -> u32 {
    let k = h2f(k);
    let below = |s: u32| {
        let (z, x) = (h2f((z >> s) as u16), h2f((x >> s) as u16));
        u32::from(
            f32::from_bits(z.to_bits() & 0x7fff_ffff)
                < k * f32::from_bits(x.to_bits() & 0x7fff_ffff),
        ) << (s + 15)
    };
    below(0) | below(16)
}
