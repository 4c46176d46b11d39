//! Opening a device, streams and events.
use crate::backend::{self, Backend, EventHandle};
use crate::{Error, Result};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

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
    pub fn target(self) -> wavefuse_shared::Target {
        match self {
            BackendKind::Cuda => wavefuse_shared::Target::Nvptx,
            BackendKind::Hip => wavefuse_shared::Target::Amdgpu,
            BackendKind::Cpu => wavefuse_shared::Target::Host,
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

/// Which device to open.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Choice {
    /// First that works: CUDA device 0, HIP device 0, then the CPU emulator (wave64).
    Auto,
    /// CUDA device by ordinal.
    Cuda(usize),
    /// HIP device by ordinal.
    Hip(usize),
    /// The CPU emulator.
    Cpu(Wave),
}

impl Choice {
    /// Parses `auto`, `cuda[:N]`, `hip[:N]`, `cpu` / `cpu64`, `cpu32`.
    pub fn parse(s: &str) -> Option<Choice> {
        let (name, n) = match s.split_once(':') {
            Some((a, b)) => (a, b.parse().ok()?),
            None => (s, 0),
        };
        Some(match name {
            "auto" => Choice::Auto,
            "cuda" => Choice::Cuda(n),
            "hip" => Choice::Hip(n),
            "cpu" | "cpu64" => Choice::Cpu(Wave::W64),
            "cpu32" => Choice::Cpu(Wave::W32),
            _ => return None,
        })
    }
}

/// What a device is.
#[derive(Clone, Debug)]
pub struct DeviceInfo {
    /// Backend.
    pub backend: BackendKind,
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
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// An open device with its module loaded and one stream.
#[derive(Clone)]
pub struct Device {
    pub(crate) be: Arc<dyn Backend>,
    pub(crate) id: u64,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device").field("info", self.info()).finish()
    }
}

impl Device {
    /// Opens a device and loads the code object that matches it.
    pub fn open(choice: Choice) -> Result<Device> {
        let be: Arc<dyn Backend> = match choice {
            Choice::Auto => {
                if let Ok(b) = backend::cuda::open(0) {
                    Arc::new(b)
                } else if let Ok(b) = backend::hip::open(0) {
                    Arc::new(b)
                } else {
                    Arc::new(backend::cpu::Cpu::new(Wave::W64))
                }
            }
            Choice::Cuda(n) => Arc::new(backend::cuda::open(n)?),
            Choice::Hip(n) => Arc::new(backend::hip::open(n)?),
            Choice::Cpu(w) => Arc::new(backend::cpu::Cpu::new(w)),
        };
        Ok(Device {
            be,
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
        })
    }

    /// Every backend that opens on this machine (CPU emulator in both wave modes last).
    pub fn all_present() -> Vec<Device> {
        let mut v = Vec::new();
        for c in [
            Choice::Cuda(0),
            Choice::Hip(0),
            Choice::Cpu(Wave::W64),
            Choice::Cpu(Wave::W32),
        ] {
            if let Ok(d) = Device::open(c) {
                v.push(d);
            }
        }
        v
    }

    /// What this device is.
    pub fn info(&self) -> &DeviceInfo {
        self.be.info()
    }

    /// Waits until all queued work has finished.
    pub fn synchronize(&self) -> Result<()> {
        self.be.synchronize()
    }

    /// Records an event on the device's stream.
    pub fn record(&self) -> Result<Event> {
        Ok(Event {
            h: self.be.record()?,
            be: self.be.clone(),
        })
    }

    /// (free, total) device memory in bytes.
    pub fn mem_info(&self) -> Result<(usize, usize)> {
        self.be.mem_info()
    }

    pub(crate) fn check_same(
        &self,
        other: u64,
        op: &'static str,
        what: &'static str,
    ) -> Result<()> {
        if other == self.id {
            Ok(())
        } else {
            Err(Error::WrongDevice { op, what })
        }
    }
}

/// A point in the device's stream.
pub struct Event {
    h: EventHandle,
    be: Arc<dyn Backend>,
}

impl Event {
    /// Milliseconds from `start` to this event (both must have completed;
    /// this waits for `self`).
    pub fn elapsed_ms(&self, start: &Event) -> Result<f32> {
        self.be.elapsed_ms(&start.h, &self.h)
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        self.be.destroy_event(&self.h);
    }
}
