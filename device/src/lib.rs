//! wavefuse's kernels, written once in `no_std` Rust.
//!
//! The same source compiles to AMDGPU code objects (`amdgcn-amd-amdhsa`,
//! wave64 on gfx9), to NVIDIA PTX (`nvptx64-nvidia-cuda`, warp32) and to the
//! host, where [`emu`] runs each workgroup as a set of SIMT threads with real
//! barriers and lane exchanges in wave64 or wave32 mode. Kernel bodies reach
//! the hardware only through [`gpu`].
#![no_std]
#![deny(missing_docs)]
#![cfg_attr(
    any(target_arch = "amdgpu", target_arch = "nvptx64"),
    allow(internal_features)
)]
// The GPU builds need nightly (`-Zbuild-std=core`, the kernel ABI, core's
// `f16`); the host build (the emulator) uses none of these and builds on
// stable.
#![cfg_attr(
    any(target_arch = "amdgpu", target_arch = "nvptx64"),
    feature(
        f16,
        abi_gpu_kernel,
        core_intrinsics,
        gpu_intrinsics,
        gpu_launch_sized_workgroup_mem
    )
)]
#![cfg_attr(
    target_arch = "amdgpu",
    feature(stdarch_amdgpu, link_llvm_intrinsics, repr_simd, simd_ffi)
)]
#![cfg_attr(
    target_arch = "nvptx64",
    feature(
        stdarch_nvptx,
        link_llvm_intrinsics,
        repr_simd,
        simd_ffi,
        abi_unadjusted,
        asm_experimental_arch
    )
)]

#[cfg(not(any(target_arch = "amdgpu", target_arch = "nvptx64")))]
extern crate std;

#[cfg(not(any(target_arch = "amdgpu", target_arch = "nvptx64")))]
pub mod emu;
pub mod gpu;
#[macro_use]
mod entry;
pub mod kernels;
pub mod math;
pub mod registry;
pub mod vec;

#[cfg(any(target_arch = "amdgpu", target_arch = "nvptx64"))]
#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    gpu::trap()
}
