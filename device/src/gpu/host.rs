//! Host primitives: answered by the SIMT emulator for the running thread.
use crate::emu;

#[inline(always)]
pub fn thread_id() -> u32 {
    emu::ctx().thread
}

#[inline(always)]
pub fn block_id() -> u32 {
    emu::ctx().block.0
}

#[inline(always)]
pub fn block_id_y() -> u32 {
    emu::ctx().block.1
}

#[inline(always)]
pub fn wave_size() -> u32 {
    emu::ctx().wave
}

#[inline(always)]
pub fn barrier() {
    emu::collective(emu::Op::Barrier);
}

#[inline(always)]
pub fn shfl_xor_u32(v: u32, mask: u32) -> u32 {
    emu::collective(emu::Op::ShflXor { value: v, mask })
}

#[inline(always)]
pub fn shfl_idx_u32(v: u32, src: u32) -> u32 {
    emu::collective(emu::Op::ShflIdx { value: v, src })
}

#[inline(always)]
pub fn workgroup_mem<T>() -> *mut T {
    emu::workgroup_mem::<T>()
}

#[inline(always)]
pub fn sqrt(x: f32) -> f32 {
    // f32 square root in plain core is not available without std; IEEE
    // sqrt is correctly rounded in both.
    std::primitive::f32::sqrt(x)
}

#[inline(always)]
pub fn trap() -> ! {
    emu::trap()
}

#[inline(always)]
pub unsafe fn load_i32_keep(p: *const i32) -> i32 {
    // SAFETY: caller contract.
    unsafe { p.read() }
}
