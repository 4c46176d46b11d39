//! The one place kernels meet the hardware.
//!
//! Each target provides the same small set of primitives: ids, the wave
//! size, workgroup and wave barriers, butterfly and indexed lane exchanges,
//! launch-sized workgroup memory and asynchronous copies into it, one
//! cache-policy load, f16 conversions, the few arithmetic instructions
//! whose hardware form differs from IEEE (approximate `exp2`, reciprocal,
//! reciprocal square root), two compiler hints ([`sched_barrier`],
//! [`wave_uniform`]) and the matrix units ([`mma`]). Group
//! reductions are built here from the exchanges, once for every target.
//! Nothing outside this module (and its per-target files) names a
//! `target_arch`.
//!
//! Halves cross the kernel ABI as `u16` bits. On the GPU targets they are
//! converted with core's `f16` (native conversion instructions); on the
//! host with the `half` crate (the same round-to-nearest-even bits), so the
//! host build, and with it the emulator, needs no nightly feature.
//!
//! Collectives (exchanges, reductions, barriers) must be reached by every
//! lane of the wave (every thread of the block for [`barrier`]): guard work
//! with predicates, never return early before a collective. The emulator
//! reports a partial collective as an error.

#[cfg(target_arch = "amdgpu")]
mod amdgpu;
#[cfg(target_arch = "amdgpu")]
use amdgpu as imp;

#[cfg(target_arch = "nvptx64")]
mod nvptx;
#[cfg(target_arch = "nvptx64")]
use nvptx as imp;

#[cfg(not(any(target_arch = "amdgpu", target_arch = "nvptx64")))]
mod host;
#[cfg(not(any(target_arch = "amdgpu", target_arch = "nvptx64")))]
use host as imp;

#[cfg(not(target_arch = "nvptx64"))]
mod scalar;

pub mod mma;

/// A rare path as its own function: a real call on NVIDIA (`#[inline(never)]`:
/// ptxas allocates the caller's fast path without the callee's state),
/// inlined elsewhere (a call on gfx9 needs a stack in scratch memory; the
/// host build is the emulator, where inlining changes nothing). The same
/// source runs on every target.
#[macro_export]
macro_rules! out_of_line {
    ($item:item) => {
        #[cfg_attr(target_arch = "nvptx64", inline(never))]
        #[cfg_attr(not(target_arch = "nvptx64"), inline(always))]
        $item
    };
}

pub use wavefuse_shared::Target;

/// The instruction set of this build.
pub const TARGET: Target = imp::TARGET;

/// Thread index within the workgroup (x).
#[inline(always)]
pub fn thread_id() -> u32 {
    imp::thread_id()
}

/// Workgroup index within the grid (x).
#[inline(always)]
pub fn block_id() -> u32 {
    imp::block_id()
}

/// Workgroup index within the grid (y).
#[inline(always)]
pub fn block_id_y() -> u32 {
    imp::block_id_y()
}

/// Lanes per wave: 64 on gfx9 AMDGPU, 32 on NVIDIA, either in the emulator.
#[inline(always)]
pub fn wave_size() -> u32 {
    imp::wave_size()
}

/// Workgroup barrier with workgroup-scope memory ordering.
#[inline(always)]
pub fn barrier() {
    imp::barrier()
}

/// Butterfly exchange: returns `v` from lane `lane ^ mask` of this wave.
/// `mask` must be below the wave size and the same on every lane.
#[inline(always)]
pub fn shfl_xor_u32(v: u32, mask: u32) -> u32 {
    imp::shfl_xor_u32(v, mask)
}

/// [`shfl_xor_u32`] for `f32`.
#[inline(always)]
pub fn shfl_xor_f32(v: f32, mask: u32) -> f32 {
    f32::from_bits(shfl_xor_u32(v.to_bits(), mask))
}

/// Sum over aligned groups of `LANES` consecutive lanes (a power of two, at
/// most 32); every lane of the group gets the sum. The order of additions
/// is the same on every target, so results match bit for bit.
#[inline(always)]
pub fn group_sum<const LANES: u32>(v: f32) -> f32 {
    group_sum_n::<LANES, 1>([v])[0]
}

/// [`group_sum`] of `N` independent values at once, one exchange of each
/// per butterfly step, so that their latencies overlap instead of adding
/// up. Same order of additions as [`group_sum`], so the same bits.
#[inline(always)]
#[allow(clippy::needless_range_loop)]
pub fn group_sum_n<const LANES: u32, const N: usize>(mut v: [f32; N]) -> [f32; N] {
    let mut mask = 1;
    while mask < LANES {
        // Index loops, not iterators: they unroll before SROA, so the
        // arrays stay in registers (iterators left them in local memory).
        let mut o = [0.0f32; N];
        for r in 0..N {
            o[r] = shfl_xor_f32(v[r], mask);
        }
        for r in 0..N {
            v[r] += o[r];
        }
        mask <<= 1;
    }
    v
}

/// Whether `p` holds on any lane of the wave (every lane gets the answer),
/// so a branch on it is uniform and may contain collectives: NVIDIA
/// `vote.sync.any`, AMD a ballot, the emulator a butterfly OR.
#[inline(always)]
pub fn wave_any(p: bool) -> bool {
    imp::wave_any(p)
}

