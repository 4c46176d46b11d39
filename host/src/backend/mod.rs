//! Runtime backends behind one internal trait. The bottom layer: it knows
//! device addresses, raw stream and event handles and kernel ids, and
//! nothing of views, plans or ops above it.
//!
//! Streams and events cross this trait as plain integers (`CUstream`,
//! `hipStream_t`, ... cast to `usize`). Every operation that queues work
//! names its stream; wavefuse's own stream is [`Backend::own_stream`], and
//! a caller's stream is used only after [`Backend::check_stream`].
pub mod cpu;
pub mod cuda;
pub mod hip;

use crate::Result;
use crate::info::DeviceInfo;
use crate::registry::Kernel;

/// A stream handle (`CUstream`, `hipStream_t`; 0 is the legacy default
/// stream on the GPUs, the only stream of the emulator).
pub type RawStream = usize;
/// An event handle (`CUevent`, `hipEvent_t`, the emulator's own).
pub type RawEvent = usize;

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

/// What every backend provides.
pub trait Backend: Send + Sync {
    fn info(&self) -> &DeviceInfo;
    /// wavefuse's own stream (created at open, destroyed with the backend).
    fn own_stream(&self) -> RawStream;
    fn alloc(&self, bytes: usize) -> Result<u64>;
    /// # Safety
    /// `ptr` came from `alloc` of this backend, and no queued work uses it
    /// on any stream but the own stream (which this waits for).
    unsafe fn free(&self, ptr: u64);
    /// Copies on the own stream and waits for it.
    /// # Safety
    /// `dst..dst+src.len()` is device memory of this device.
    unsafe fn upload(&self, dst: u64, src: &[u8]) -> Result<()>;
    /// Copies on the own stream and waits for it.
    /// # Safety
    /// `src..src+dst.len()` is device memory of this device.
    unsafe fn download(&self, dst: &mut [u8], src: u64) -> Result<()>;
    /// # Safety
    /// Both ranges are device memory of this device; `stream` is the own
    /// stream or one that passed `check_stream`.
    unsafe fn copy(&self, dst: u64, src: u64, bytes: usize, stream: RawStream) -> Result<()>;
    /// # Safety
    /// The arguments match the kernel's parameters and every pointer is
    /// valid for what the kernel touches; `stream` as for `copy`.
    unsafe fn launch(&self, k: Kernel, l: Launch, args: &[Arg], stream: RawStream) -> Result<()>;
    /// # Safety
    /// `stream` as for `copy`.
    unsafe fn synchronize(&self, stream: RawStream) -> Result<()>;
    fn event_create(&self) -> Result<RawEvent>;
    /// # Safety
    /// `e` came from `event_create` and is not destroyed; `stream` as for `copy`.
    unsafe fn event_record(&self, e: RawEvent, stream: RawStream) -> Result<()>;
    /// # Safety
    /// As for `event_record`.
    unsafe fn event_synchronize(&self, e: RawEvent) -> Result<()>;
    /// True when the work before the event's record has finished (or it
    /// was never recorded); does not wait.
    /// # Safety
    /// As for `event_record`.
    unsafe fn event_query(&self, e: RawEvent) -> Result<bool>;
    /// Milliseconds between two completed events.
    /// # Safety
    /// As for `event_record`.
    unsafe fn event_elapsed(&self, start: RawEvent, end: RawEvent) -> Result<f32>;
    /// # Safety
    /// `e` came from `event_create`; destroyed once.
    unsafe fn event_destroy(&self, e: RawEvent);
    /// Work queued on `stream` after this waits for `e`.
    /// # Safety
    /// As for `event_record`.
    unsafe fn stream_wait_event(&self, stream: RawStream, e: RawEvent) -> Result<()>;
    /// Checks that a caller's stream belongs to this device's context.
    /// # Safety
    /// `stream` is a live stream handle (or 0).
    unsafe fn check_stream(&self, stream: RawStream) -> Result<()>;
    /// Checks that `addr..addr+bytes` (non-null, no overflow: checked
    /// above) lies in one device allocation of this device. `Err` carries
    /// the reason.
    fn check_span(&self, addr: u64, bytes: usize) -> std::result::Result<(), String>;
    fn mem_info(&self) -> Result<(usize, usize)>;
}

/// What a driver says about a pointer, in the form both GPU backends can
/// fill (`cuPointerGetAttributes`, `hipPointerGetAttributes` +
/// `hipMemGetAddressRange`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PtrAttrs {
    /// Device memory (or managed memory, which the device can address).
    pub device_memory: bool,
    /// Ordinal of the device the allocation belongs to.
    pub ordinal: i64,
    /// First byte of the allocation.
    pub start: u64,
    /// Bytes of the allocation.
    pub size: u64,
}

/// Whether `addr..addr+bytes` lies in the allocation `a` describes, on
/// device `ordinal`; `Err` says why not.
pub fn span_in_allocation(
    a: &PtrAttrs,
    ordinal: usize,
    addr: u64,
    bytes: usize,
) -> std::result::Result<(), String> {
    if !a.device_memory {
        return Err("host memory, not device memory".into());
    }
    if a.ordinal != ordinal as i64 {
        return Err(format!(
            "memory of device {}, not of device {ordinal}",
            a.ordinal
        ));
    }
    let end = addr.checked_add(bytes as u64).ok_or("span overflows")?;
    let alloc_end = a.start.saturating_add(a.size);
    if addr < a.start || end > alloc_end {
        return Err(format!(
            "runs past its allocation {:#x} + {} bytes",
            a.start, a.size
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn span_checks() {
        let a = PtrAttrs {
            device_memory: true,
            ordinal: 0,
            start: 0x1000,
            size: 0x100,
        };
        assert_eq!(span_in_allocation(&a, 0, 0x1000, 0x100), Ok(()));
        assert_eq!(span_in_allocation(&a, 0, 0x1080, 0x80), Ok(()));
        assert_eq!(span_in_allocation(&a, 0, 0x10ff, 0), Ok(()));
        let past = span_in_allocation(&a, 0, 0x1080, 0x81).unwrap_err();
        assert!(past.contains("runs past"), "{past}");
        let before = span_in_allocation(&a, 0, 0xfff, 1).unwrap_err();
        assert!(before.contains("runs past"), "{before}");
        let other = span_in_allocation(&a, 1, 0x1000, 1).unwrap_err();
        assert!(other.contains("device 0, not of device 1"), "{other}");
        let host = PtrAttrs {
            device_memory: false,
            ..a
        };
        assert!(
            span_in_allocation(&host, 0, 0x1000, 1)
                .unwrap_err()
                .contains("host memory")
        );
        let wrap = span_in_allocation(&a, 0, u64::MAX - 1, 4).unwrap_err();
        assert!(wrap.contains("overflows"), "{wrap}");
    }
}
