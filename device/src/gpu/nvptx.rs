//! NVIDIA (warp32) primitives through `core::arch::nvptx` and NVVM intrinsics.
use core::arch::nvptx as n;
use wavefuse_shared::Target;

pub const TARGET: Target = Target::Nvptx;

unsafe extern "C" {
    #[link_name = "llvm.nvvm.shfl.sync.bfly.i32"]
    fn shfl_sync_bfly_i32(member_mask: u32, v: u32, lane_mask: u32, clamp: u32) -> u32;
    #[link_name = "llvm.nvvm.shfl.sync.idx.i32"]
    fn shfl_sync_idx_i32(member_mask: u32, v: u32, src_lane: u32, clamp: u32) -> u32;
    #[link_name = "llvm.nvvm.bar.warp.sync"]
    fn bar_warp_sync(member_mask: u32);
    #[link_name = "llvm.nvvm.vote.any.sync"]
    fn vote_any_sync(member_mask: u32, pred: bool) -> bool;
    // `core::intrinsics::exp2f32` lowers to `ex2.approx.f32`, whose
    // subnormal handling costs four extra instructions per call; the
    // throughput-bound kernels use the flush-to-zero form directly.
    #[link_name = "llvm.nvvm.ex2.approx.ftz.f"]
    fn nvvm_ex2_approx_ftz(x: f32) -> f32;
    #[link_name = "llvm.nvvm.rcp.approx.ftz.f"]
    fn nvvm_rcp_approx_ftz(x: f32) -> f32;
    #[link_name = "llvm.nvvm.rsqrt.approx.f"]
    fn nvvm_rsqrt_approx(x: f32) -> f32;
}

/// Two halves as one 32-bit register (`.f16x2`).
#[repr(simd)]
#[derive(Clone, Copy)]
struct H2([f16; 2]);

/// Two `f32`, for the packed conversions.
#[repr(simd)]
#[derive(Clone, Copy)]
struct F2([f32; 2]);

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
pub fn wave_any(p: bool) -> bool {
    // SAFETY: as for `shfl_xor_u32`: the whole warp reaches it.
    unsafe { vote_any_sync(u32::MAX, p) }
}

#[inline(always)]
pub fn shfl_idx_u32(v: u32, src: u32) -> u32 {
    // SAFETY: as for `shfl_xor_u32`; `src` < 32 (facade contract).
    unsafe { shfl_sync_idx_i32(u32::MAX, v, src, 0x1f) }
}

/// A 128-byte-aligned type: declaring the launch-sized workgroup memory
/// through it makes the PTX say `.align 128`, which the address XORs of
/// swizzled tiles (`ldmatrix_x4_x`) rely on.
#[repr(C, align(128))]
struct WorkgroupAlign([u8; 128]);

#[inline(always)]
pub fn workgroup_mem<T>() -> *mut T {
    core::intrinsics::gpu::gpu_launch_sized_workgroup_mem::<WorkgroupAlign>().cast::<T>()
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
    // SAFETY: a pure arithmetic intrinsic, defined for every input.
    unsafe { nvvm_rsqrt_approx(x) }
}

#[inline(always)]
pub fn exp2_approx(x: f32) -> f32 {
    // SAFETY: a pure arithmetic intrinsic, defined for every input.
    unsafe { nvvm_ex2_approx_ftz(x) }
}

#[inline(always)]
pub fn recip_approx(x: f32) -> f32 {
    // SAFETY: a pure arithmetic intrinsic, defined for every input.
    unsafe { nvvm_rcp_approx_ftz(x) }
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
    // SAFETY: an element-wise f32 -> f16 conversion of a two-lane vector
    // (`fptrunc <2 x float>`: one `cvt.rn.f16x2.f32`); H2 and u32 are both
    // 4 bytes.
    unsafe {
        let h: H2 = core::intrinsics::simd::simd_cast(F2([lo, hi]));
        core::mem::transmute::<H2, u32>(h)
    }
}

