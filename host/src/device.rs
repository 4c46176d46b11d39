//! Opening a device; streams (wavefuse's own and the caller's) and events.
use crate::backend::{self, Backend, Launch, RawEvent, RawStream};
use crate::buffer::{Access, Tracker};
use crate::info::{BackendKind, DeviceInfo, Wave};
use crate::registry::Kernel;
use crate::{Error, Result};
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

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

/// Every launch on a caller's stream, shared by all handles of one open
/// device ([`Device`] and [`Stream`] clones). The last handle's drop waits
/// for all of it: each pending event holds the backend, so its module and
/// context are released only after that work is done.
#[derive(Default)]
struct Foreign(Tracker);

impl Drop for Foreign {
    fn drop(&mut self) {
        self.0.wait_all();
    }
}

/// Most events one device keeps for reuse.
const POOL_EVENTS: usize = 256;

/// Driver events that nothing holds any more, kept for the next
/// [`Event`] of the same device: each launch on a caller's stream records
/// one, and a driver event created and destroyed per launch would cost two
/// driver calls more per launch. Re-recording an event overwrites the
/// state it captured; waits already queued on it keep what they captured
/// (the documented semantics of `cuEventRecord` / `cuStreamWaitEvent` and
/// of their HIP twins), and an event comes back here only when its last
/// holder drops it. At most [`POOL_EVENTS`] are kept; the rest are
/// destroyed, and the pool's drop destroys what it holds.
struct EventPool {
    be: Arc<dyn Backend>,
    free: Mutex<Vec<RawEvent>>,
}

