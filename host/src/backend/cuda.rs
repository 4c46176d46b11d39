//! NVIDIA backend: the CUDA driver API through cudarc's `result` layer,
//! with libcuda opened at run time (no CUDA needed to build).
use super::{Arg, Backend, EventHandle, Launch};
use crate::device::{BackendKind, DeviceInfo};
use crate::{Error, Result, objects};
use cudarc::driver::{result as cu, sys};
use std::collections::HashMap;
use std::ffi::CString;
use std::time::Instant;

pub struct Cuda {
    info: DeviceInfo,
    dev: sys::CUdevice,
    ctx: sys::CUcontext,
    module: sys::CUmodule,
    stream: sys::CUstream,
    funcs: HashMap<&'static str, sys::CUfunction>,
}

// SAFETY: the driver API is thread-safe; every call first makes this
// device's context current on the calling thread.
unsafe impl Send for Cuda {}
// SAFETY: as above.
unsafe impl Sync for Cuda {}

fn err(call: &'static str) -> impl Fn(cu::DriverError) -> Error {
    move |e| Error::Driver {
        backend: BackendKind::Cuda,
        call,
        detail: format!("{e:?}"),
    }
}

fn unavailable(reason: impl Into<String>) -> Error {
    Error::BackendUnavailable {
        backend: BackendKind::Cuda,
        reason: reason.into(),
    }
}

pub fn open(ordinal: usize) -> Result<Cuda> {
    // SAFETY: only probes for the library.
    if !unsafe { sys::is_culib_present() } {
        return Err(unavailable("libcuda not found"));
    }
    let t0 = Instant::now();
    cu::init().map_err(|e| unavailable(format!("cuInit: {e:?}")))?;
    let count = cu::device::get_count().map_err(err("cuDeviceGetCount"))?;
    if ordinal >= count.max(0) as usize {
        return Err(unavailable(format!(
            "device {ordinal} requested, {count} present"
        )));
    }
    let dev = cu::device::get(ordinal as i32).map_err(err("cuDeviceGet"))?;
    // SAFETY: dev is a valid device.
    let ctx = unsafe { cu::primary_ctx::retain(dev) }.map_err(err("cuDevicePrimaryCtxRetain"))?;
    // SAFETY: ctx was just retained.
    unsafe { cu::ctx::set_current(ctx) }.map_err(err("cuCtxSetCurrent"))?;
    let attr = |a| {
        // SAFETY: valid device and attribute.
        unsafe { cu::device::get_attribute(dev, a) }.map_err(err("cuDeviceGetAttribute"))
    };
    use sys::CUdevice_attribute as A;
    let major = attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
    let minor = attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
    let l2 = attr(A::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)?;
    let (obj, ptx) = objects::ptx_for(major, minor)?;
    // SAFETY: `ptx` is NUL-terminated PTX text (build.rs appends the NUL).
    let module =
        unsafe { cu::module::load_data(ptx.as_ptr().cast()) }.map_err(err("cuModuleLoadData"))?;
    let mut funcs = HashMap::new();
    for name in crate::ops::KERNELS {
        let c = CString::new(*name).map_err(|_| unavailable("kernel name with NUL"))?;
        // SAFETY: module is loaded.
        let f =
            unsafe { cu::module::get_function(module, c) }.map_err(err("cuModuleGetFunction"))?;
        funcs.insert(*name, f);
    }
    let stream =
        cu::stream::create(cu::stream::StreamKind::NonBlocking).map_err(err("cuStreamCreate"))?;
    let load_ms = t0.elapsed().as_secs_f64() * 1e3;
    let mut version = 0i32;
    // SAFETY: out-pointer to a local.
    unsafe { sys::cuDriverGetVersion(&mut version) }
        .result()
        .map_err(err("cuDriverGetVersion"))?;
    // SAFETY: valid device.
    let total_mem = unsafe { cu::device::total_mem(dev) }.map_err(err("cuDeviceTotalMem"))?;
    Ok(Cuda {
        info: DeviceInfo {
            backend: BackendKind::Cuda,
            name: cu::device::get_name(dev).map_err(err("cuDeviceGetName"))?,
            arch: format!("sm_{major}{minor}"),
            code_object: format!("{obj} PTX"),
            driver: format!(
                "CUDA driver API {}.{}",
                version / 1000,
                (version % 1000) / 10
            ),
            wave: 32,
            l2_bytes: l2.max(0) as usize,
            total_mem,
            load_ms,
        },
        dev,
        ctx,
        module,
        stream,
        funcs,
    })
}

impl Cuda {
    fn bind(&self) -> Result<()> {
        // SAFETY: the context is retained for the backend's lifetime.
        unsafe { cu::ctx::set_current(self.ctx) }.map_err(err("cuCtxSetCurrent"))
    }
}