#[inline(always)]
pub fn add_h2(a: u32, b: u32) -> u32 {
    // SAFETY: H2 and u32 are both 4 bytes; an element-wise f16 add (one
    // `add.rn.f16x2`).
    unsafe {
        let s: H2 = core::intrinsics::simd::simd_add(
            core::mem::transmute::<u32, H2>(a),
            core::mem::transmute::<u32, H2>(b),
        );
        core::mem::transmute::<H2, u32>(s)
    }
}

#[inline(always)]
pub fn odd_bytes(a: u32, b: u32) -> u32 {
    let d: u32;
    // SAFETY: register arithmetic only.
    unsafe {
        core::arch::asm!(
            "prmt.b32 {d}, {a}, {b}, 0x7531;",
            d = out(reg32) d,
            a = in(reg32) a,
            b = in(reg32) b,
            options(pure, nomem, nostack, preserves_flags)
        );
    }
    d
}

#[inline(always)]
pub fn below_scaled_h2(z: u32, x: u32, k: u16) -> u32 {
    use core::intrinsics::simd::{simd_fabs, simd_fma, simd_neg};
    let k = f16::from_bits(k);
    // SAFETY: H2 and u32 are both 4 bytes; element-wise f16 arithmetic
    // (`fma.rn.f16x2`, the absolute values as operand modifiers).
    unsafe {
        let h = |w: u32| core::mem::transmute::<u32, H2>(w);
        let d: H2 = simd_fma(simd_fabs(h(x)), simd_neg(H2([k, k])), simd_fabs(h(z)));
        core::mem::transmute::<H2, u32>(d)
    }
}

#[inline(always)]
pub fn widen2(w: u32) -> [f32; 2] {
    // SAFETY: H2 and u32 are both 4 bytes; an element-wise widening.
    unsafe {
        let f: F2 = core::intrinsics::simd::simd_cast(core::mem::transmute::<u32, H2>(w));
        core::mem::transmute::<F2, [f32; 2]>(f)
    }
}

/// An `mma` accumulator (four `.f32`).
#[repr(C)]
#[derive(Clone, Copy)]
struct F4(f32, f32, f32, f32);

// The declaration `../shared/TOOLCHAIN.md` records as compiling with the
// pinned nightly (SASS: HMMA.16816.F32). The intrinsic is convergent in
// LLVM, which inline assembly cannot be.
#[allow(improper_ctypes)]
unsafe extern "unadjusted" {
    // `.f32.f32`: D and C types; A and B are f16.
    #[link_name = "llvm.nvvm.mma.m16n8k16.row.col.f32.f32"]
    fn mma_m16n8k16_f32(
        a0: H2,
        a1: H2,
        a2: H2,
        a3: H2,
        b0: H2,
        b1: H2,
        c0: f32,
        c1: f32,
        c2: f32,
        c3: f32,
    ) -> F4;
    #[link_name = "llvm.nvvm.mma.m16n8k8.row.col.f32.f32"]
    fn mma_m16n8k8_f32(a0: H2, a1: H2, b0: H2, c0: f32, c1: f32, c2: f32, c3: f32) -> F4;
}

/// The 32-bit shared-window address of `p`, which points into workgroup
/// memory: its distance from the launch-sized workgroup memory (exact
/// modulo 2^32, both lie in the shared window) plus that memory's shared
/// address (`cvta.to.shared`). LLVM folds the distance of a pointer
/// derived from [`workgroup_mem`] to offset arithmetic, so an `ldmatrix`
/// address becomes one register plus an immediate; through the generic
/// form each address was a 64-bit add, moves and a generic-to-shared
/// conversion (about 230 of the window attention's 1,040 instructions per
/// strip in the SASS of one build). The distance is taken before the
/// truncation: truncating both pointers first left a generic address and
/// its conversion per `ldmatrix` row address computed before the strips
/// (63 more instructions per wave and window in sm_90 SASS).
#[inline(always)]
fn shared_addr(p: *const u16) -> u32 {
    let g = workgroup_mem::<u16>();
    let s: u32;
    // SAFETY: address arithmetic on registers only.
    unsafe {
        core::arch::asm!(
            "{{",
            ".reg .b64 t;",
            "cvta.to.shared.u64 t, {g};",
            "cvt.u32.u64 {s}, t;",
            "}}",
            g = in(reg64) g,
            s = out(reg32) s,
            options(pure, nomem, nostack, preserves_flags)
        );
    }
    ((p as usize).wrapping_sub(g as usize) as u32).wrapping_add(s)
}

