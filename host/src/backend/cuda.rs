//! NVIDIA backend: the CUDA driver API through cudarc's `result` layer
//! (libcuda opened at run time unless the build links it), in the device's
//! primary context, the context every CUDA runtime user (PyTorch, candle)
//! shares.
use super::{Arg, Backend, Launch, PtrAttrs, RawEvent, RawStream, span_in_allocation};
use crate::info::{BackendKind, DeviceInfo};
use crate::registry::Kernel;
use crate::{Error, Result, objects};
use cudarc::driver::{result as cu, sys};
use std::ffi::{CString, c_void};
use std::ptr;
use std::time::Instant;
use wavefuse_shared::geometry::ATTN_SHARED_BYTES as MAX_SHARED_BYTES;

pub struct Cuda {
    info: DeviceInfo,
    dev: sys::CUdevice,
    ctx: sys::CUcontext,
    module: sys::CUmodule,
    stream: sys::CUstream,
    /// Indexed by `Kernel as usize`.
    funcs: Vec<sys::CUfunction>,
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
        code: e.0 as i32,
        detail: format!("{e:?}"),
    }
}

fn unavailable(reason: impl Into<String>) -> Error {
    Error::BackendUnavailable {
        backend: BackendKind::Cuda,
        reason: reason.into(),
    }
}

/// Whether the driver library can be opened. cudarc's own probe
/// (`sys::is_culib_present`) exists only in its `dynamic-loading` mode, which
/// an engine that links libcuda (candle's `dynamic-linking`) turns off for
/// the whole graph; so probe by hand, with the names cudarc loads.
fn culib_present() -> bool {
    ["libcuda.so.1", "libcuda.so", "nvcuda.dll"]
        .iter()
        .any(|name| {
            // SAFETY: opening the driver library runs only its own load-time
            // initialisers; the handle is closed again at once.
            unsafe { libloading::Library::new(name) }.is_ok()
        })
}