/// Max over aligned groups of `LANES` consecutive lanes (see [`group_sum`]).
/// NaN propagates.
#[inline(always)]
pub fn group_max<const LANES: u32>(mut v: f32) -> f32 {
    let mut mask = 1;
    while mask < LANES {
        let o = shfl_xor_f32(v, mask);
        v = if v.is_nan() || o.is_nan() {
            f32::NAN
        } else if o > v {
            o
        } else {
            v
        };
        mask <<= 1;
    }
    v
}

/// Lane `src`'s `v` (an indexed exchange within the wave). Every lane of
/// the wave must call it together, each with `src` below the wave size.
#[inline(always)]
pub fn shfl_idx_u32(v: u32, src: u32) -> u32 {
    imp::shfl_idx_u32(v, src)
}

/// [`shfl_idx_u32`] for `f32`.
#[inline(always)]
pub fn shfl_idx_f32(v: f32, src: u32) -> f32 {
    f32::from_bits(shfl_idx_u32(v.to_bits(), src))
}

/// Workgroup memory sized by the launch (`shared_bytes`), aligned for `T`.
#[inline(always)]
pub fn workgroup_mem<T>() -> *mut T {
    imp::workgroup_mem::<T>()
}

/// Square root with IEEE rounding.
#[inline(always)]
pub fn sqrt(x: f32) -> f32 {
    imp::sqrt(x)
}

/// Stops the kernel (a bug the host API's checks should have made impossible).
#[inline(always)]
pub fn trap() -> ! {
    imp::trap()
}

/// Reads an `i32` that later launches read again (a gather table reused for
/// every launch). On NVIDIA the load carries an L2 `evict_last` policy, so
/// the table stays resident while the streamed tokens pass through L2 (as
/// Inductor does for its index loads). A plain load on the other targets.
///
/// # Safety
/// `p` must be valid for reading an aligned `i32`.
#[inline(always)]
pub unsafe fn load_i32_keep(p: *const i32) -> i32 {
    // SAFETY: caller contract.
    unsafe { imp::load_i32_keep(p) }
}

/// `a * b + c` with one rounding.
#[inline(always)]
pub fn fma(a: f32, b: f32, c: f32) -> f32 {
    imp::fma(a, b, c)
}

/// `a * b + c` in f64 with one rounding (`v_fma_f64`, `fma.rn.f64`).
#[inline(always)]
pub fn fma_f64(a: f64, b: f64, c: f64) -> f64 {
    imp::fma_f64(a, b, c)
}

/// `1 / sqrt(x)`: on NVIDIA the hardware's `rsqrt.approx.f32` (relative
/// error below 2^-22.9, subnormal inputs handled, one MUFU.RSQ where
/// `sqrt.rn` + `rcp.rn` cost two slow-path branches), as torch.compile's
/// LayerNorm kernels do; elsewhere (gfx9, the emulator) an IEEE square root
/// and division. `rsqrt(0) = inf`, NaN gives NaN.
#[inline(always)]
pub fn rsqrt(x: f32) -> f32 {
    imp::rsqrt(x)
}

/// `2^x` through the hardware's approximation on the GPU targets
/// (`ex2.approx.ftz.f32` on NVIDIA: relative error below 2^-22; `v_exp_f32`
/// on AMD, about 1 ulp), `exp2f` on the host. Subnormal inputs and results
/// are flushed to zero on the GPUs.
#[inline(always)]
pub fn exp2_approx(x: f32) -> f32 {
    imp::exp2_approx(x)
}

/// `1 / x` from the hardware's approximate reciprocal (`rcp.approx.ftz.f32`
/// on NVIDIA, `v_rcp_f32` on AMD: within 1 ulp, one instruction), exact
/// division on the host.
#[inline(always)]
pub fn recip_approx(x: f32) -> f32 {
    imp::recip_approx(x)
}

/// The half with bits `h`, widened to `f32` (exact).
#[inline(always)]
pub fn h2f(h: u16) -> f32 {
    imp::h2f(h)
}

/// `x` rounded to the nearest half (ties to even), as bits.
#[inline(always)]
pub fn f2h(x: f32) -> u16 {
    imp::f2h(x)
}

/// The correctly rounded f16 sum of two halves (bits in, bits out).
#[inline(always)]
pub fn add_f16(a: u16, b: u16) -> u16 {
    imp::add_f16(a, b)
}

/// Two `f32` rounded to halves (nearest-even), `lo` in the low 16 bits: one
/// `cvt.rn.f16x2.f32` on NVIDIA (two conversions and a byte permute
/// otherwise).
#[inline(always)]
pub fn pack2(lo: f32, hi: f32) -> u32 {
    imp::pack2(lo, hi)
}

/// The two halves of `a` and `b` added pairwise, each sum rounded once to
/// f16 (the f32 sum of two halves rounded to f16 is the correctly rounded
/// f16 sum): one `add.rn.f16x2` (HADD2) on NVIDIA on the words as loaded.
#[inline(always)]
pub fn add_h2(a: u32, b: u32) -> u32 {
    imp::add_h2(a, b)
}