// `ldmatrix` through inline PTX on a shared-window address (the NVVM
// intrinsic takes a generic pointer only). LLVM does not treat inline
// assembly as convergent, so, as for every collective of the facade, the
// caller keeps the whole warp present (`../shared/TOOLCHAIN.md`'s asm
// route); `mma` stays the convergent intrinsic. The asm, at a 32-bit
// shared address; the caller's `unsafe` block covers it.
macro_rules! ldmatrix_at {
    ($op:literal, $a:expr) => {{
        let (r0, r1, r2, r3): (u32, u32, u32, u32);
        core::arch::asm!(
            concat!($op, " {{{r0}, {r1}, {r2}, {r3}}}, [{a}];"),
            a = in(reg32) $a,
            r0 = out(reg32) r0,
            r1 = out(reg32) r1,
            r2 = out(reg32) r2,
            r3 = out(reg32) r3,
            options(readonly, nostack, preserves_flags)
        );
        [r0, r1, r2, r3]
    }};
}

// Each `ldmatrix` form twice: at `p`, and at `p`'s shared address XOR `x`
// plus `off` halves (a swizzled tile's second 16-column half from its
// first half's lane address in the tile's first rows). The XOR equals
// XORing the offset in workgroup memory (the emulator's form) because the
// launch-sized workgroup memory is declared 128-byte aligned
// ([`workgroup_mem`]); XORing the offset before adding the base instead
// kept more registers live (ptxas: 116 bytes of spills in the mask entry
// against 20). `off` is added after the XOR so that one register plus an
// immediate serves every row block.
macro_rules! ldmatrix {
    ($name:ident, $name_x:ident, $op:literal) => {
        #[inline(always)]
        pub unsafe fn $name(p: *const u16) -> [u32; 4] {
            // SAFETY: caller contract (workgroup memory, 16-byte aligned
            // rows, the whole warp); the asm reads only workgroup memory.
            unsafe { ldmatrix_at!($op, shared_addr(p)) }
        }

        #[inline(always)]
        pub unsafe fn $name_x(p: *const u16, x: u32, off: usize) -> [u32; 4] {
            // SAFETY: as for the plain form (caller contract: the moved
            // address is the row to read).
            unsafe { ldmatrix_at!($op, (shared_addr(p) ^ x).wrapping_add(2 * off as u32)) }
        }
    };
}
/// `ldmatrix.sync.aligned.m8n8.x2.shared.b16`: lanes 0..16 give the rows
/// of two 8x8 matrices (lanes 16.. are not read).
#[inline(always)]
pub unsafe fn ldmatrix_x2(p: *const u16) -> [u32; 2] {
    let (r0, r1): (u32, u32);
    // SAFETY: caller contract (workgroup memory, 16-byte aligned rows, the
    // whole warp); the asm reads only workgroup memory.
    unsafe {
        core::arch::asm!(
            "ldmatrix.sync.aligned.m8n8.x2.shared.b16 {{{r0}, {r1}}}, [{a}];",
            a = in(reg32) shared_addr(p),
            r0 = out(reg32) r0,
            r1 = out(reg32) r1,
            options(readonly, nostack, preserves_flags)
        )
    };
    [r0, r1]
}

ldmatrix!(
    ldmatrix_x4,
    ldmatrix_x4_x,
    "ldmatrix.sync.aligned.m8n8.x4.shared.b16"
);
ldmatrix!(
    ldmatrix_x4_trans,
    ldmatrix_x4_trans_x,
    "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16"
);

