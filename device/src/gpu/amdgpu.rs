//! gfx9 (wave64) primitives through `core::arch::amdgpu`.
use core::arch::amdgpu as a;
use core::sync::atomic::{Ordering, fence};
use wavefuse_shared::Target;

pub const TARGET: Target = Target::Amdgpu;

unsafe extern "C" {
    #[link_name = "llvm.amdgcn.exp2.f32"]
    fn amdgcn_exp2(x: f32) -> f32;
    #[link_name = "llvm.amdgcn.rcp.f32"]
    fn amdgcn_rcp(x: f32) -> f32;
    #[link_name = "llvm.amdgcn.sched.barrier"]
    fn amdgcn_sched_barrier(mask: i32);
    #[link_name = "llvm.amdgcn.wave.barrier"]
    fn amdgcn_wave_barrier();
    #[link_name = "llvm.amdgcn.ballot.i64"]
    fn amdgcn_ballot(p: bool) -> u64;
}

#[inline(always)]
pub fn thread_id() -> u32 {
    a::workitem_id_x()
}

#[inline(always)]
pub fn block_id() -> u32 {
    a::workgroup_id_x()
}

#[inline(always)]
pub fn block_id_y() -> u32 {
    a::workgroup_id_y()
}

#[inline(always)]
pub fn wave_size() -> u32 {
    // Folds to the constant 64 on gfx9 targets.
    a::wavefrontsize()
}

#[inline(always)]
pub fn barrier() {
    // gfx90a has back-off barriers, so s_barrier alone does not order LDS
    // traffic; the fences make the barrier a release/acquire point.
    fence(Ordering::Release);
    a::s_barrier();
    fence(Ordering::Acquire);
}

#[inline(always)]
fn lane_id() -> u32 {
    a::mbcnt_hi(u32::MAX, a::mbcnt_lo(u32::MAX, 0))
}

#[inline(always)]
pub fn shfl_xor_u32(v: u32, mask: u32) -> u32 {
    // ds_bpermute takes a byte address: source lane * 4.
    let src = (lane_id() ^ mask) << 2;
    // SAFETY: every lane of the wave executes this (facade contract), so the
    // source lane is active.
    unsafe { a::ds_bpermute(src, v) }
}

#[inline(always)]
pub fn wave_any(p: bool) -> bool {
    // SAFETY: the whole wave reaches it (facade contract); the ballot of
    // the active lanes is a scalar register.
    unsafe { amdgcn_ballot(p) != 0 }
}

#[inline(always)]
pub fn shfl_idx_u32(v: u32, src: u32) -> u32 {
    // SAFETY: as for `shfl_xor_u32`; `src` < 64 (facade contract).
    unsafe { a::ds_bpermute(src << 2, v) }
}

#[inline(always)]
pub fn workgroup_mem<T>() -> *mut T {
    core::intrinsics::gpu::gpu_launch_sized_workgroup_mem::<T>()
}

#[inline(always)]
pub fn sqrt(x: f32) -> f32 {
    core::intrinsics::sqrtf32(x)
}

#[inline(always)]
pub fn trap() -> ! {
    core::intrinsics::abort()
}

#[inline(always)]
pub unsafe fn load_i32_keep(p: *const i32) -> i32 {
    // SAFETY: caller contract.
    unsafe { p.read() }
}

#[inline(always)]
pub fn fma(a: f32, b: f32, c: f32) -> f32 {
    core::intrinsics::fmaf32(a, b, c)
}

#[inline(always)]
pub fn fma_f64(a: f64, b: f64, c: f64) -> f64 {
    core::intrinsics::fmaf64(a, b, c)
}

#[inline(always)]
pub fn rsqrt(x: f32) -> f32 {
    1.0 / sqrt(x)
}

#[inline(always)]
pub fn exp2_approx(x: f32) -> f32 {
    // SAFETY: a pure arithmetic intrinsic (`v_exp_f32`), defined for every input.
    unsafe { amdgcn_exp2(x) }
}

#[inline(always)]
pub fn recip_approx(x: f32) -> f32 {
    // SAFETY: a pure arithmetic intrinsic (`v_rcp_f32`), defined for every input.
    unsafe { amdgcn_rcp(x) }
}

#[inline(always)]
pub fn h2f(h: u16) -> f32 {
    f16::from_bits(h) as f32
}

#[inline(always)]
pub fn f2h(x: f32) -> u16 {
    (x as f16).to_bits()
}

#[inline(always)]
pub fn add_f16(a: u16, b: u16) -> u16 {
    (f16::from_bits(a) + f16::from_bits(b)).to_bits()
}

#[inline(always)]
pub fn pack2(lo: f32, hi: f32) -> u32 {
    u32::from(f2h(lo)) | (u32::from(f2h(hi)) << 16)
}

#[inline(always)]
pub fn add_h2(a: u32, b: u32) -> u32 {
    let h = |w: u32, i: u32| h2f((w >> (16 * i)) as u16);
    pack2(h(a, 0) + h(b, 0), h(a, 1) + h(b, 1))
}

#[inline(always)]
pub fn widen2(w: u32) -> [f32; 2] {
    [h2f(w as u16), h2f((w >> 16) as u16)]
}

/// Four halves in two registers.
#[repr(simd)]
#[derive(Clone, Copy)]
struct H4([f16; 4]);

/// Four `f32` accumulators.
#[repr(simd)]
#[derive(Clone, Copy)]
struct F4([f32; 4]);

// `../shared/TOOLCHAIN.md`: gives `v_mfma_f32_16x16x16f16` on gfx90a and
// `v_mfma_f32_16x16x16_f16` on gfx942 (`core::arch::amdgpu` has no MFMA).
#[allow(improper_ctypes)]
unsafe extern "C" {
    #[link_name = "llvm.amdgcn.mfma.f32.16x16x16f16"]
    fn amdgcn_mfma_16x16x16f16(a: H4, b: H4, c: F4, cbsz: i32, abid: i32, blgp: i32) -> F4;
}

#[inline(always)]
pub fn mfma_16x16x16_f16(a: [u32; 2], b: [u32; 2], c: [f32; 4]) -> [f32; 4] {
    // SAFETY: H4 and [u32; 2] are both 8 bytes, F4 and [f32; 4] 16; a
    // register-only instruction the whole wavefront executes (facade
    // contract); CBSZ/ABID/BLGP 0 = no broadcast or lane swizzle.
    unsafe {
        let d = amdgcn_mfma_16x16x16f16(
            core::mem::transmute::<[u32; 2], H4>(a),
            core::mem::transmute::<[u32; 2], H4>(b),
            F4(c),
            0,
            0,
            0,
        );
        core::mem::transmute::<F4, [f32; 4]>(d)
    }
}

#[inline(always)]
pub fn sched_barrier() {
    // SAFETY: a scheduling hint with no effect on execution; mask 0 lets
    // no instruction cross it.
    unsafe { amdgcn_sched_barrier(0) }
}

#[inline(always)]
pub fn wave_barrier() {
    // SAFETY: a convergent code-motion barrier; the wavefront executes in
    // lockstep and its LDS operations complete in order.
    unsafe { amdgcn_wave_barrier() }
}

#[inline(always)]
pub fn wave_uniform(v: u32) -> u32 {
    a::readfirstlane_u32(v)
}

pub use super::scalar::{
    below_scaled_h2, copy_from_workgroup, copy_to_workgroup, copy_to_workgroup_fence,
    copy_to_workgroup_wait, copy_to_workgroup_wait_older, odd_bytes,
};
