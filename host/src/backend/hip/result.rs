//! Result-returning wrappers over the raw entry points of [`super::ffi`]
//! (the middle layer of cudarc's `sys -> result -> safe` shape): each
//! checks the `hipError_t` and keeps its numeric code and name.
use super::ffi::{self, Api, DevPtr, Event, Function, Module, PointerAttributes, Stream};
use crate::backend::{PtrAttrs, span_in_allocation};
use std::ffi::{CStr, c_int, c_void};
use std::ptr;

/// A failed HIP call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HipError {
    /// The entry point.
    pub call: &'static str,
    /// The `hipError_t` it returned.
    pub code: i32,
    /// `hipGetErrorName` of it, with the code.
    pub name: String,
}

impl std::fmt::Display for HipError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.call, self.name)
    }
}

/// Result of a HIP call.
pub type R<T> = Result<T, HipError>;

/// `Ok` for `hipSuccess`, else the call, code and name.
pub fn check(api: &Api, call: &'static str, rc: ffi::HipError) -> R<()> {
    if rc == ffi::HIP_SUCCESS {
        Ok(())
    } else {
        Err(HipError {
            call,
            code: rc,
            name: api.error_name(rc),
        })
    }
}

pub fn init(api: &Api) -> R<()> {
    // SAFETY: no preconditions; flags must be 0.
    check(api, "hipInit", unsafe { (api.init)(0) })
}

pub fn device_count(api: &Api) -> R<i32> {
    let mut n: c_int = 0;
    // SAFETY: out-pointer to a local.
    check(api, "hipGetDeviceCount", unsafe {
        (api.get_device_count)(&mut n)
    })?;
    Ok(n)
}

/// The calling thread's current device.
pub fn get_device(api: &Api) -> R<i32> {
    let mut d = 0;
    // SAFETY: out-pointer to a local.
    check(api, "hipGetDevice", unsafe { (api.get_device)(&mut d) })?;
    Ok(d)
}

pub fn set_device(api: &Api, dev: i32) -> R<()> {
    // SAFETY: the runtime validates the ordinal.
    check(api, "hipSetDevice", unsafe { (api.set_device)(dev) })
}

pub fn device_attribute(api: &Api, attr: c_int, dev: i32) -> R<i32> {
    let mut v: c_int = 0;
    // SAFETY: out-pointer to a local; the runtime validates attribute and device.
    check(api, "hipDeviceGetAttribute", unsafe {
        (api.device_get_attribute)(&mut v, attr, dev)
    })?;
    Ok(v)
}

/// The device's properties struct in `api.props_layout`, in a zeroed,
/// 8-byte aligned buffer far larger than either layout.
pub fn device_properties(api: &Api, dev: i32) -> R<Vec<u64>> {
    let mut buf = vec![0u64; ffi::PROPS_BUF_BYTES / 8];
    // SAFETY: `buf` is writable for PROPS_BUF_BYTES >= sizeof of the
    // layout this entry point fills, aligned for its size_t and pointer
    // members.
    check(api, api.props_layout.symbol, unsafe {
        (api.get_device_properties)(buf.as_mut_ptr().cast(), dev)
    })?;
    Ok(buf)
}

pub fn runtime_version(api: &Api) -> R<i32> {
    let mut v: c_int = 0;
    // SAFETY: out-pointer to a local.
    check(api, "hipRuntimeGetVersion", unsafe {
        (api.runtime_get_version)(&mut v)
    })?;
    Ok(v)
}

pub fn driver_version(api: &Api) -> R<i32> {
    let mut v: c_int = 0;
    // SAFETY: out-pointer to a local.
    check(api, "hipDriverGetVersion", unsafe {
        (api.driver_get_version)(&mut v)
    })?;
    Ok(v)
}

pub fn malloc(api: &Api, bytes: usize) -> R<u64> {
    let mut p: *mut c_void = ptr::null_mut();
    // SAFETY: out-pointer to a local; plain device allocation.
    check(api, "hipMalloc", unsafe { (api.malloc)(&mut p, bytes) })?;
    Ok(p as u64)
}

/// # Safety
/// `p` came from `malloc` and no queued work uses it.
pub unsafe fn free(api: &Api, p: u64) -> R<()> {
    // SAFETY: caller contract.
    check(api, "hipFree", unsafe { (api.free)(p as *mut c_void) })
}