impl EventPool {
    fn new(be: Arc<dyn Backend>) -> EventPool {
        EventPool {
            be,
            free: Mutex::new(Vec::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<RawEvent>> {
        // A panic elsewhere while holding the lock leaves a valid list.
        self.free.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn take(&self) -> Result<RawEvent> {
        match self.lock().pop() {
            Some(e) => Ok(e),
            None => self.be.event_create(),
        }
    }

    fn give(&self, e: RawEvent) {
        let mut free = self.lock();
        if free.len() < POOL_EVENTS {
            free.push(e);
        } else {
            drop(free);
            // SAFETY: a live event of this backend that nothing holds.
            unsafe { self.be.event_destroy(e) }
        }
    }
}

impl Drop for EventPool {
    fn drop(&mut self) {
        for e in self.lock().drain(..) {
            // SAFETY: live events of this backend that nothing holds,
            // destroyed once.
            unsafe { self.be.event_destroy(e) }
        }
    }
}

impl Device {
    /// Opens a device and loads the code object that matches it.
    pub fn open(choice: Choice) -> Result<Device> {
        Ok(Device::from_backend(open_backend(choice)?))
    }

    fn from_backend(be: Arc<dyn Backend>) -> Device {
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let own = Stream {
            raw: be.own_stream(),
            be: be.clone(),
            dev: id,
            foreign: false,
            work: Arc::new(Foreign::default()),
            pool: Arc::new(EventPool::new(be.clone())),
        };
        Device { be, id, own }
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
    /// Each launch on it records an event after the work: wavefuse buffers,
    /// plans and tables the work uses wait for it when they are dropped,
    /// and the drop of the device's last handle ([`Device`] or [`Stream`])
    /// waits for every such launch before the module is unloaded.
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
            work: self.own.work.clone(),
            pool: self.own.pool.clone(),
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
    work: Arc<Foreign>,
    pool: Arc<EventPool>,
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

    /// Records an event on the device's own stream (covering everything
    /// queued there so far).
    pub(crate) fn record_own(&self) -> Result<Event> {
        let e = Event::new(self)?;
        // SAFETY: a fresh event; the backend's own stream.
        unsafe { self.be.event_record(e.raw, self.be.own_stream()) }?;
        Ok(e)
    }

    /// Queues kernel `k` on this stream, after the work on other streams
    /// that the wavefuse buffers its arguments point into (`owners`, with
    /// how the kernel uses each) must follow: a read after their writes, a
    /// write after every use. On a caller's stream an event is recorded
    /// after the launch: the device's last handle waits for it before the
    /// module is unloaded, the owners wait for it before they are freed,
    /// and later conflicting work on other streams waits for it.
    ///
    /// # Safety
    /// As [`Backend::launch`].
    pub(crate) unsafe fn launch(
        &self,
        k: Kernel,
        l: Launch,
        args: &[crate::backend::Arg],
        owners: &[Option<(&Tracker, Access)>],
    ) -> Result<()> {
        for (t, a) in owners.iter().flatten() {
            t.order(self, *a)?;
        }
        // Created before the launch, so that failing to create it launches
        // nothing.
        let done = if self.foreign {
            Some(Event::new(self)?)
        } else {
            None
        };
        // SAFETY: caller contract; the stream as in `synchronize`.
        unsafe { self.be.launch(k, l, args, self.raw) }?;
        if let Some(done) = done {
            // SAFETY: a fresh event; the stream as in `synchronize`.
            match unsafe { self.be.event_record(done.raw, self.raw) } {
                Ok(()) => {
                    let done = Arc::new(done);
                    self.work.0.note(&done, Access::Write);
                    for (t, a) in owners.iter().flatten() {
                        t.note(&done, *a);
                    }
                }
                // Nothing can mark the end of this work: wait for it here,
                // so that no owner is freed under it.
                Err(_) => self.synchronize()?,
            }
        } else {
            for (t, a) in owners.iter().flatten() {
                t.used_on_own(*a);
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
    pool: Arc<EventPool>,
}

impl Event {
    /// An event of `s`'s device: one its pool kept, or a new one.
    fn new(s: &Stream) -> Result<Event> {
        Ok(Event {
            raw: s.pool.take()?,
            be: s.be.clone(),
            dev: s.dev,
            pool: s.pool.clone(),
        })
    }

    /// Waits until the work before this event has finished.
    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: a live event of this backend.
        unsafe { self.be.event_synchronize(self.raw) }
    }

    /// True when the work before this event has finished (or it was never
    /// recorded); does not wait.
    pub fn query(&self) -> Result<bool> {
        // SAFETY: a live event of this backend.
        unsafe { self.be.event_query(self.raw) }
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
        // Nothing holds it any more: its device's pool keeps it for reuse
        // or destroys it.
        self.pool.give(self.raw);
    }
}

#[cfg(test)]
mod tests {
    //! The drop and tracking rules on a model of an asynchronous GPU: a
    //! backend that queues every launch and runs it only when something
    //! waits for it (the emulator itself runs each launch to completion,
    //! and a GPU test needs a GPU).
    use super::*;
    use crate::backend::Arg;
    use crate::info::{BackendKind, DeviceInfo};
    use std::collections::HashMap;
    use std::sync::Mutex;
    use std::sync::atomic::AtomicUsize;

    const OWN: RawStream = 1;
    /// `CU_STREAM_PER_THREAD`: one handle, a different stream per thread.
    const PER_THREAD: RawStream = 2;

    #[derive(Default)]
    struct State {
        /// (stream, has run) of every launch, in queue order.
        queue: Vec<(RawStream, bool)>,
        /// Event -> the queue length when it was recorded.
        events: HashMap<RawEvent, usize>,
        next_event: RawEvent,
        /// (event, stream) of every record, in order.
        records: Vec<(RawEvent, RawStream)>,
        /// (stream, event) of every device-side wait, in order.
        waits: Vec<(RawStream, RawEvent)>,
    }

    struct Model {
        info: DeviceInfo,
        /// Run each launch at once (a device that keeps up).
        eager: bool,
        state: Arc<Mutex<State>>,
        /// Launches still queued when the backend (its module) was dropped.
        lost: Arc<AtomicUsize>,
    }

    impl Model {
        /// A device on a new model, the count of launches lost at its drop,
        /// and the model's record of queues, events and waits.
        fn device(eager: bool) -> (Device, Arc<AtomicUsize>, Arc<Mutex<State>>) {
            let lost = Arc::new(AtomicUsize::new(0));
            let state = Arc::new(Mutex::new(State::default()));
            let m = Model {
                info: DeviceInfo {
                    backend: BackendKind::Cpu,
                    ordinal: 0,
                    name: "model".into(),
                    arch: "model".into(),
                    code_object: "model".into(),
                    driver: "model".into(),
                    wave: 64,
                    l2_bytes: 0,
                    total_mem: 0,
                    load_ms: 0.0,
                    skipped: Vec::new(),
                },
                eager,
                state: state.clone(),
                lost: lost.clone(),
            };
            (Device::from_backend(Arc::new(m)), lost, state)
        }

        fn state(&self) -> std::sync::MutexGuard<'_, State> {
            self.state.lock().unwrap_or_else(|e| e.into_inner())
        }

        fn run_before(&self, pos: usize) {
            for q in self.state().queue.iter_mut().take(pos) {
                q.1 = true;
            }
        }
    }

    impl Drop for Model {
        fn drop(&mut self) {
            // As the GPU backends: the own stream is synchronised, then the
            // module is unloaded.
            let s = self.state();
            let left = s
                .queue
                .iter()
                .filter(|(st, ran)| !ran && *st != OWN)
                .count();
            self.lost.fetch_add(left, Ordering::SeqCst);
        }
    }

    fn unsupported<T>(call: &'static str) -> Result<T> {
        Err(Error::Driver {
            backend: BackendKind::Cpu,
            call,
            code: -1,
            detail: "not modelled".into(),
        })
    }

    impl Backend for Model {
        fn info(&self) -> &DeviceInfo {
            &self.info
        }
        fn own_stream(&self) -> RawStream {
            OWN
        }
        fn alloc(&self, _: usize) -> Result<u64> {
            unsupported("alloc")
        }
        unsafe fn free(&self, _: u64) {}
        unsafe fn upload(&self, _: u64, _: &[u8]) -> Result<()> {
            unsupported("upload")
        }
        unsafe fn download(&self, _: &mut [u8], _: u64) -> Result<()> {
            unsupported("download")
        }
        unsafe fn copy(&self, _: u64, _: u64, _: usize, _: RawStream) -> Result<()> {
            unsupported("copy")
        }
        unsafe fn launch(&self, _: Kernel, _: Launch, _: &[Arg], stream: RawStream) -> Result<()> {
            let eager = self.eager;
            self.state().queue.push((stream, eager));
            Ok(())
        }
        unsafe fn synchronize(&self, stream: RawStream) -> Result<()> {
            for q in self.state().queue.iter_mut().filter(|q| q.0 == stream) {
                q.1 = true;
            }
            Ok(())
        }
        fn event_create(&self) -> Result<RawEvent> {
            let mut s = self.state();
            s.next_event += 1;
            let e = s.next_event;
            s.events.insert(e, 0);
            Ok(e)
        }
        unsafe fn event_record(&self, e: RawEvent, stream: RawStream) -> Result<()> {
            let mut s = self.state();
            let n = s.queue.len();
            s.events.insert(e, n);
            s.records.push((e, stream));
            Ok(())
        }
        unsafe fn event_synchronize(&self, e: RawEvent) -> Result<()> {
            let pos = self.state().events.get(&e).copied().unwrap_or(0);
            self.run_before(pos);
            Ok(())
        }
        unsafe fn event_query(&self, e: RawEvent) -> Result<bool> {
            let s = self.state();
            let pos = s.events.get(&e).copied().unwrap_or(0);
            Ok(s.queue.iter().take(pos).all(|q| q.1))
        }
        unsafe fn event_elapsed(&self, _: RawEvent, _: RawEvent) -> Result<f32> {
            Ok(0.0)
        }
        unsafe fn event_destroy(&self, e: RawEvent) {
            self.state().events.remove(&e);
        }
        unsafe fn stream_wait_event(&self, stream: RawStream, e: RawEvent) -> Result<()> {
            self.state().waits.push((stream, e));
            Ok(())
        }
        unsafe fn check_stream(&self, _: RawStream) -> Result<()> {
            Ok(())
        }
        fn check_span(&self, _: u64, _: usize) -> std::result::Result<(), String> {
            Ok(())
        }
        fn mem_info(&self) -> Result<(usize, usize)> {
            Ok((0, 0))
        }
    }

    const L: Launch = Launch {
        grid: (1, 1),
        block: 64,
        shared_bytes: 0,
    };

    fn launch(s: &Stream, owners: &[Option<(&Tracker, Access)>]) {
        // SAFETY: the model runs nothing; no argument is read.
        unsafe { s.launch(Kernel::ALL[0], L, &[], owners) }.unwrap();
    }

    /// The engine example's pattern: open, launch on the engine's stream
    /// (its own memory only), return.
    #[test]
    fn the_last_handle_waits_for_launches_on_a_callers_stream() {
        for device_last in [false, true] {
            let (dev, lost, _) = Model::device(false);
            // SAFETY: the model accepts any handle.
            let s = unsafe { dev.wrap_stream(0x10 as *mut c_void) }.unwrap();
            for _ in 0..3 {
                launch(&s, &[]);
            }
            if device_last {
                drop(s);
                drop(dev);
            } else {
                drop(dev);
                drop(s);
            }
            assert_eq!(
                lost.load(Ordering::SeqCst),
                0,
                "module unloaded under queued work"
            );
        }
    }

    #[test]
    fn finished_launches_are_not_kept() {
        let (dev, lost, _) = Model::device(true);
        // SAFETY: the model accepts any handle.
        let s = unsafe { dev.wrap_stream(0x10 as *mut c_void) }.unwrap();
        let t = Tracker::default();
        for _ in 0..1000 {
            launch(&s, &[Some((&t, Access::Read))]);
        }
        assert_eq!(s.work.0.len(), 1);
        assert_eq!(t.len(), 1);
        drop((s, dev, t));
        assert_eq!(lost.load(Ordering::SeqCst), 0);
    }

    /// A launch on a caller's stream records an event; once its work is
    /// seen done and nothing holds it, the next launch records the same
    /// driver event again instead of creating one. Every event is
    /// destroyed by the time the device is gone.
    #[test]
    fn launches_on_a_callers_stream_reuse_finished_events() {
        let (dev, lost, st) = Model::device(true);
        // SAFETY: the model accepts any handle.
        let s = unsafe { dev.wrap_stream(0x10 as *mut c_void) }.unwrap();
        let t = Tracker::default();
        for _ in 0..1000 {
            launch(&s, &[Some((&t, Access::Read))]);
        }
        {
            let m = st.lock().unwrap();
            assert_eq!(m.records.len(), 1000, "a launch recorded no event");
            assert!(
                m.next_event <= 4,
                "{} driver events created for 1000 launches",
                m.next_event
            );
        }
        drop((s, dev, t));
        assert_eq!(lost.load(Ordering::SeqCst), 0);
        assert!(
            st.lock().unwrap().events.is_empty(),
            "events left undestroyed after the device's last handle"
        );
    }

    /// Two threads on the per-thread default stream share its handle but
    /// not an order: an older event of the handle can finish after a newer
    /// one, so a buffer waits for every event it was given.
    #[test]
    fn a_buffer_waits_for_every_event_of_one_stream_handle() {
        let (dev, lost, _) = Model::device(false);
        // SAFETY: the model accepts any handle.
        let s = unsafe { dev.wrap_stream(PER_THREAD as *mut c_void) }.unwrap();
        let t = Tracker::default();
        launch(&s, &[Some((&t, Access::Read))]);
        launch(&s, &[Some((&t, Access::Read))]);
        assert_eq!(
            t.len(),
            2,
            "an event of the same handle replaced an older one"
        );
        t.wait_all();
        assert_eq!(t.len(), 0);
        assert_eq!(s.work.0.len(), 2);
        drop((s, dev));
        assert_eq!(lost.load(Ordering::SeqCst), 0);
    }

    /// The event of the last record on `stream`.
    fn last_record(st: &Mutex<State>, stream: RawStream) -> RawEvent {
        let s = st.lock().unwrap();
        s.records.iter().rev().find(|r| r.1 == stream).unwrap().0
    }

    fn waited(st: &Mutex<State>, stream: RawStream, e: RawEvent) -> bool {
        st.lock().unwrap().waits.contains(&(stream, e))
    }

    #[test]
    fn callers_streams_are_ordered_by_the_buffers_they_share() {
        let (dev, lost, st) = Model::device(false);
        // SAFETY: the model accepts any handle.
        let a = unsafe { dev.wrap_stream(0x10 as *mut c_void) }.unwrap();
        // SAFETY: as above.
        let b = unsafe { dev.wrap_stream(0x20 as *mut c_void) }.unwrap();
        let t = Tracker::default();
        launch(&a, &[Some((&t, Access::Write))]);
        let wa = last_record(&st, 0x10);
        // Read after write: waits.
        launch(&b, &[Some((&t, Access::Read))]);
        assert!(
            waited(&st, 0x20, wa),
            "a read on B did not wait for A's write"
        );
        let rb = last_record(&st, 0x20);
        // Read after read: concurrent readers do not wait for each other.
        launch(&a, &[Some((&t, Access::Read))]);
        assert!(!waited(&st, 0x10, rb), "two reads were serialised");
        // Write after read: waits for every reader.
        launch(&a, &[Some((&t, Access::Write))]);
        assert!(
            waited(&st, 0x10, rb),
            "a write on A did not wait for B's read"
        );
        t.wait_all();
        drop((a, b, dev));
        assert_eq!(lost.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn the_own_stream_and_callers_streams_are_ordered() {
        let (dev, lost, st) = Model::device(false);
        // SAFETY: the model accepts any handle.
        let b = unsafe { dev.wrap_stream(0x20 as *mut c_void) }.unwrap();
        let t = Tracker::default();
        launch(dev.stream(), &[Some((&t, Access::Write))]);
        assert!(
            st.lock().unwrap().records.is_empty(),
            "an own-stream launch recorded an event"
        );
        // A caller's read after an own-stream write: an event is recorded on
        // the own stream then, and waited for.
        launch(&b, &[Some((&t, Access::Read))]);
        let own = last_record(&st, OWN);
        assert!(
            waited(&st, 0x20, own),
            "B did not wait for the own stream's write"
        );
        // An own-stream read after a caller's write waits for it.
        launch(&b, &[Some((&t, Access::Write))]);
        let wb = last_record(&st, 0x20);
        launch(dev.stream(), &[Some((&t, Access::Read))]);
        assert!(
            waited(&st, OWN, wb),
            "the own stream did not wait for B's write"
        );
        t.wait_all();
        drop((b, dev));
        assert_eq!(lost.load(Ordering::SeqCst), 0);
    }
}
