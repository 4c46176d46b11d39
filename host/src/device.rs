//! Opening a device; streams (wavefuse's own and the caller's) and events.
use crate::backend::{self, Backend, Launch, RawEvent, RawStream};
use crate::buffer::Tracker;
use crate::info::{BackendKind, DeviceInfo, Wave};
use crate::registry::Kernel;
use crate::{Error, Result};
use std::ffi::c_void;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Which device to open.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Choice {
    /// First that works: CUDA device 0, HIP device 0, then the CPU emulator
    /// (wave64); the device's [`DeviceInfo::skipped`] says why the ones
    /// before it did not open.
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

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// An open device: its code object loaded, its own stream created.
///
/// `Device` is cheap to clone (the clones share the device) and `Send +
/// Sync`: one device can be used from several threads at once. Work that
/// one thread queues on a stream is ordered with work other threads queue
/// on the same stream in the order the calls happen.
#[derive(Clone)]
pub struct Device {
    pub(crate) be: Arc<dyn Backend>,
    pub(crate) id: u64,
    own: Stream,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device").field("info", self.info()).finish()
    }
}

fn open_backend(choice: Choice) -> Result<Arc<dyn Backend>> {
    Ok(match choice {
        Choice::Auto => {
            let mut skipped = Vec::new();
            match backend::cuda::open(0) {
                Ok(b) => return Ok(Arc::new(b)),
                Err(e) => skipped.push((BackendKind::Cuda, e.to_string())),
            }
            match backend::hip::open(0) {
                Ok(b) => return Ok(Arc::new(b)),
                Err(e) => skipped.push((BackendKind::Hip, e.to_string())),
            }
            let mut cpu = backend::cpu::Cpu::new(Wave::W64);
            cpu.set_skipped(skipped);
            Arc::new(cpu)
        }
        Choice::Cuda(n) => Arc::new(backend::cuda::open(n)?),
        Choice::Hip(n) => Arc::new(backend::hip::open(n)?),
        Choice::Cpu(w) => Arc::new(backend::cpu::Cpu::new(w)),
    })
}

impl Device {
    /// Opens a device and loads the code object that matches it.
    pub fn open(choice: Choice) -> Result<Device> {
        let be = open_backend(choice)?;
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let own = Stream {
            raw: be.own_stream(),
            be: be.clone(),
            dev: id,
            foreign: false,
        };
        Ok(Device { be, id, own })
    }

    /// What this device is.
    pub fn info(&self) -> &DeviceInfo {
        self.be.info()
    }

    /// wavefuse's own stream on this device: what ops given the device
    /// itself run on, and what an engine orders its own work against
    /// ([`Stream::record`], [`Stream::wait`], [`Stream::raw`]).
    pub fn stream(&self) -> &Stream {
        &self.own
    }

    /// A caller's stream (`CUstream` / `hipStream_t`; null is the legacy
    /// default stream on the GPUs and the only stream of the emulator),
    /// checked to belong to this device's primary context. Ops given it
    /// queue their work on it; wavefuse never synchronises or destroys it.
    /// wavefuse buffers, plans and tables used by work on it are not freed
    /// before that work is done (each launch records an event on the
    /// stream that the resources it reads wait for when they are dropped).
    ///
    /// # Safety
    /// `raw` is a live stream handle of this device's backend, and outlives
    /// every use of the returned [`Stream`] (and of its clones).
    pub unsafe fn wrap_stream(&self, raw: *mut c_void) -> Result<Stream> {
        let raw = raw as RawStream;
        // SAFETY: caller contract.
        unsafe { self.be.check_stream(raw) }?;
        Ok(Stream {
            be: self.be.clone(),
            dev: self.id,
            raw,
            foreign: raw != self.own.raw,
        })
    }

    /// Waits until all work queued on wavefuse's own stream has finished.
    pub fn synchronize(&self) -> Result<()> {
        self.own.synchronize()
    }

    /// Records an event on wavefuse's own stream.
    pub fn record(&self) -> Result<Event> {
        self.own.record()
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
        self.own.check_same(other, op, what)
    }
}

/// Where ops queue their work: wavefuse's own stream (a [`Device`]) or a
/// caller's ([`Stream`]). Every op takes `q: &impl AsStream` first.
pub trait AsStream {
    /// The stream.
    fn as_stream(&self) -> &Stream;
}

impl AsStream for Device {
    fn as_stream(&self) -> &Stream {
        &self.own
    }
}

