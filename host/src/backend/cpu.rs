//! The CPU backend: "device" memory is host memory; launches run the host
//! build of the kernels in the SIMT emulator, synchronously, so every
//! stream is the same (there is only stream 0) and an event is a host
//! timestamp.
use super::{Arg, Backend, Launch, RawEvent, RawStream};
use crate::info::{BackendKind, DeviceInfo, Wave};
use crate::registry::Kernel;
use crate::{Error, Result};
use std::alloc::Layout;
use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;
use wavefuse_device::emu::{self, LaunchConfig};
use wavefuse_device::kernels as k;

/// Allocation alignment, as generous as GPU allocators (256 bytes).
const ALIGN: usize = 256;

pub struct Cpu {
    info: DeviceInfo,
    /// Live allocations by start address (ordered, to find the one that
    /// holds an address).
    allocs: Mutex<BTreeMap<u64, Layout>>,
    events: Mutex<HashMap<RawEvent, Option<Instant>>>,
    next_event: AtomicUsize,
}

impl Cpu {
    pub fn new(wave: Wave) -> Cpu {
        Cpu {
            info: DeviceInfo {
                backend: BackendKind::Cpu,
                ordinal: 0,
                name: format!("CPU SIMT emulator (wave{})", wave.lanes()),
                arch: format!("cpu-wave{}", wave.lanes()),
                code_object: "host".into(),
                driver: format!("wavefuse-device {}", env!("CARGO_PKG_VERSION")),
                wave: wave.lanes(),
                l2_bytes: 0,
                total_mem: 0,
                load_ms: 0.0,
                skipped: Vec::new(),
            },
            allocs: Mutex::new(BTreeMap::new()),
            events: Mutex::new(HashMap::new()),
            next_event: AtomicUsize::new(1),
        }
    }

    /// Records why the GPU backends [`crate::Choice::Auto`] tried first did
    /// not open.
    pub fn set_skipped(&mut self, skipped: Vec<(BackendKind, String)>) {
        self.info.skipped = skipped;
    }
}

fn driver(call: &'static str, detail: impl ToString) -> Error {
    Error::Driver {
        backend: BackendKind::Cpu,
        call,
        code: -1,
        detail: detail.to_string(),
    }
}

/// Converts a launch argument to the kernel parameter type it feeds.
trait FromArg: Sized {
    fn from_arg(a: &Arg) -> Result<Self>;
}

impl<T> FromArg for *const T {
    fn from_arg(a: &Arg) -> Result<Self> {
        match a {
            Arg::Ptr(p) => Ok(*p as usize as *const T),
            _ => Err(driver("launch", "expected a pointer argument")),
        }
    }
}

impl<T> FromArg for *mut T {
    fn from_arg(a: &Arg) -> Result<Self> {
        match a {
            Arg::Ptr(p) => Ok(*p as usize as *mut T),
            _ => Err(driver("launch", "expected a pointer argument")),
        }
    }
}

macro_rules! from_arg_scalar {
    ($($t:ty => $v:ident),*) => {$(
        impl FromArg for $t {
            fn from_arg(a: &Arg) -> Result<Self> {
                match a {
                    Arg::$v(x) => Ok(*x),
                    _ => Err(driver("launch", concat!("expected a ", stringify!($t), " argument"))),
                }
            }
        }
    )*};
}
from_arg_scalar!(u64 => U64, u32 => U32, f32 => F32);

/// Kernel arguments captured by every emulated thread.
struct Shared<T>(T);
// SAFETY: the arguments are device addresses and scalars; the kernels
// coordinate their accesses exactly as on a GPU.
unsafe impl<T> Sync for Shared<T> {}

impl<T: Copy> Shared<T> {
    fn get(&self) -> T {
        self.0
    }
}

/// Runs kernel `k` over the emulated grid: generated from the registry,
/// so every entry point is called with parameters of its declared types.
macro_rules! dispatch {
    ($($name:ident($($a:ident: $t:ty),* $(,)?);)*) => {
        fn run(k: Kernel, cfg: &LaunchConfig, args: &[Arg]) -> Result<()> {
            match k {
                $(Kernel::$name => {
                    let mut it = args.iter();
                    let next = || driver("launch", "too few arguments");
                    $(let $a: $t = FromArg::from_arg(it.next().ok_or_else(next)?)?;)*
                    if it.next().is_some() {
                        return Err(driver("launch", "too many arguments"));
                    }
                    let shared = Shared(($($a,)*));
                    emu::launch(cfg, &|| {
                        let ($($a,)*) = shared.get();
                        // SAFETY: the ops layer validated every extent.
                        unsafe { k::$name($($a),*) }
                    })?;
                    Ok(())
                })*
            }
        }
    };
}
wavefuse_device::for_each_kernel!(dispatch);

impl Backend for Cpu {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn own_stream(&self) -> RawStream {
        0
    }

