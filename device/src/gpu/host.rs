//! Host primitives: answered by the SIMT emulator for the running thread.
use crate::emu;
use half::f16;
use wavefuse_shared::Target;

pub const TARGET: Target = Target::Host;

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
pub fn wave_any(p: bool) -> bool {
    // A butterfly OR over the emulated wave: a partial wave is reported
    // by the exchanges as by any collective.
    let mut v = u32::from(p);
    let mut mask = 1;
    while mask < wave_size() {
        v |= shfl_xor_u32(v, mask);
        mask <<= 1;
    }
    v != 0
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

#[inline(always)]
pub fn fma(a: f32, b: f32, c: f32) -> f32 {
    std::primitive::f32::mul_add(a, b, c)
}

#[inline(always)]
pub fn fma_f64(a: f64, b: f64, c: f64) -> f64 {
    std::primitive::f64::mul_add(a, b, c)
}

#[inline(always)]
pub fn rsqrt(x: f32) -> f32 {
    1.0 / sqrt(x)
}

#[inline(always)]
pub fn exp2_approx(x: f32) -> f32 {
    std::primitive::f32::exp2(x)
}

#[inline(always)]
pub fn recip_approx(x: f32) -> f32 {
    1.0 / x
}

#[inline(always)]
pub fn h2f(h: u16) -> f32 {
    f16::from_bits(h).to_f32()
}

#[inline(always)]
pub fn f2h(x: f32) -> u16 {
    f16::from_f32(x).to_bits()
}

#[inline(always)]
pub fn add_f16(a: u16, b: u16) -> u16 {
    // The f32 sum of two halves is exact or within half an f32 ulp, and f32
    // (24 bits) >= 2 * 11 + 2 bits: rounding it to f16 gives the correctly
    // rounded f16 sum (no double-rounding error).
    f2h(h2f(a) + h2f(b))
}

#[inline(always)]
pub fn pack2(lo: f32, hi: f32) -> u32 {
    u32::from(f2h(lo)) | (u32::from(f2h(hi)) << 16)
}

#[inline(always)]
pub fn add_h2(a: u32, b: u32) -> u32 {
    u32::from(add_f16(a as u16, b as u16))
        | (u32::from(add_f16((a >> 16) as u16, (b >> 16) as u16)) << 16)
}

#[inline(always)]
pub fn widen2(w: u32) -> [f32; 2] {
    [h2f(w as u16), h2f((w >> 16) as u16)]
}

/// The address `lane` gave (an indexed exchange of both halves).
#[inline(always)]
fn addr_of(p: *const u16, lane: u32) -> *const u16 {
    let a = p as usize as u64;
    let lo = shfl_idx_u32(a as u32, lane);
    let hi = shfl_idx_u32((a >> 32) as u32, lane);
    (u64::from(lo) | (u64::from(hi) << 32)) as usize as *const u16
}

/// `ldmatrix.sync.aligned.m8n8.xN.shared.b16`, emulated (wave32 only):
/// lane `l` gives the address of row `l % 8` of matrix `l / 8` (`l < 8N`)
/// and gets, in register `j`, halves `2 (l % 4)..` of row `l / 4` of
/// matrix `j`.
#[inline(always)]
unsafe fn ldmatrix_n<const N: usize>(p: *const u16) -> [u32; N] {
    if wave_size() != 32 {
        trap();
    }
    let l = thread_id() % 32;
    let mut r = [0u32; N];
    for (j, r) in r.iter_mut().enumerate() {
        let row = addr_of(p, 8 * j as u32 + l / 4);
        // SAFETY: the giving lane's row is readable (caller contract).
        *r = unsafe { row.add(2 * (l % 4) as usize).cast::<u32>().read_unaligned() };
    }
    r
}

/// `ldmatrix.sync.aligned.m8n8.x4.shared.b16`, emulated ([`ldmatrix_n`]).
#[inline(always)]
pub unsafe fn ldmatrix_x4(p: *const u16) -> [u32; 4] {
    // SAFETY: caller contract.
    unsafe { ldmatrix_n::<4>(p) }
}

/// `ldmatrix.sync.aligned.m8n8.x2.shared.b16`, emulated ([`ldmatrix_n`]:
/// lanes 0..16 give the rows).
#[inline(always)]
pub unsafe fn ldmatrix_x2(p: *const u16) -> [u32; 2] {
    // SAFETY: caller contract.
    unsafe { ldmatrix_n::<2>(p) }
}

/// `ldmatrix...x4.trans`, emulated: register `j` of lane `l` holds
/// element `l / 4` of rows `2 (l % 4)` and `2 (l % 4) + 1` of matrix `j`.
#[inline(always)]
pub unsafe fn ldmatrix_x4_trans(p: *const u16) -> [u32; 4] {
    if wave_size() != 32 {
        trap();
    }
    let l = thread_id() % 32;
    let mut r = [0u32; 4];
    for (j, r) in r.iter_mut().enumerate() {
        let r0 = addr_of(p, 8 * j as u32 + 2 * (l % 4));
        let r1 = addr_of(p, 8 * j as u32 + 2 * (l % 4) + 1);
        let c = (l / 4) as usize;
        // SAFETY: as for `ldmatrix_x4`.
        let (lo, hi) = unsafe { (r0.add(c).read(), r1.add(c).read()) };
        *r = u32::from(lo) | (u32::from(hi) << 16);
    }
    r
}

/// `p` with its offset in workgroup memory XORed by `x` (bytes), then
/// `off` halves further, as the NVIDIA build's `ldmatrix_x4_x`.
#[inline(always)]
fn xor_offset(p: *const u16, x: u32, off: usize) -> *const u16 {
    let o = (p as usize).wrapping_sub(workgroup_mem::<u16>() as usize);
    p.wrapping_byte_offset(((o ^ x as usize) as isize).wrapping_sub(o as isize))
        .wrapping_add(off)
}

/// [`ldmatrix_x4`] at `p`'s workgroup-memory offset XOR `x`, plus `off`
/// halves.
#[inline(always)]
pub unsafe fn ldmatrix_x4_x(p: *const u16, x: u32, off: usize) -> [u32; 4] {
    // SAFETY: caller contract (the moved address is the row to read).
    unsafe { ldmatrix_x4(xor_offset(p, x, off)) }
}

/// [`ldmatrix_x4_trans`] at `p`'s workgroup-memory offset XOR `x`, plus
/// `off` halves.
#[inline(always)]
pub unsafe fn ldmatrix_x4_trans_x(p: *const u16, x: u32, off: usize) -> [u32; 4] {
    // SAFETY: as for `ldmatrix_x4_x`.
    unsafe { ldmatrix_x4_trans(xor_offset(p, x, off)) }
}

/// `mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32`, emulated.
#[inline(always)]
pub fn mma_m16n8k16(a: [u32; 4], b: [u32; 2], c: [f32; 4]) -> [f32; 4] {
    let mut regs = emu::MatrixRegs { a, b, c };
    emu::run_matrix(emu::MatrixOp::Mma16816, &mut regs);
    regs.c
}

/// `mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32`, emulated.
#[inline(always)]
pub fn mma_m16n8k8(a: [u32; 2], b: u32, c: [f32; 4]) -> [f32; 4] {
    let mut regs = emu::MatrixRegs {
        a: [a[0], a[1], 0, 0],
        b: [b, 0],
        c,
    };
    emu::run_matrix(emu::MatrixOp::Mma1688, &mut regs);
    regs.c
}

/// `v_mfma_f32_16x16x16f16`, emulated.
#[inline(always)]
pub fn mfma_16x16x16_f16(a: [u32; 2], b: [u32; 2], c: [f32; 4]) -> [f32; 4] {
    let mut regs = emu::MatrixRegs {
        a: [a[0], a[1], 0, 0],
        b,
        c,
    };
    emu::run_matrix(emu::MatrixOp::Mfma16x16x16, &mut regs);
    regs.c
}

#[inline(always)]
pub fn sched_barrier() {}

#[inline(always)]
pub fn wave_barrier() {
    // Every lane of the wave suspends here until all have arrived, as at
    // any exchange (xor 0: each lane gets its own value back).
    emu::collective(emu::Op::ShflXor { value: 0, mask: 0 });
}

#[inline(always)]
pub fn wave_uniform(v: u32) -> u32 {
    v
}

pub use super::scalar::{
    below_scaled_h2, copy_from_workgroup, copy_to_workgroup, copy_to_workgroup_fence,
    copy_to_workgroup_wait, copy_to_workgroup_wait_older, odd_bytes,
};
