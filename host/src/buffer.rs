//! Typed device memory: buffers wavefuse owns, and views — of those
//! buffers, or of memory an engine owns ([`View::from_raw`]).
use crate::device::{Device, Event, Stream};
use crate::registry::{In, Out};
use crate::{Error, Result};
use std::collections::VecDeque;
use std::marker::PhantomData;
use std::ops::Range;
use std::sync::{Arc, Mutex, MutexGuard};

mod sealed {
    pub trait Sealed {}
}

/// Element types a device buffer can hold.
pub trait Elem: sealed::Sealed + bytemuck::Pod + Send + Sync + 'static {
    /// Short dtype name (`f16`, `bf16`, `f32`, `i32`).
    const NAME: &'static str;
    /// The type kernels see it as (halves cross the kernel ABI as `u16`).
    type Bits;
}

macro_rules! elems {
    ($($t:ty => $n:literal, $b:ty),*) => {$(
        impl sealed::Sealed for $t {}
        impl Elem for $t {
            const NAME: &'static str = $n;
            type Bits = $b;
        }
    )*};
}
elems!(half::f16 => "f16", u16, half::bf16 => "bf16", u16, f32 => "f32", f32, i32 => "i32", i32);

/// How a launch uses a buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Access {
    /// The kernel reads it.
    Read,
    /// The kernel writes it.
    Write,
}

impl Access {
    /// Whether two uses must be ordered (any write).
    fn conflicts(self, other: Access) -> bool {
        self == Access::Write || other == Access::Write
    }

    fn max(self, other: Access) -> Access {
        if self.conflicts(other) {
            Access::Write
        } else {
            Access::Read
        }
    }
}

/// Work queued on callers' streams that has not been seen to finish: for
/// a buffer, the work that reads or writes it; for a device, every launch
/// on a caller's stream (the last handle's drop waits for all of it before
/// the module is unloaded).
///
/// Every event is kept until it is seen complete, never replaced by a newer
/// one of the same stream handle: two threads on the per-thread default
/// stream share a handle but not an order, and a destroyed stream's handle
/// can be reused. Finished events are dropped from the front as new ones
/// arrive, so the list holds what the device has not reached yet.
///
/// For a buffer it also orders work across streams, as cudarc does: a
/// launch waits (on the device, `cuStreamWaitEvent` / `hipStreamWaitEvent`)
/// for the pending uses it conflicts with: a read for the writes, a write
/// for every use. Uses on the device's own stream record no event; when a
/// caller's stream next needs to wait for them, an event is recorded on the
/// own stream then (it covers everything queued there so far).
#[derive(Default)]
pub(crate) struct Tracker {
    uses: Mutex<Uses>,
}

#[derive(Default)]
struct Uses {
    /// Events on callers' streams (and own-stream events recorded for
    /// them), with the access of the work before each.
    pending: VecDeque<(Arc<Event>, Access)>,
    /// The strongest use on the own stream since its last event here.
    own: Option<Access>,
}

impl Tracker {
    fn lock(&self) -> MutexGuard<'_, Uses> {
        // A panic elsewhere while holding the lock leaves valid lists.
        self.uses.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Events are mostly recorded in completion order: popping finished
    /// ones from the front keeps the list as long as the work in flight (a
    /// finished one behind an unfinished one goes at a later call).
    fn prune(u: &mut Uses) {
        while u
            .pending
            .front()
            .is_some_and(|e| e.0.query().unwrap_or(false))
        {
            u.pending.pop_front();
        }
    }

    /// Before a launch that uses this with `access` on `s`: makes `s` wait
    /// for the pending uses that conflict with it.
    pub(crate) fn order(&self, s: &Stream, access: Access) -> Result<()> {
        let mut u = self.lock();
        Tracker::prune(&mut u);
        if s.is_foreign()
            && let Some(own) = u.own
            && own.conflicts(access)
        {
            u.pending.push_back((Arc::new(s.record_own()?), own));
            u.own = None;
        }
        for (e, a) in &u.pending {
            if a.conflicts(access) && !e.query().unwrap_or(false) {
                s.wait(e)?;
            }
        }
        Ok(())
    }