/// Per half of the packed f16 pairs `z` and `x`: bit 15 (low half) or 31
/// (high half) of the result is set when `|z| < k |x|` holds exactly, `k`
/// a positive f16. Other bits are unspecified: callers OR results together
/// and test `0x8000_8000`. False where `z` or `x` is NaN.
///
/// NVIDIA: one `fma.rn.f16x2` of `|x| * -k + |z|` (HFMA2 with operand
/// modifiers on the words as loaded and stored): round-to-nearest keeps
/// the sign of the exact sum and gives +0 for an exact 0, so the sign bit
/// is the comparison. Elsewhere: the comparison in f32, where `k |x|` of
/// two halves is exact.
#[inline(always)]
pub fn below_scaled_h2(z: u32, x: u32, k: u16) -> u32 {
    imp::below_scaled_h2(z, x, k)
}

/// Bytes 1 and 3 of `a`, then bytes 1 and 3 of `b`, as one word (from the
/// low byte up): the bytes that hold the sign bits of two packed f16
/// pairs. One `prmt.b32` on NVIDIA; shifts and masks elsewhere.
#[inline(always)]
pub fn odd_bytes(a: u32, b: u32) -> u32 {
    imp::odd_bytes(a, b)
}

/// The two halves of `w` widened to `f32` (low half first).
#[inline(always)]
pub fn widen2(w: u32) -> [f32; 2] {
    imp::widen2(w)
}

/// A fence for the compiler's instruction scheduler only (no instruction,
/// no memory ordering): nothing is moved across it. On AMD
/// `llvm.amdgcn.sched.barrier(0)`, which keeps the machine scheduler from
/// hoisting loads far above their use when that would exceed the register
/// budget (gfx9 builds must assume 1024-thread workgroups, hence 128
/// VGPRs); nothing elsewhere (ptxas schedules NVIDIA code on its own).
#[inline(always)]
pub fn sched_barrier() {
    imp::sched_barrier()
}

/// Copies 16 bytes from global memory at `src` to workgroup memory at
/// `dst` without passing through registers where the target can (NVIDIA
/// `cp.async.cg.shared.global`, sm_80+: the loads stay in flight while the
/// thread goes on); a load and a store elsewhere. The data is visible to
/// this thread only after [`copy_to_workgroup_wait`], to the workgroup
/// after that and a [`barrier`].
///
/// # Safety
/// `src` readable for 16 bytes (global memory), `dst` writable for 16
/// bytes of the launch-sized workgroup memory ([`workgroup_mem`]), both
/// 16-byte aligned.
#[inline(always)]
pub unsafe fn copy_to_workgroup(dst: *mut u16, src: *const u16) {
    // SAFETY: caller contract.
    unsafe { imp::copy_to_workgroup(dst, src) }
}

/// Copies 16 bytes from workgroup memory at `src` to global memory at
/// `dst`: one 16-byte load and one 16-byte store (NVIDIA
/// `ld.shared.v4` / `st.global.v4`), synchronous.
///
/// # Safety
/// `src` workgroup memory and `dst` global memory, each valid for 16
/// bytes and 16-byte aligned.
#[inline(always)]
pub unsafe fn copy_from_workgroup(dst: *mut u16, src: *const u16) {
    // SAFETY: caller contract.
    unsafe { imp::copy_from_workgroup(dst, src) }
}

/// Ends a group of this thread's [`copy_to_workgroup`] copies: those
/// started since the previous fence (NVIDIA `cp.async.commit_group`; the
/// other targets copy synchronously).
#[inline(always)]
pub fn copy_to_workgroup_fence() {
    imp::copy_to_workgroup_fence()
}

/// Waits for this thread's [`copy_to_workgroup`] copies started before its
/// last [`copy_to_workgroup_fence`] but one: every group but the newest
/// (NVIDIA `cp.async.wait_group 1`).
#[inline(always)]
pub fn copy_to_workgroup_wait_older() {
    imp::copy_to_workgroup_wait_older()
}

/// Waits for this thread's [`copy_to_workgroup`] copies.
#[inline(always)]
pub fn copy_to_workgroup_wait() {
    imp::copy_to_workgroup_wait()
}

/// Orders workgroup-memory accesses among the lanes of one wave: what a
/// lane wrote before it is visible to the wave's other lanes after it
/// (NVIDIA `bar.warp.sync`; AMD `wave_barrier`, the wave being in lockstep
/// with in-order LDS; in the emulator a wave collective). Every lane of the
/// wave must reach it.
#[inline(always)]
pub fn wave_barrier() {
    imp::wave_barrier()
}

/// `v`, which must be the same on every lane of the wave, marked as such:
/// on AMD `readfirstlane`, which moves it (and what is computed from it) to
/// scalar registers the compiler cannot prove uniform by itself (a wave
/// index from the thread id, say); the value itself elsewhere.
#[inline(always)]
pub fn wave_uniform(v: u32) -> u32 {
    imp::wave_uniform(v)
}
