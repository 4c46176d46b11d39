//! Which instruction set a kernel build targets: the one notion of "target"
//! that the device crate (at compile time, `gpu::TARGET`) and the host (at
//! run time, from the backend it opened) both read, so that a launch shape
//! that depends on the target is chosen by the same function on both sides.

/// A kernel build's instruction set.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Target {
    /// NVIDIA PTX (warp of 32).
    Nvptx,
    /// AMD gfx9 code objects (wavefront of 64).
    Amdgpu,
    /// The host build, run by the SIMT emulator in either wave mode.
    Host,
}

impl Target {
    /// Threads in the smallest workgroup of a kernel build: one NVIDIA warp
    /// (32) or one gfx9 wavefront (64). The host (emulator) build uses 64:
    /// one build serves both emulated wave modes, and 64 threads are two
    /// whole warps in wave32.
    pub const fn min_block(self) -> u32 {
        match self {
            Target::Nvptx => 32,
            Target::Amdgpu | Target::Host => 64,
        }
    }
}