    fn alloc(&self, bytes: usize) -> Result<u64> {
        let layout =
            Layout::from_size_align(bytes.max(1), ALIGN).map_err(|e| driver("alloc", e))?;
        // Zeroed: `download` reads whole buffers into initialised host
        // memory, so device memory must never be uninitialised bytes.
        // SAFETY: non-zero size.
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        if p.is_null() {
            return Err(driver(
                "alloc",
                format!("out of host memory ({bytes} bytes)"),
            ));
        }
        let addr = p as usize as u64;
        self.allocs
            .lock()
            .map_err(|e| driver("alloc", e))?
            .insert(addr, layout);
        Ok(addr)
    }

    unsafe fn free(&self, ptr: u64) {
        if let Ok(mut m) = self.allocs.lock()
            && let Some(layout) = m.remove(&ptr)
        {
            // SAFETY: allocated by `alloc` with this layout.
            unsafe { std::alloc::dealloc(ptr as usize as *mut u8, layout) }
        }
    }

    unsafe fn upload(&self, dst: u64, src: &[u8]) -> Result<()> {
        // SAFETY: caller contract.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst as usize as *mut u8, src.len()) };
        Ok(())
    }

    unsafe fn download(&self, dst: &mut [u8], src: u64) -> Result<()> {
        // SAFETY: caller contract.
        unsafe {
            std::ptr::copy_nonoverlapping(src as usize as *const u8, dst.as_mut_ptr(), dst.len())
        };
        Ok(())
    }

    unsafe fn copy(&self, dst: u64, src: u64, bytes: usize, _: RawStream) -> Result<()> {
        // SAFETY: caller contract; `copy` allows overlap like a device memmove.
        unsafe { std::ptr::copy(src as usize as *const u8, dst as usize as *mut u8, bytes) };
        Ok(())
    }

    unsafe fn launch(&self, k: Kernel, l: Launch, args: &[Arg], _: RawStream) -> Result<()> {
        let cfg = &LaunchConfig {
            grid: l.grid,
            block: l.block,
            wave: self.info.wave,
            shared_bytes: l.shared_bytes as usize,
        };
        run(k, cfg, args)
    }

    unsafe fn synchronize(&self, _: RawStream) -> Result<()> {
        Ok(())
    }

    fn event_create(&self) -> Result<RawEvent> {
        let e = self.next_event.fetch_add(1, Ordering::Relaxed);
        self.events
            .lock()
            .map_err(|e| driver("event_create", e))?
            .insert(e, None);
        Ok(e)
    }

    unsafe fn event_record(&self, e: RawEvent, _: RawStream) -> Result<()> {
        let mut m = self.events.lock().map_err(|e| driver("event_record", e))?;
        let slot = m
            .get_mut(&e)
            .ok_or_else(|| driver("event_record", "unknown event"))?;
        *slot = Some(Instant::now());
        Ok(())
    }

    unsafe fn event_synchronize(&self, _: RawEvent) -> Result<()> {
        Ok(())
    }

    unsafe fn event_query(&self, _: RawEvent) -> Result<bool> {
        // Each launch and copy runs to completion before it returns.
        Ok(true)
    }

    unsafe fn event_elapsed(&self, start: RawEvent, end: RawEvent) -> Result<f32> {
        let m = self.events.lock().map_err(|e| driver("event_elapsed", e))?;
        match (m.get(&start), m.get(&end)) {
            (Some(Some(a)), Some(Some(b))) => Ok(b.duration_since(*a).as_secs_f32() * 1e3),
            _ => Err(driver("event_elapsed", "event not recorded")),
        }
    }

    unsafe fn event_destroy(&self, e: RawEvent) {
        if let Ok(mut m) = self.events.lock() {
            m.remove(&e);
        }
    }

    unsafe fn stream_wait_event(&self, _: RawStream, _: RawEvent) -> Result<()> {
        Ok(())
    }

    unsafe fn check_stream(&self, stream: RawStream) -> Result<()> {
        if stream == 0 {
            Ok(())
        } else {
            Err(Error::ForeignStream {
                why: format!("{stream:#x}: the emulator has one stream, 0 (null)"),
            })
        }
    }

    fn check_span(&self, addr: u64, bytes: usize) -> std::result::Result<(), String> {
        // Host memory from anywhere is the emulator's device memory; what
        // can be checked is a span that starts in one of our allocations
        // and runs past its end.
        let m = self.allocs.lock().map_err(|e| e.to_string())?;
        if let Some((&start, layout)) = m.range(..=addr).next_back() {
            let alloc_end = start + layout.size() as u64;
            if addr < alloc_end && addr + bytes as u64 > alloc_end {
                return Err(format!(
                    "runs past its allocation {start:#x} + {} bytes",
                    layout.size()
                ));
            }
        }
        Ok(())
    }

    fn mem_info(&self) -> Result<(usize, usize)> {
        let used: usize = self
            .allocs
            .lock()
            .map_err(|e| driver("mem_info", e))?
            .values()
            .map(|l| l.size())
            .sum();
        Ok((usize::MAX - used, usize::MAX))
    }
}
