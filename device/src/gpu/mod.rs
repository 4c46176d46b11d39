//! The one place kernels meet the hardware.
//!
//! Each target provides the same small set of primitives: ids, the wave
//! size, a workgroup barrier, butterfly and indexed lane exchanges,
//! launch-sized workgroup memory and one cache-policy load. Group
//! reductions are built here from the exchanges, once for every target.
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
/// Inductor does for its index loads); measured on the H200, this made the
/// gather 0.2-1.3% faster. A plain load on the other targets.
///
/// # Safety
/// `p` must be valid for reading an aligned `i32`.
#[inline(always)]
pub unsafe fn load_i32_keep(p: *const i32) -> i32 {
    // SAFETY: caller contract.
    unsafe { imp::load_i32_keep(p) }
}
