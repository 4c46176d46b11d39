//! gfx9 (wave64) primitives through `core::arch::amdgpu`.
use core::arch::amdgpu as a;
use core::sync::atomic::{Ordering, fence};

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