    /// After a launch on the device's own stream that uses this.
    pub(crate) fn used_on_own(&self, access: Access) {
        let mut u = self.lock();
        u.own = Some(u.own.map_or(access, |o| o.max(access)));
    }

    /// Work up to `done` (on a caller's stream) uses this with `access`.
    pub(crate) fn note(&self, done: &Arc<Event>, access: Access) {
        let mut u = self.lock();
        Tracker::prune(&mut u);
        u.pending.push_back((done.clone(), access));
    }

    /// Events not yet seen complete.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.lock().pending.len()
    }

    /// Waits for every pending event.
    pub(crate) fn wait_all(&self) {
        for (done, _) in self.lock().pending.drain(..) {
            // A failed wait leaves nothing better to do than go on: the
            // device is in an error state either way.
            let _ = done.synchronize();
        }
    }
}

/// An owned, typed allocation on one device.
pub struct DeviceBuffer<T: Elem> {
    dev: Device,
    ptr: u64,
    len: usize,
    uses: Tracker,
    _t: PhantomData<T>,
}

impl<T: Elem> std::fmt::Debug for DeviceBuffer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "DeviceBuffer<{}>[{}] @ {:#x}",
            T::NAME,
            self.len,
            self.ptr
        )
    }
}

fn byte_len<T>(op: &'static str, len: usize) -> Result<usize> {
    len.checked_mul(size_of::<T>()).ok_or(Error::BadParameter {
        op,
        what: "len",
        value: len.to_string(),
        why: "byte size overflows",
    })
}

impl Device {
    /// Allocates `len` elements (zero-filled on the emulator, unspecified
    /// contents on a GPU).
    pub fn alloc<T: Elem>(&self, len: usize) -> Result<DeviceBuffer<T>> {
        let bytes = byte_len::<T>("alloc", len)?;
        let ptr = self.be.alloc(bytes)?;
        Ok(DeviceBuffer {
            dev: self.clone(),
            ptr,
            len,
            uses: Tracker::default(),
            _t: PhantomData,
        })
    }

    /// Allocates and fills from host memory.
    pub fn upload<T: Elem>(&self, data: &[T]) -> Result<DeviceBuffer<T>> {
        let mut b = self.alloc::<T>(data.len())?;
        b.copy_from_host(data)?;
        Ok(b)
    }
}

impl<T: Elem> DeviceBuffer<T> {
    /// Elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Device address of the first element.
    pub fn device_ptr(&self) -> u64 {
        self.ptr
    }

    /// The device this buffer lives on.
    pub fn device(&self) -> &Device {
        &self.dev
    }

    /// Overwrites the whole buffer from host memory (on the device's own
    /// stream, after the work queued there; returns when the copy is done).
    pub fn copy_from_host(&mut self, data: &[T]) -> Result<()> {
        if data.len() != self.len {
            return Err(Error::LengthMismatch {
                op: "copy_from_host",
                what: "data",
                got: data.len(),
                expected: self.len,
            });
        }
        // Work on callers' streams may still use the buffer.
        self.uses.wait_all();
        // SAFETY: the range is this allocation.
        unsafe { self.dev.be.upload(self.ptr, bytemuck::cast_slice(data)) }
    }

    /// Copies the whole buffer to host memory (waits for the work queued
    /// on the device's own stream and on callers' streams that used it).
    pub fn download(&self) -> Result<Vec<T>> {
        self.uses.wait_all();
        let mut out = vec![T::zeroed(); self.len];
        // SAFETY: the range is this allocation.
        unsafe {
            self.dev
                .be
                .download(bytemuck::cast_slice_mut(&mut out), self.ptr)?
        };
        Ok(out)
    }