#[inline(always)]
pub fn mma_m16n8k8(a: [u32; 2], b: u32, c: [f32; 4]) -> [f32; 4] {
    let h = |w: u32| {
        // SAFETY: H2 and u32 are both 4 bytes.
        unsafe { core::mem::transmute::<u32, H2>(w) }
    };
    // SAFETY: register-only arithmetic; the whole warp executes it (facade
    // contract).
    let d = unsafe { mma_m16n8k8_f32(h(a[0]), h(a[1]), h(b), c[0], c[1], c[2], c[3]) };
    [d.0, d.1, d.2, d.3]
}

#[inline(always)]
pub fn mma_m16n8k16(a: [u32; 4], b: [u32; 2], c: [f32; 4]) -> [f32; 4] {
    let h = |w: u32| {
        // SAFETY: H2 and u32 are both 4 bytes.
        unsafe { core::mem::transmute::<u32, H2>(w) }
    };
    // SAFETY: register-only arithmetic; the whole warp executes it (facade
    // contract).
    let d = unsafe {
        mma_m16n8k16_f32(
            h(a[0]),
            h(a[1]),
            h(a[2]),
            h(a[3]),
            h(b[0]),
            h(b[1]),
            c[0],
            c[1],
            c[2],
            c[3],
        )
    };
    [d.0, d.1, d.2, d.3]
}

#[inline(always)]
pub fn sched_barrier() {}

#[inline(always)]
pub unsafe fn copy_to_workgroup(dst: *mut u16, src: *const u16) {
    // No NVVM intrinsic takes generic pointers, hence inline PTX; not a
    // collective, so convergence does not matter. Without `nomem` the
    // compiler keeps memory accesses on its side of the asm. The
    // destination as a 32-bit shared address ([`shared_addr`]): through
    // the generic form each one was 64-bit arithmetic plus a conversion.
    // SAFETY: caller contract (`src` global, `dst` workgroup memory, 16
    // aligned bytes each).
    unsafe {
        core::arch::asm!(
            "{{",
            ".reg .b64 g;",
            "cvta.to.global.u64 g, {g};",
            "cp.async.cg.shared.global [{d}], [g], 16;",
            "}}",
            d = in(reg32) shared_addr(dst),
            g = in(reg64) src,
            options(nostack, preserves_flags)
        );
    }
}

#[inline(always)]
pub unsafe fn copy_from_workgroup(dst: *mut u16, src: *const u16) {
    // One 16-byte load and one 16-byte store, explicitly: a `V8` read and
    // written in Rust became a 16-byte `memcpy`, which LLVM lowered as two
    // 8-byte loads and stores. Without `nomem` the compiler keeps memory
    // accesses on their side of the asm.
    // SAFETY: caller contract (`src` workgroup memory, `dst` global, 16
    // aligned bytes each).
    unsafe {
        core::arch::asm!(
            "{{",
            ".reg .b64 g;",
            ".reg .b32 a, b, c, d;",
            "cvta.to.global.u64 g, {g};",
            "ld.shared.v4.b32 {{a, b, c, d}}, [{s}];",
            "st.global.v4.b32 [g], {{a, b, c, d}};",
            "}}",
            s = in(reg32) shared_addr(src),
            g = in(reg64) dst,
            options(nostack, preserves_flags)
        );
    }
}

#[inline(always)]
pub fn copy_to_workgroup_fence() {
    // SAFETY: commits this thread's pending cp.async copies as a group.
    unsafe { core::arch::asm!("cp.async.commit_group;", options(nostack, preserves_flags)) }
}

#[inline(always)]
pub fn copy_to_workgroup_wait_older() {
    // SAFETY: waits for all but this thread's newest cp.async group.
    unsafe { core::arch::asm!("cp.async.wait_group 1;", options(nostack, preserves_flags)) }
}

#[inline(always)]
pub fn copy_to_workgroup_wait() {
    // SAFETY: waits for this thread's cp.async groups; no operands.
    unsafe { core::arch::asm!("cp.async.wait_all;", options(nostack, preserves_flags)) }
}

#[inline(always)]
pub fn wave_barrier() {
    // SAFETY: the whole warp reaches it (facade contract).
    unsafe { bar_warp_sync(u32::MAX) }
}

#[inline(always)]
pub fn wave_uniform(v: u32) -> u32 {
    v
}
