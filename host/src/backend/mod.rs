//! Runtime backends behind one internal trait. Device memory is addressed
//! by plain 64-bit device addresses; ownership lives in `DeviceBuffer`.
pub mod cpu;
pub mod cuda;
pub mod hip;

use crate::Result;
use crate::device::DeviceInfo;

/// One kernel argument, as the kernel's ABI sees it.
#[derive(Clone, Copy, Debug)]
pub enum Arg {
    /// Device address.
    Ptr(u64),
    /// 64-bit integer.
    U64(u64),
    /// 32-bit integer.
    U32(u32),
    /// 32-bit float.
    F32(f32),
}

impl Arg {
    /// Pointers to each argument's value, in the form both driver APIs
    /// take (`kernelParams`: one pointer per kernel parameter). The
    /// pointers borrow `args`, which must outlive the launch call.
    pub fn param_ptrs(args: &mut [Arg]) -> Vec<*mut std::ffi::c_void> {
        args.iter_mut()
            .map(|a| match a {
                Arg::Ptr(p) | Arg::U64(p) => (p as *mut u64).cast(),
                Arg::U32(v) => (v as *mut u32).cast(),
                Arg::F32(v) => (v as *mut f32).cast(),
            })
            .collect()
    }
}

/// Grid and workgroup sizes of one launch.
#[derive(Clone, Copy, Debug)]
pub struct Launch {
    /// Workgroups (x, y).
    pub grid: (u32, u32),
    /// Threads per workgroup.
    pub block: u32,
    /// Launch-sized workgroup memory in bytes.
    pub shared_bytes: u32,
}

/// Opaque event handle.
pub enum EventHandle {
    /// Driver event.
    Gpu(usize),
    /// Host time.
    Cpu(std::time::Instant),
}

/// What every backend provides. All copies are ordered with the device's
/// one stream; `download` waits for it.
pub trait Backend: Send + Sync {
    fn info(&self) -> &DeviceInfo;
    fn alloc(&self, bytes: usize) -> Result<u64>;
    /// # Safety
    /// `ptr` came from `alloc` of this backend and is not used afterwards.
    unsafe fn free(&self, ptr: u64);
    /// # Safety
    /// `dst..dst+src.len()` lies in one allocation of this backend.
    unsafe fn upload(&self, dst: u64, src: &[u8]) -> Result<()>;
    /// # Safety
    /// `src..src+dst.len()` lies in one allocation of this backend.
    unsafe fn download(&self, dst: &mut [u8], src: u64) -> Result<()>;
    /// # Safety
    /// Both ranges lie in allocations of this backend.
    unsafe fn copy(&self, dst: u64, src: u64, bytes: usize) -> Result<()>;
    /// # Safety
    /// The arguments match the kernel's signature and every pointer is
    /// valid for what the kernel touches (the ops layer checks this).
    unsafe fn launch(&self, kernel: &'static str, l: Launch, args: &[Arg]) -> Result<()>;
    fn synchronize(&self) -> Result<()>;
    fn record(&self) -> Result<EventHandle>;
    fn elapsed_ms(&self, start: &EventHandle, end: &EventHandle) -> Result<f32>;
    fn destroy_event(&self, e: &EventHandle);
    fn mem_info(&self) -> Result<(usize, usize)>;
}