impl AsStream for Stream {
    fn as_stream(&self) -> &Stream {
        self
    }
}

/// A stream of one device: wavefuse's own or a caller's.
#[derive(Clone)]
pub struct Stream {
    be: Arc<dyn Backend>,
    dev: u64,
    raw: RawStream,
    foreign: bool,
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stream")
            .field("raw", &(self.raw as *const c_void))
            .field("foreign", &self.foreign)
            .field("device", &self.be.info().name)
            .finish()
    }
}

impl Stream {
    /// The driver's handle (`CUstream` / `hipStream_t`; null on the
    /// emulator).
    pub fn raw(&self) -> *mut c_void {
        self.raw as *mut c_void
    }

    /// True for a caller's stream (from [`Device::wrap_stream`]).
    pub fn is_foreign(&self) -> bool {
        self.foreign
    }

    /// What the stream's device is.
    pub fn info(&self) -> &DeviceInfo {
        self.be.info()
    }

    /// Waits until all work queued on this stream has finished.
    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: our own stream, or a caller's that passed check_stream
        // and outlives this value (wrap_stream's contract).
        unsafe { self.be.synchronize(self.raw) }
    }

    /// Records an event on this stream.
    pub fn record(&self) -> Result<Event> {
        let e = Event::new(self)?;
        // SAFETY: a fresh event; the stream as in `synchronize`.
        unsafe { self.be.event_record(e.raw, self.raw) }?;
        Ok(e)
    }

    /// Work queued on this stream from now on waits for `e` (an event of
    /// the same device, recorded on any of its streams).
    pub fn wait(&self, e: &Event) -> Result<()> {
        self.check_same(e.dev, "Stream::wait", "event")?;
        // SAFETY: a live event of this backend; the stream as in `synchronize`.
        unsafe { self.be.stream_wait_event(self.raw, e.raw) }
    }

    pub(crate) fn check_same(
        &self,
        other: u64,
        op: &'static str,
        what: &'static str,
    ) -> Result<()> {
        if other == self.dev {
            Ok(())
        } else {
            Err(Error::WrongDevice { op, what })
        }
    }

    /// Queues kernel `k` on this stream. On a caller's stream, the
    /// wavefuse buffers the arguments point into (`owners`) are told that
    /// this work reads them: an event recorded after the launch, which
    /// their drop waits for.
    ///
    /// # Safety
    /// As [`Backend::launch`].
    pub(crate) unsafe fn launch(
        &self,
        k: Kernel,
        l: Launch,
        args: &[crate::backend::Arg],
        owners: &[Option<&Tracker>],
    ) -> Result<()> {
        let track = self.foreign && owners.iter().any(Option::is_some);
        // Created before the launch, so that failing to create it launches
        // nothing.
        let done = if track { Some(Event::new(self)?) } else { None };
        // SAFETY: caller contract; the stream as in `synchronize`.
        unsafe { self.be.launch(k, l, args, self.raw) }?;
        if let Some(done) = done {
            // SAFETY: a fresh event; the stream as in `synchronize`.
            match unsafe { self.be.event_record(done.raw, self.raw) } {
                Ok(()) => {
                    let done = Arc::new(done);
                    for o in owners.iter().flatten() {
                        o.note(self.raw, &done);
                    }
                }
                // Nothing can mark the end of this work: wait for it here,
                // so that no owner is freed under it.
                Err(_) => self.synchronize()?,
            }
        }
        Ok(())
    }
}

/// A point in a stream.
pub struct Event {
    be: Arc<dyn Backend>,
    dev: u64,
    raw: RawEvent,
}

impl Event {
    fn new(s: &Stream) -> Result<Event> {
        Ok(Event {
            raw: s.be.event_create()?,
            be: s.be.clone(),
            dev: s.dev,
        })
    }

    /// Waits until the work before this event has finished.
    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: a live event of this backend.
        unsafe { self.be.event_synchronize(self.raw) }
    }

    /// Milliseconds from `start` to this event (both of this device; this
    /// waits for `self`).
    pub fn elapsed_ms(&self, start: &Event) -> Result<f32> {
        if start.dev != self.dev {
            return Err(Error::WrongDevice {
                op: "Event::elapsed_ms",
                what: "start",
            });
        }
        self.synchronize()?;
        // SAFETY: live events of this backend (same device id).
        unsafe { self.be.event_elapsed(start.raw, self.raw) }
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: created by `Event::new`, destroyed once.
        unsafe { self.be.event_destroy(self.raw) }
    }
}