impl Backend for Cuda {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn alloc(&self, bytes: usize) -> Result<u64> {
        self.bind()?;
        // SAFETY: plain device allocation (never managed memory).
        unsafe { cu::malloc_sync(bytes.max(1)) }.map_err(err("cuMemAlloc"))
    }

    unsafe fn free(&self, ptr: u64) {
        if self.bind().is_ok() {
            // Queued work may still use the buffer: let it finish first.
            // SAFETY: ptr came from cuMemAlloc; the stream is ours.
            unsafe {
                let _ = cu::stream::synchronize(self.stream);
                let _ = cu::free_sync(ptr);
            }
        }
    }

    unsafe fn upload(&self, dst: u64, src: &[u8]) -> Result<()> {
        self.bind()?;
        // SAFETY: caller contract; `src` outlives the copy because we wait.
        unsafe {
            cu::memcpy_htod_async(dst, src, self.stream).map_err(err("cuMemcpyHtoDAsync"))?;
            cu::stream::synchronize(self.stream).map_err(err("cuStreamSynchronize"))
        }
    }

    unsafe fn download(&self, dst: &mut [u8], src: u64) -> Result<()> {
        self.bind()?;
        // SAFETY: caller contract; we wait before returning.
        unsafe {
            cu::memcpy_dtoh_async(dst, src, self.stream).map_err(err("cuMemcpyDtoHAsync"))?;
            cu::stream::synchronize(self.stream).map_err(err("cuStreamSynchronize"))
        }
    }

    unsafe fn copy(&self, dst: u64, src: u64, bytes: usize) -> Result<()> {
        self.bind()?;
        // SAFETY: caller contract.
        unsafe { cu::memcpy_dtod_async(dst, src, bytes, self.stream) }
            .map_err(err("cuMemcpyDtoDAsync"))
    }

    unsafe fn launch(&self, kernel: &'static str, l: Launch, args: &[Arg]) -> Result<()> {
        self.bind()?;
        let f = *self
            .funcs
            .get(kernel)
            .ok_or_else(|| unavailable(format!("kernel {kernel} not loaded")))?;
        let mut args = args.to_vec();
        let mut params = Arg::param_ptrs(&mut args);
        // SAFETY: caller contract; the driver copies the parameters at launch.
        unsafe {
            cu::launch_kernel(
                f,
                (l.grid.0, l.grid.1, 1),
                (l.block, 1, 1),
                l.shared_bytes,
                self.stream,
                &mut params,
            )
        }
        .map_err(err("cuLaunchKernel"))
    }

    fn synchronize(&self) -> Result<()> {
        self.bind()?;
        // SAFETY: our stream.
        unsafe { cu::stream::synchronize(self.stream) }.map_err(err("cuStreamSynchronize"))
    }

    fn record(&self) -> Result<EventHandle> {
        self.bind()?;
        let e = cu::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT)
            .map_err(err("cuEventCreate"))?;
        // SAFETY: fresh event, our stream.
        unsafe { cu::event::record(e, self.stream) }.map_err(err("cuEventRecord"))?;
        Ok(EventHandle::Gpu(e as usize))
    }

    fn elapsed_ms(&self, start: &EventHandle, end: &EventHandle) -> Result<f32> {
        self.bind()?;
        match (start, end) {
            (EventHandle::Gpu(a), EventHandle::Gpu(b)) => {
                let (a, b) = (*a as sys::CUevent, *b as sys::CUevent);
                // SAFETY: events created by `record`.
                unsafe {
                    cu::event::synchronize(b).map_err(err("cuEventSynchronize"))?;
                    cu::event::elapsed(a, b).map_err(err("cuEventElapsedTime"))
                }
            }
            _ => Err(unavailable("events of another backend")),
        }
    }

    fn destroy_event(&self, e: &EventHandle) {
        if let EventHandle::Gpu(h) = e
            && self.bind().is_ok()
        {
            // SAFETY: created by `record`, destroyed once (Event's Drop).
            let _ = unsafe { cu::event::destroy(*h as sys::CUevent) };
        }
    }

    fn mem_info(&self) -> Result<(usize, usize)> {
        self.bind()?;
        cu::mem_get_info().map_err(err("cuMemGetInfo"))
    }
}

impl Drop for Cuda {
    fn drop(&mut self) {
        if self.bind().is_ok() {
            // SAFETY: handles created in `open`, released once.
            unsafe {
                let _ = cu::stream::synchronize(self.stream);
                let _ = cu::stream::destroy(self.stream);
                let _ = cu::module::unload(self.module);
                let _ = cu::primary_ctx::release(self.dev);
            }
        }
    }
}