pub fn open(ordinal: usize) -> Result<Cuda> {
    if !culib_present() {
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
    // From here on `c` owns the retained context and whatever is created
    // next: its Drop releases them if a later step fails.
    let mut c = Cuda {
        info: DeviceInfo {
            backend: BackendKind::Cuda,
            ordinal,
            name: String::new(),
            arch: String::new(),
            code_object: String::new(),
            driver: String::new(),
            wave: 32,
            l2_bytes: 0,
            total_mem: 0,
            load_ms: 0.0,
            skipped: Vec::new(),
        },
        dev,
        ctx,
        module: ptr::null_mut(),
        stream: ptr::null_mut(),
        funcs: Vec::new(),
    };
    let _bound = c.bind()?;
    let attr = |a| {
        // SAFETY: valid device and attribute.
        unsafe { cu::device::get_attribute(dev, a) }.map_err(err("cuDeviceGetAttribute"))
    };
    use sys::CUdevice_attribute as A;
    let major = attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
    let minor = attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
    let l2 = attr(A::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)?;
    let (obj, ptx) = objects::ptx_for(major, minor)?;
    // SAFETY: `ptx` is NUL-terminated PTX text (checked by `objects`).
    c.module =
        unsafe { cu::module::load_data(ptx.as_ptr().cast()) }.map_err(err("cuModuleLoadData"))?;
    for k in Kernel::ALL {
        let name = CString::new(k.name()).map_err(|_| unavailable("kernel name with NUL"))?;
        // SAFETY: module is loaded.
        let f = unsafe { cu::module::get_function(c.module, name) }
            .map_err(err("cuModuleGetFunction"))?;
        // Launches above 48 KiB of dynamic workgroup memory need the
        // kernel's opt-in (window_attention takes ATTN_SHARED_BYTES); it only
        // raises the launch limit.
        // SAFETY: `f` is a function of the loaded module.
        unsafe {
            cu::function::set_function_attribute(
                f,
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                MAX_SHARED_BYTES as i32,
            )
        }
        .map_err(err("cuFuncSetAttribute"))?;
        c.funcs.push(f);
    }
    c.stream =
        cu::stream::create(cu::stream::StreamKind::NonBlocking).map_err(err("cuStreamCreate"))?;
    let mut version = 0i32;
    // SAFETY: out-pointer to a local.
    unsafe { sys::cuDriverGetVersion(&mut version) }
        .result()
        .map_err(err("cuDriverGetVersion"))?;
    // SAFETY: valid device.
    let total_mem = unsafe { cu::device::total_mem(dev) }.map_err(err("cuDeviceTotalMem"))?;
    c.info.name = cu::device::get_name(dev).map_err(err("cuDeviceGetName"))?;
    c.info.arch = format!("sm_{major}{minor}");
    c.info.code_object = format!("{obj} PTX");
    c.info.driver = format!(
        "CUDA driver API {}.{}",
        version / 1000,
        (version % 1000) / 10
    );
    c.info.l2_bytes = l2.max(0) as usize;
    c.info.total_mem = total_mem;
    c.info.load_ms = t0.elapsed().as_secs_f64() * 1e3;
    Ok(c)
}

/// The backend's context made current for one call. When it drops, the
/// context that was current before (or none) is current again, so that an
/// engine's own context survives every wavefuse call.
struct Bound {
    prev: sys::CUcontext,
    ours: sys::CUcontext,
}

impl Drop for Bound {
    fn drop(&mut self) {
        if self.prev != self.ours {
            // SAFETY: `prev` was current on this thread when the call began
            // (live), or null, which unbinds.
            let _ = unsafe { cu::ctx::set_current(self.prev) };
        }
    }
}

impl Cuda {
    fn bind(&self) -> Result<Bound> {
        let prev = cu::ctx::get_current()
            .map_err(err("cuCtxGetCurrent"))?
            .unwrap_or(ptr::null_mut());
        if prev != self.ctx {
            // SAFETY: the context is retained for the backend's lifetime.
            unsafe { cu::ctx::set_current(self.ctx) }.map_err(err("cuCtxSetCurrent"))?;
        }
        Ok(Bound {
            prev,
            ours: self.ctx,
        })
    }

    /// The driver's attributes of `addr`, and the context its allocation
    /// belongs to (null for memory no context owns).
    fn pointer_attrs(&self, addr: u64) -> Result<(PtrAttrs, sys::CUcontext)> {
        let mut memory_type: u32 = 0;
        let mut context: sys::CUcontext = ptr::null_mut();
        let mut ordinal: i32 = -1;
        let mut start: sys::CUdeviceptr = 0;
        let mut size: usize = 0;
        let mut attrs = [
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_SIZE,
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_CONTEXT,
        ];
        let mut data: [*mut c_void; 5] = [
            (&mut memory_type as *mut u32).cast(),
            (&mut ordinal as *mut i32).cast(),
            (&mut start as *mut sys::CUdeviceptr).cast(),
            (&mut size as *mut usize).cast(),
            (&mut context as *mut sys::CUcontext).cast(),
        ];
        // SAFETY: each data pointer is writable for its attribute's type
        // (CUmemorytype = unsigned int, int, CUdeviceptr, size_t,
        // CUcontext). For a pointer the driver does not know, it succeeds
        // and leaves the defaults (memory type 0).
        unsafe {
            sys::cuPointerGetAttributes(
                attrs.len() as u32,
                attrs.as_mut_ptr(),
                data.as_mut_ptr(),
                addr,
            )
        }
        .result()
        .map_err(err("cuPointerGetAttributes"))?;
        let a = PtrAttrs {
            device_memory: memory_type == sys::CUmemorytype::CU_MEMORYTYPE_DEVICE as u32,
            ordinal: i64::from(ordinal),
            start,
            size: size as u64,
        };
        Ok((a, context))
    }
}

impl Backend for Cuda {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn own_stream(&self) -> RawStream {
        self.stream as RawStream
    }

    fn alloc(&self, bytes: usize) -> Result<u64> {
        let _bound = self.bind()?;
        // SAFETY: plain device allocation (never managed memory).
        unsafe { cu::malloc_sync(bytes.max(1)) }.map_err(err("cuMemAlloc"))
    }

    unsafe fn free(&self, ptr: u64) {
        if let Ok(_bound) = self.bind() {
            // Queued work may still use the buffer: let it finish first.
            // SAFETY: ptr came from cuMemAlloc; the stream is ours.
            unsafe {
                let _ = cu::stream::synchronize(self.stream);
                let _ = cu::free_sync(ptr);
            }
        }
    }

    unsafe fn upload(&self, dst: u64, src: &[u8]) -> Result<()> {
        let _bound = self.bind()?;
        // SAFETY: caller contract; `src` outlives the copy because we wait.
        unsafe {
            cu::memcpy_htod_async(dst, src, self.stream).map_err(err("cuMemcpyHtoDAsync"))?;
            cu::stream::synchronize(self.stream).map_err(err("cuStreamSynchronize"))
        }
    }

    unsafe fn download(&self, dst: &mut [u8], src: u64) -> Result<()> {
        let _bound = self.bind()?;
        // SAFETY: caller contract; we wait before returning.
        unsafe {
            cu::memcpy_dtoh_async(dst, src, self.stream).map_err(err("cuMemcpyDtoHAsync"))?;
            cu::stream::synchronize(self.stream).map_err(err("cuStreamSynchronize"))
        }
    }

    unsafe fn copy(&self, dst: u64, src: u64, bytes: usize, stream: RawStream) -> Result<()> {
        let _bound = self.bind()?;
        // SAFETY: caller contract.
        unsafe { cu::memcpy_dtod_async(dst, src, bytes, stream as sys::CUstream) }
            .map_err(err("cuMemcpyDtoDAsync"))
    }

    unsafe fn launch(&self, k: Kernel, l: Launch, args: &[Arg], stream: RawStream) -> Result<()> {
        let _bound = self.bind()?;
        let f = *self
            .funcs
            .get(k as usize)
            .ok_or_else(|| unavailable(format!("kernel {} not loaded", k.name())))?;
        let mut args = args.to_vec();
        let mut params = Arg::param_ptrs(&mut args);
        // SAFETY: caller contract; the driver copies the parameters at launch.
        unsafe {
            cu::launch_kernel(
                f,
                (l.grid.0, l.grid.1, 1),
                (l.block, 1, 1),
                l.shared_bytes,
                stream as sys::CUstream,
                &mut params,
            )
        }
        .map_err(err("cuLaunchKernel"))
    }

    unsafe fn synchronize(&self, stream: RawStream) -> Result<()> {
        let _bound = self.bind()?;
        // SAFETY: caller contract.
        unsafe { cu::stream::synchronize(stream as sys::CUstream) }
            .map_err(err("cuStreamSynchronize"))
    }

    fn event_create(&self) -> Result<RawEvent> {
        let _bound = self.bind()?;
        let e = cu::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT)
            .map_err(err("cuEventCreate"))?;
        Ok(e as RawEvent)
    }

    unsafe fn event_record(&self, e: RawEvent, stream: RawStream) -> Result<()> {
        let _bound = self.bind()?;
        // SAFETY: caller contract.
        unsafe { cu::event::record(e as sys::CUevent, stream as sys::CUstream) }
            .map_err(err("cuEventRecord"))
    }

    unsafe fn event_synchronize(&self, e: RawEvent) -> Result<()> {
        let _bound = self.bind()?;
        // SAFETY: caller contract.
        unsafe { cu::event::synchronize(e as sys::CUevent) }.map_err(err("cuEventSynchronize"))
    }

    unsafe fn event_query(&self, e: RawEvent) -> Result<bool> {
        let _bound = self.bind()?;
        // SAFETY: caller contract.
        match unsafe { cu::event::query(e as sys::CUevent) } {
            Ok(()) => Ok(true),
            Err(cudarc::driver::DriverError(sys::CUresult::CUDA_ERROR_NOT_READY)) => Ok(false),
            Err(x) => Err(err("cuEventQuery")(x)),
        }
    }

    unsafe fn event_elapsed(&self, start: RawEvent, end: RawEvent) -> Result<f32> {
        let _bound = self.bind()?;
        // SAFETY: caller contract.
        unsafe { cu::event::elapsed(start as sys::CUevent, end as sys::CUevent) }
            .map_err(err("cuEventElapsedTime"))
    }

    unsafe fn event_destroy(&self, e: RawEvent) {
        if let Ok(_bound) = self.bind() {
            // SAFETY: caller contract.
            let _ = unsafe { cu::event::destroy(e as sys::CUevent) };
        }
    }

    unsafe fn stream_wait_event(&self, stream: RawStream, e: RawEvent) -> Result<()> {
        let _bound = self.bind()?;
        // SAFETY: caller contract.
        unsafe {
            cu::stream::wait_event(
                stream as sys::CUstream,
                e as sys::CUevent,
                sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
            )
        }
        .map_err(err("cuStreamWaitEvent"))
    }

    unsafe fn check_stream(&self, stream: RawStream) -> Result<()> {
        let _bound = self.bind()?;
        let mut ctx: sys::CUcontext = ptr::null_mut();
        // SAFETY: caller contract (a live stream or 0); out-pointer to a local.
        unsafe { sys::cuStreamGetCtx(stream as sys::CUstream, &mut ctx) }
            .result()
            .map_err(|e| Error::ForeignStream {
                why: format!("cuStreamGetCtx: {e:?}"),
            })?;
        if ctx != self.ctx {
            return Err(Error::ForeignStream {
                why: format!(
                    "the stream belongs to context {ctx:p}, not to device {}'s primary context {:p}",
                    self.info.ordinal, self.ctx
                ),
            });
        }
        Ok(())
    }

    fn check_span(&self, addr: u64, bytes: usize) -> std::result::Result<(), String> {
        let (a, context) = self.pointer_attrs(addr).map_err(|e| e.to_string())?;
        span_in_allocation(&a, self.info.ordinal, addr, bytes)?;
        // An allocation of another context of the same device is mapped in
        // that context, not necessarily in the primary context wavefuse
        // launches in. Context-free memory (null) is mapped in all.
        if !context.is_null() && context != self.ctx {
            return Err(format!(
                "memory of context {context:p}, not of device {}'s primary context {:p}",
                self.info.ordinal, self.ctx
            ));
        }
        Ok(())
    }

    fn mem_info(&self) -> Result<(usize, usize)> {
        let _bound = self.bind()?;
        cu::mem_get_info().map_err(err("cuMemGetInfo"))
    }
}

impl Drop for Cuda {
    fn drop(&mut self) {
        // `bind` fails only when the driver is shut down or deinitialised
        // (process exit) or the context is no longer valid (an engine reset
        // the primary context). Either way the context's streams and
        // modules are already gone with it: nothing is left to destroy, and
        // calling the driver on their stale handles could hit a reused one.
        if let Ok(_bound) = self.bind() {
            // SAFETY: handles created in `open`, released once; null ones
            // (open failed before creating them) are skipped.
            unsafe {
                if !self.stream.is_null() {
                    let _ = cu::stream::synchronize(self.stream);
                    let _ = cu::stream::destroy(self.stream);
                }
                if !self.module.is_null() {
                    let _ = cu::module::unload(self.module);
                }
            }
        }
        // SAFETY: retained once in `open`.
        let _ = unsafe { cu::primary_ctx::release(self.dev) };
    }
}