    /// Queues a device-to-device copy of all of `src` into this buffer on
    /// the device's own stream.
    pub fn copy_from(&mut self, src: &DeviceBuffer<T>) -> Result<()> {
        self.dev.check_same(src.dev.id, "copy_from", "src")?;
        if src.len != self.len {
            return Err(Error::LengthMismatch {
                op: "copy_from",
                what: "src",
                got: src.len,
                expected: self.len,
            });
        }
        self.uses.wait_all();
        src.uses.wait_all();
        // SAFETY: both ranges are whole allocations of this device; the
        // own stream.
        unsafe {
            self.dev.be.copy(
                self.ptr,
                src.ptr,
                self.len * size_of::<T>(),
                self.dev.be.own_stream(),
            )
        }?;
        self.uses.used_on_own(Access::Write);
        src.uses.used_on_own(Access::Read);
        Ok(())
    }

    /// The whole buffer, read-only.
    pub fn view(&self) -> View<'_, T> {
        View {
            dev: self.dev.id,
            ptr: self.ptr,
            len: self.len,
            owner: Some(&self.uses),
            _b: PhantomData,
        }
    }

    /// The whole buffer, writable.
    pub fn view_mut(&mut self) -> ViewMut<'_, T> {
        ViewMut {
            dev: self.dev.id,
            ptr: self.ptr,
            len: self.len,
            owner: Some(&self.uses),
            _b: PhantomData,
        }
    }

    /// A sub-range, read-only (`None` when out of bounds).
    pub fn slice(&self, r: Range<usize>) -> Option<View<'_, T>> {
        (r.start <= r.end && r.end <= self.len).then(|| View {
            dev: self.dev.id,
            ptr: self.ptr + (r.start * size_of::<T>()) as u64,
            len: r.end - r.start,
            owner: Some(&self.uses),
            _b: PhantomData,
        })
    }

    /// A sub-range, writable (`None` when out of bounds).
    pub fn slice_mut(&mut self, r: Range<usize>) -> Option<ViewMut<'_, T>> {
        (r.start <= r.end && r.end <= self.len).then(|| ViewMut {
            dev: self.dev.id,
            ptr: self.ptr + (r.start * size_of::<T>()) as u64,
            len: r.end - r.start,
            owner: Some(&self.uses),
            _b: PhantomData,
        })
    }
}

impl<T: Elem> Drop for DeviceBuffer<T> {
    fn drop(&mut self) {
        self.uses.wait_all();
        // SAFETY: allocated by this backend; views borrow the buffer, so
        // none outlive it; work on callers' streams is done (above) and
        // `free` waits for the own stream.
        unsafe { self.dev.be.free(self.ptr) }
    }
}

/// A read-only range of device memory: of a [`DeviceBuffer`] (borrowed
/// from it) or of memory wavefuse did not allocate ([`View::from_raw`]).
#[derive(Clone, Copy)]
pub struct View<'a, T: Elem> {
    pub(crate) dev: u64,
    pub(crate) ptr: u64,
    pub(crate) len: usize,
    owner: Option<&'a Tracker>,
    _b: PhantomData<&'a T>,
}

/// A writable range of device memory (see [`View`]).
pub struct ViewMut<'a, T: Elem> {
    pub(crate) dev: u64,
    pub(crate) ptr: u64,
    pub(crate) len: usize,
    owner: Option<&'a Tracker>,
    _b: PhantomData<&'a mut T>,
}

/// The checks of a foreign span: non-null, no byte-length overflow,
/// aligned for `T`, and the backend's (on the GPUs, the driver's pointer attributes: memory of
/// this device, the whole span inside one allocation).
fn check_foreign<T: Elem>(dev: &Device, op: &'static str, ptr: u64, len: usize) -> Result<()> {
    let bytes = byte_len::<T>(op, len)?;
    let fail = |why: String| Error::ForeignSpan {
        op,
        addr: ptr,
        bytes,
        why,
    };
    if ptr == 0 {
        return Err(fail("null pointer".into()));
    }
    if ptr.checked_add(bytes as u64).is_none() {
        return Err(fail("span overflows the address space".into()));
    }
    let align = std::mem::align_of::<T>() as u64;
    if !ptr.is_multiple_of(align) {
        return Err(fail(format!(
            "not aligned to {align} bytes, the alignment of {}",
            T::NAME
        )));
    }
    dev.be.check_span(ptr, bytes).map_err(fail)
}