/// # Safety
/// `dst..dst+src.len()` is device memory; `src` outlives the copy.
pub unsafe fn memcpy_htod_async(api: &Api, dst: u64, src: &[u8], s: Stream) -> R<()> {
    // SAFETY: caller contract.
    check(api, "hipMemcpyHtoDAsync", unsafe {
        (api.memcpy_htod_async)(dst as DevPtr, src.as_ptr().cast_mut().cast(), src.len(), s)
    })
}

/// # Safety
/// `src..src+dst.len()` is device memory; `dst` outlives the copy.
pub unsafe fn memcpy_dtoh_async(api: &Api, dst: &mut [u8], src: u64, s: Stream) -> R<()> {
    // SAFETY: caller contract.
    check(api, "hipMemcpyDtoHAsync", unsafe {
        (api.memcpy_dtoh_async)(dst.as_mut_ptr().cast(), src as DevPtr, dst.len(), s)
    })
}

/// # Safety
/// Both ranges are device memory.
pub unsafe fn memcpy_dtod_async(api: &Api, dst: u64, src: u64, bytes: usize, s: Stream) -> R<()> {
    // SAFETY: caller contract.
    check(api, "hipMemcpyDtoDAsync", unsafe {
        (api.memcpy_dtod_async)(dst as DevPtr, src as DevPtr, bytes, s)
    })
}

pub fn stream_create_non_blocking(api: &Api) -> R<Stream> {
    let mut s: Stream = ptr::null_mut();
    // SAFETY: out-pointer to a local.
    check(api, "hipStreamCreateWithFlags", unsafe {
        (api.stream_create_with_flags)(&mut s, ffi::HIP_STREAM_NON_BLOCKING)
    })?;
    Ok(s)
}

/// # Safety
/// `s` is a live stream (or null).
pub unsafe fn stream_synchronize(api: &Api, s: Stream) -> R<()> {
    // SAFETY: caller contract.
    check(api, "hipStreamSynchronize", unsafe {
        (api.stream_synchronize)(s)
    })
}

/// # Safety
/// `s` came from `stream_create_non_blocking`; destroyed once.
pub unsafe fn stream_destroy(api: &Api, s: Stream) -> R<()> {
    // SAFETY: caller contract.
    check(api, "hipStreamDestroy", unsafe { (api.stream_destroy)(s) })
}

/// # Safety
/// `s` a live stream (or null), `e` a live event.
pub unsafe fn stream_wait_event(api: &Api, s: Stream, e: Event) -> R<()> {
    // SAFETY: caller contract; flags must be 0.
    check(api, "hipStreamWaitEvent", unsafe {
        (api.stream_wait_event)(s, e, 0)
    })
}

/// The device a stream belongs to; `None` where the runtime lacks
/// `hipStreamGetDevice` (ROCm < 5.6).
///
/// # Safety
/// `s` is a live stream (or null).
pub unsafe fn stream_device(api: &Api, s: Stream) -> Option<R<i32>> {
    let f = api.stream_get_device?;
    let mut d: c_int = -1;
    // SAFETY: caller contract; out-pointer to a local.
    Some(check(api, "hipStreamGetDevice", unsafe { f(s, &mut d) }).map(|()| d))
}

/// # Safety
/// `image` is a complete code object that outlives the module.
pub unsafe fn module_load_data(api: &Api, image: *const c_void) -> R<Module> {
    let mut m: Module = ptr::null_mut();
    // SAFETY: caller contract; out-pointer to a local.
    check(api, "hipModuleLoadData", unsafe {
        (api.module_load_data)(&mut m, image)
    })?;
    Ok(m)
}

/// # Safety
/// `m` is a loaded module.
pub unsafe fn module_get_function(api: &Api, m: Module, name: &CStr) -> R<Function> {
    let mut f: Function = ptr::null_mut();
    // SAFETY: caller contract; `name` is NUL-terminated.
    check(api, "hipModuleGetFunction", unsafe {
        (api.module_get_function)(&mut f, m, name.as_ptr())
    })?;
    Ok(f)
}

/// # Safety
/// `m` is a loaded module; unloaded once.
pub unsafe fn module_unload(api: &Api, m: Module) -> R<()> {
    // SAFETY: caller contract.
    check(api, "hipModuleUnload", unsafe { (api.module_unload)(m) })
}

