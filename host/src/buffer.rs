//! Typed device buffers and views.
use crate::device::Device;
use crate::{Error, Result};
use std::marker::PhantomData;
use std::ops::Range;

mod sealed {
    pub trait Sealed {}
}

/// Element types a device buffer can hold.
pub trait Elem: sealed::Sealed + bytemuck::Pod + Send + Sync + 'static {
    /// Short dtype name (`f16`, `bf16`, `f32`, `i32`).
    const NAME: &'static str;
}

macro_rules! elems {
    ($($t:ty => $n:literal),*) => {$(
        impl sealed::Sealed for $t {}
        impl Elem for $t {
            const NAME: &'static str = $n;
        }
    )*};
}
elems!(half::f16 => "f16", half::bf16 => "bf16", f32 => "f32", i32 => "i32");

/// An owned, typed allocation on one device.
pub struct DeviceBuffer<T: Elem> {
    dev: Device,
    ptr: u64,
    len: usize,
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

impl Device {
    /// Allocates `len` elements (contents unspecified).
    pub fn alloc<T: Elem>(&self, len: usize) -> Result<DeviceBuffer<T>> {
        let bytes = len.checked_mul(size_of::<T>()).ok_or(Error::BadParameter {
            op: "alloc",
            what: "len",
            value: len.to_string(),
            why: "byte size overflows",
        })?;
        let ptr = self.be.alloc(bytes)?;
        Ok(DeviceBuffer {
            dev: self.clone(),
            ptr,
            len,
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

    /// Overwrites the whole buffer from host memory.
    pub fn copy_from_host(&mut self, data: &[T]) -> Result<()> {
        if data.len() != self.len {
            return Err(Error::LengthMismatch {
                op: "copy_from_host",
                what: "data",
                got: data.len(),
                expected: self.len,
            });
        }
        // SAFETY: the range is this allocation.
        unsafe { self.dev.be.upload(self.ptr, bytemuck::cast_slice(data)) }
    }

    /// Copies the whole buffer to host memory (waits for queued work).
    pub fn download(&self) -> Result<Vec<T>> {
        let mut out = vec![T::zeroed(); self.len];
        // SAFETY: the range is this allocation.
        unsafe {
            self.dev
                .be
                .download(bytemuck::cast_slice_mut(&mut out), self.ptr)?
        };
        Ok(out)
    }

    /// Queues a device-to-device copy of all of `src` into this buffer.
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
        // SAFETY: both ranges are whole allocations of this device.
        unsafe {
            self.dev
                .be
                .copy(self.ptr, src.ptr, self.len * size_of::<T>())
        }
    }

    /// The whole buffer, read-only.
    pub fn view(&self) -> View<'_, T> {
        View {
            dev: self.dev.id,
            ptr: self.ptr,
            len: self.len,
            _b: PhantomData,
        }
    }

    /// The whole buffer, writable.
    pub fn view_mut(&mut self) -> ViewMut<'_, T> {
        ViewMut {
            dev: self.dev.id,
            ptr: self.ptr,
            len: self.len,
            _b: PhantomData,
        }
    }

    /// A sub-range, read-only (`None` when out of bounds).
    pub fn slice(&self, r: Range<usize>) -> Option<View<'_, T>> {
        (r.start <= r.end && r.end <= self.len).then(|| View {
            dev: self.dev.id,
            ptr: self.ptr + (r.start * size_of::<T>()) as u64,
            len: r.end - r.start,
            _b: PhantomData,
        })
    }

    /// A sub-range, writable (`None` when out of bounds).
    pub fn slice_mut(&mut self, r: Range<usize>) -> Option<ViewMut<'_, T>> {
        (r.start <= r.end && r.end <= self.len).then(|| ViewMut {
            dev: self.dev.id,
            ptr: self.ptr + (r.start * size_of::<T>()) as u64,
            len: r.end - r.start,
            _b: PhantomData,
        })
    }
}

impl<T: Elem> Drop for DeviceBuffer<T> {
    fn drop(&mut self) {
        // SAFETY: allocated by this backend; views borrow the buffer, so none outlive it.
        unsafe { self.dev.be.free(self.ptr) }
    }
}

/// A read-only range of a device buffer.
#[derive(Clone, Copy)]
pub struct View<'a, T: Elem> {
    pub(crate) dev: u64,
    pub(crate) ptr: u64,
    pub(crate) len: usize,
    _b: PhantomData<&'a T>,
}

/// A writable range of a device buffer.
pub struct ViewMut<'a, T: Elem> {
    pub(crate) dev: u64,
    pub(crate) ptr: u64,
    pub(crate) len: usize,
    _b: PhantomData<&'a mut T>,
}

impl<T: Elem> View<'_, T> {
    /// Elements.
    pub fn len(&self) -> usize {
        self.len
    }
    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl<T: Elem> ViewMut<'_, T> {
    /// Elements.
    pub fn len(&self) -> usize {
        self.len
    }
    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
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