impl<'a, T: Elem> View<'a, T> {
    /// A view of `len` elements at device address `ptr`, memory wavefuse
    /// did not allocate (an engine's tensor). Checked before it is
    /// returned: non-null, the byte length does not overflow, the address
    /// aligned for `T`, and on a GPU the driver's pointer attributes say
    /// the whole span is device memory of this device inside one
    /// allocation; otherwise [`Error::ForeignSpan`] says which check
    /// failed. The 16-byte alignment of the vector path is checked by each
    /// op.
    ///
    /// # Safety
    /// For `'a`, the span holds initialised `T`s that nothing writes while
    /// work queued with the view can read them, and the memory stays
    /// allocated until that work is done (wavefuse does not track memory
    /// it did not allocate).
    pub unsafe fn from_raw(dev: &Device, ptr: u64, len: usize) -> Result<View<'a, T>> {
        check_foreign::<T>(dev, "View::from_raw", ptr, len)?;
        Ok(View {
            dev: dev.id,
            ptr,
            len,
            owner: None,
            _b: PhantomData,
        })
    }

    /// Elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Device address of the first element.
    pub fn device_ptr(&self) -> u64 {
        self.ptr
    }

    /// The kernel argument for this view.
    pub(crate) fn arg(&self) -> In<'a, T::Bits> {
        In::new(self.ptr, self.owner)
    }
}

impl<'a, T: Elem> ViewMut<'a, T> {
    /// A writable view of memory wavefuse did not allocate: the checks of
    /// [`View::from_raw`].
    ///
    /// # Safety
    /// As [`View::from_raw`], and nothing else reads or writes the span
    /// while work queued with the view can write it.
    pub unsafe fn from_raw(dev: &Device, ptr: u64, len: usize) -> Result<ViewMut<'a, T>> {
        check_foreign::<T>(dev, "ViewMut::from_raw", ptr, len)?;
        Ok(ViewMut {
            dev: dev.id,
            ptr,
            len,
            owner: None,
            _b: PhantomData,
        })
    }

    /// Elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Device address of the first element.
    pub fn device_ptr(&self) -> u64 {
        self.ptr
    }

    /// The kernel argument for reading through this view (in-place ops).
    pub(crate) fn arg_in(&self) -> In<'a, T::Bits> {
        In::new(self.ptr, self.owner)
    }

    /// The kernel argument for writing through this view.
    pub(crate) fn arg(&mut self) -> Out<'a, T::Bits> {
        Out::new(self.ptr, self.owner)
    }
}

/// Address range of a view, for argument checks.
#[derive(Clone, Copy)]
pub(crate) struct Span {
    pub dev: u64,
    pub ptr: u64,
    pub len: usize,
    pub bytes: usize,
}

impl<T: Elem> From<&View<'_, T>> for Span {
    fn from(v: &View<'_, T>) -> Span {
        Span {
            dev: v.dev,
            ptr: v.ptr,
            len: v.len,
            bytes: v.len * size_of::<T>(),
        }
    }
}

impl<T: Elem> From<&ViewMut<'_, T>> for Span {
    fn from(v: &ViewMut<'_, T>) -> Span {
        Span {
            dev: v.dev,
            ptr: v.ptr,
            len: v.len,
            bytes: v.len * size_of::<T>(),
        }
    }
}

impl Span {
    pub fn overlaps(&self, o: &Span) -> bool {
        self.ptr < o.ptr + o.bytes as u64 && o.ptr < self.ptr + self.bytes as u64
    }
}