/// # Safety
/// `params` points at one value per kernel parameter, matching the
/// kernel's signature; every pointer argument is valid for the launch.
pub unsafe fn launch_kernel(
    api: &Api,
    f: Function,
    grid: (u32, u32),
    block: u32,
    shared: u32,
    s: Stream,
    params: &mut [*mut c_void],
) -> R<()> {
    // SAFETY: caller contract; the runtime copies the values at launch.
    check(api, "hipModuleLaunchKernel", unsafe {
        (api.module_launch_kernel)(
            f,
            grid.0,
            grid.1,
            1,
            block,
            1,
            1,
            shared,
            s,
            params.as_mut_ptr(),
            ptr::null_mut(),
        )
    })
}

pub fn event_create(api: &Api) -> R<Event> {
    let mut e: Event = ptr::null_mut();
    // SAFETY: out-pointer to a local.
    check(api, "hipEventCreate", unsafe { (api.event_create)(&mut e) })?;
    Ok(e)
}

/// # Safety
/// `e` a live event, `s` a live stream (or null).
pub unsafe fn event_record(api: &Api, e: Event, s: Stream) -> R<()> {
    // SAFETY: caller contract.
    check(api, "hipEventRecord", unsafe { (api.event_record)(e, s) })
}

/// # Safety
/// `e` a live event.
pub unsafe fn event_synchronize(api: &Api, e: Event) -> R<()> {
    // SAFETY: caller contract.
    check(api, "hipEventSynchronize", unsafe {
        (api.event_synchronize)(e)
    })
}

/// True when the event's work has finished (`hipSuccess`), false while
/// it has not (`hipErrorNotReady`).
/// # Safety
/// `e` a live event.
pub unsafe fn event_query(api: &Api, e: Event) -> R<bool> {
    // SAFETY: caller contract.
    let rc = unsafe { (api.event_query)(e) };
    if rc == ffi::HIP_ERROR_NOT_READY {
        return Ok(false);
    }
    check(api, "hipEventQuery", rc).map(|()| true)
}

/// # Safety
/// Both live, recorded events.
pub unsafe fn event_elapsed(api: &Api, a: Event, b: Event) -> R<f32> {
    let mut ms = 0f32;
    // SAFETY: caller contract; out-pointer to a local.
    check(api, "hipEventElapsedTime", unsafe {
        (api.event_elapsed_time)(&mut ms, a, b)
    })?;
    Ok(ms)
}

/// # Safety
/// `e` a live event; destroyed once.
pub unsafe fn event_destroy(api: &Api, e: Event) -> R<()> {
    // SAFETY: caller contract.
    check(api, "hipEventDestroy", unsafe { (api.event_destroy)(e) })
}

pub fn mem_get_info(api: &Api) -> R<(usize, usize)> {
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: out-pointers to locals.
    check(api, "hipMemGetInfo", unsafe {
        (api.mem_get_info)(&mut free, &mut total)
    })?;
    Ok((free, total))
}

/// What the runtime says about `addr` (any address: the runtime answers
/// unknown ones with an error).
pub fn pointer_attributes(api: &Api, addr: u64) -> R<PointerAttributes> {
    let mut a = PointerAttributes::default();
    // SAFETY: out-pointer to a local of the documented layout; the runtime
    // only looks the address up.
    check(api, "hipPointerGetAttributes", unsafe {
        (api.pointer_get_attributes)(&mut a, addr as *const c_void)
    })?;
    Ok(a)
}

/// The allocation that holds `addr`: (first byte, bytes).
pub fn address_range(api: &Api, addr: u64) -> R<(u64, usize)> {
    let (mut base, mut size): (DevPtr, usize) = (ptr::null_mut(), 0);
    // SAFETY: out-pointers to locals; the runtime only looks the address up.
    check(api, "hipMemGetAddressRange", unsafe {
        (api.mem_get_address_range)(&mut base, &mut size, addr as DevPtr)
    })?;
    Ok((base as u64, size))
}

/// Whether `addr..addr+bytes` lies in one allocation of device `ordinal`
/// (the foreign-span check, callable with no device open: the tests run it
/// against the no-device library). `runtime_major` picks the meaning of
/// the memory-type values ([`ffi::memory_is_device`]).
pub fn check_span(
    api: &Api,
    runtime_major: i32,
    ordinal: usize,
    addr: u64,
    bytes: usize,
) -> Result<(), String> {
    let a = pointer_attributes(api, addr).map_err(|e| format!("not a HIP allocation ({e})"))?;
    let (start, size) = address_range(api, addr).map_err(|e| e.to_string())?;
    span_in_allocation(
        &PtrAttrs {
            device_memory: ffi::memory_is_device(&a, runtime_major),
            ordinal: i64::from(a.device),
            start,
            size: size as u64,
        },
        ordinal,
        addr,
        bytes,
    )
}
