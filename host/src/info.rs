//! What a device is: plain data shared by every layer (the backends below
//! and the device/stream API above), so that no backend imports anything
//! above it.
use wavefuse_shared::Target;

/// Which runtime drives a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BackendKind {
    /// NVIDIA, CUDA driver API (libcuda opened at run time).
    Cuda,
    /// AMD, HIP module API (libamdhip64 opened at run time).
    Hip,
    /// The host SIMT emulator.
    Cpu,
}

impl BackendKind {
    /// The kernel build this backend runs.
    pub fn target(self) -> Target {
        match self {
            BackendKind::Cuda => Target::Nvptx,
            BackendKind::Hip => Target::Amdgpu,
            BackendKind::Cpu => Target::Host,
        }
    }
}

/// Lanes per wave for the CPU emulator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Wave {
    /// NVIDIA warps.
    W32,
    /// gfx9 / CDNA wavefronts (the AMD layouts).
    W64,
}

impl Wave {
    /// Lanes.
    pub fn lanes(self) -> u32 {
        match self {
            Wave::W32 => 32,
            Wave::W64 => 64,
        }
    }
}

/// What a device is.
#[derive(Clone, Debug)]
pub struct DeviceInfo {
    /// Backend.
    pub backend: BackendKind,
    /// Device ordinal within its backend (0 for the emulator).
    pub ordinal: usize,
    /// Marketing name (`NVIDIA H200`, ...).
    pub name: String,
    /// Architecture the code object was chosen for (`sm_90`, `gfx90a`, `cpu-wave64`).
    pub arch: String,
    /// Code object actually loaded (`sm_90` PTX, `gfx90a` ELF, `host`).
    pub code_object: String,
    /// Driver / runtime version.
    pub driver: String,
    /// Lanes per wave.
    pub wave: u32,
    /// Last-level cache bytes (0 when unknown).
    pub l2_bytes: usize,
    /// Device memory bytes.
    pub total_mem: usize,
    /// Time to create the context and load the module, in milliseconds.
    pub load_ms: f64,
    /// With [`crate::Choice::Auto`]: the backends tried first that did not
    /// open, each with the reason (empty otherwise).
    pub skipped: Vec<(BackendKind, String)>,
}
