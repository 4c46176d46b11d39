//! NVIDIA (warp32) primitives through `core::arch::nvptx` and NVVM intrinsics.
use core::arch::nvptx as n;

unsafe extern "C" {
    #[link_name = "llvm.nvvm.shfl.sync.bfly.i32"]
    fn shfl_sync_bfly_i32(member_mask: u32, v: u32, lane_mask: u32, clamp: u32) -> u32;
    #[link_name = "llvm.nvvm.shfl.sync.idx.i32"]
    fn shfl_sync_idx_i32(member_mask: u32, v: u32, src_lane: u32, clamp: u32) -> u32;
}

#[inline(always)]
pub fn thread_id() -> u32 {
    // SAFETY: reads a special register.
    unsafe { n::_thread_idx_x() }
}

#[inline(always)]
pub fn block_id() -> u32 {
    // SAFETY: reads a special register.
    unsafe { n::_block_idx_x() }
}

#[inline(always)]
pub fn block_id_y() -> u32 {
    // SAFETY: reads a special register.
    unsafe { n::_block_idx_y() }
}

#[inline(always)]
pub fn wave_size() -> u32 {
    32
}

#[inline(always)]
pub fn barrier() {
    // SAFETY: bar.sync 0, reached by the whole block (facade contract).
    unsafe { n::_syncthreads() }
}

#[inline(always)]
pub fn shfl_xor_u32(v: u32, mask: u32) -> u32 {
    // SAFETY: the full member mask is right because whole warps reach every
    // collective (facade contract); clamp 0x1f = whole-warp segment.
    unsafe { shfl_sync_bfly_i32(u32::MAX, v, mask, 0x1f) }
}

#[inline(always)]
pub fn shfl_idx_u32(v: u32, src: u32) -> u32 {
    // SAFETY: as for `shfl_xor_u32`; `src` < 32 (facade contract).
    unsafe { shfl_sync_idx_i32(u32::MAX, v, src, 0x1f) }
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
    // No NVVM intrinsic carries an L2 cache policy, hence inline PTX
    // (createpolicy and ld.global.L2::cache_hint: sm_80+, PTX 7.4+).
    let r: i32;
    // SAFETY: `p` is valid and aligned (caller contract); the block only
    // reads memory and declares its one scratch register locally.
    unsafe {
        core::arch::asm!(
            "{{",
            ".reg .b64 keep;",
            "createpolicy.fractional.L2::evict_last.b64 keep, 1.0;",
            "ld.global.L2::cache_hint.b32 {r}, [{p}], keep;",
            "}}",
            r = out(reg32) r,
            p = in(reg64) p,
            options(readonly, nostack, preserves_flags)
        );
    }
    r
}
