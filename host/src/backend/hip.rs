//! AMD backend: the HIP module API, with libamdhip64 opened at run time
//! (no ROCm needed to build; see `hip/ffi.rs` for why the FFI is by hand).
mod ffi;

use super::{Arg, Backend, EventHandle, Launch};
use crate::device::{BackendKind, DeviceInfo};
use crate::{Error, Result, objects};
use ffi::{Api, HipError};
use std::collections::HashMap;
use std::ffi::{CString, c_int, c_void};
use std::ptr;
use std::time::Instant;

/// One HIP device with its module loaded and one non-blocking stream.
pub struct Hip {
    api: &'static Api,
    info: DeviceInfo,
    ordinal: c_int,
    module: ffi::Module,
    stream: ffi::Stream,
    funcs: HashMap<&'static str, ffi::Function>,
    /// 8-byte aligned copy of the code object handed to hipModuleLoadData,
    /// kept alive with the module (the runtime may read it lazily).
    _image: Vec<u64>,
}

// SAFETY: the HIP runtime is thread-safe; every call first makes this
// device current on the calling thread (hipSetDevice), and the handles are
// plain runtime-owned pointers.
unsafe impl Send for Hip {}
// SAFETY: as above.
unsafe impl Sync for Hip {}

fn check(api: &Api, call: &'static str, rc: HipError) -> Result<()> {
    if rc == ffi::HIP_SUCCESS {
        Ok(())
    } else {
        Err(Error::Driver {
            backend: BackendKind::Hip,
            call,
            detail: api.error_name(rc),
        })
    }
}

fn unavailable(reason: impl Into<String>) -> Error {
    Error::BackendUnavailable {
        backend: BackendKind::Hip,
        reason: reason.into(),
    }
}

/// Opens HIP device `ordinal`, loading the code object built for its arch.
pub fn open(ordinal: usize) -> Result<Hip> {
    let api = Api::shared().map_err(unavailable)?;
    open_on(api, ordinal)
}

/// What `hipGetDeviceProperties*` told us.
#[derive(Debug, PartialEq)]
struct Props {
    name: String,
    gcn_arch_name: String,
    total_mem: usize,
    warp_size: i32,
    l2_bytes: i32,
}

/// NUL-terminated string in `buf[off..off + len]`, clamped to the buffer
/// (lossy UTF-8).
fn c_str_at(buf: &[u8], off: usize, len: usize) -> String {
    let field = buf
        .get(off..off.saturating_add(len).min(buf.len()))
        .unwrap_or_default();
    let end = field.iter().position(|&b| b == 0).unwrap_or(field.len());
    String::from_utf8_lossy(&field[..end]).into_owned()
}

fn i32_at(buf: &[u8], off: usize) -> i32 {
    buf.get(off..off + 4)
        .and_then(|s| s.try_into().ok())
        .map(i32::from_ne_bytes)
        .unwrap_or(0)
}

fn u64_at(buf: &[u8], off: usize) -> u64 {
    buf.get(off..off + 8)
        .and_then(|s| s.try_into().ok())
        .map(u64::from_ne_bytes)
        .unwrap_or(0)
}

/// Reads the fields we use out of a filled properties buffer.
fn parse_props(buf: &[u8], l: &ffi::PropsLayout) -> Props {
    Props {
        name: c_str_at(buf, l.name, ffi::PROP_STR_LEN),
        gcn_arch_name: c_str_at(buf, l.gcn_arch_name, ffi::PROP_STR_LEN),
        total_mem: u64_at(buf, l.total_global_mem) as usize,
        warp_size: i32_at(buf, l.warp_size),
        l2_bytes: i32_at(buf, l.l2_cache_size),
    }
}

fn device_props(api: &Api, dev: c_int) -> Result<Props> {
    let l = api.props_layout;
    // Zeroed, 8-byte aligned and far larger than either layout.
    let mut buf = vec![0u64; ffi::PROPS_BUF_BYTES / 8];
    // SAFETY: `buf` is writable for PROPS_BUF_BYTES >= sizeof of the layout
    // this entry point fills (792 / 1472 bytes), aligned for its size_t and
    // pointer members.
    let rc = unsafe { (api.get_device_properties)(buf.as_mut_ptr().cast(), dev) };
    check(api, l.symbol, rc)?;
    let props = parse_props(bytemuck::cast_slice(&buf), l);
    if !props.gcn_arch_name.starts_with("gfx") {
        return Err(Error::Driver {
            backend: BackendKind::Hip,
            call: l.symbol,
            detail: format!(
                "gcnArchName at byte {} reads {:?}, not a gfx name ({} from {})",
                l.gcn_arch_name, props.gcn_arch_name, l.symbol, api.lib_name
            ),
        });
    }
    Ok(props)
}

fn open_on(api: &'static Api, ordinal: usize) -> Result<Hip> {
    let t0 = Instant::now();
    let no_device = |call: &str, rc: HipError| {
        let what = if rc == ffi::HIP_ERROR_NO_DEVICE || rc == ffi::HIP_ERROR_INVALID_DEVICE {
            "no device: "
        } else {
            ""
        };
        unavailable(format!(
            "{what}{call} returned {} ({})",
            api.error_name(rc),
            api.lib_name
        ))
    };
    // SAFETY: no preconditions; flags must be 0.
    let rc = unsafe { (api.init)(0) };
    if rc != ffi::HIP_SUCCESS {
        return Err(no_device("hipInit", rc));
    }
    let mut count: c_int = 0;
    // SAFETY: out-pointer to a local.
    let rc = unsafe { (api.get_device_count)(&mut count) };
    if rc != ffi::HIP_SUCCESS {
        return Err(no_device("hipGetDeviceCount", rc));
    }
    if ordinal >= count.max(0) as usize {
        return Err(unavailable(format!(
            "no device: device {ordinal} requested, {count} present"
        )));
    }
    let dev = ordinal as c_int;
    // SAFETY: `dev` is below the device count.
    check(api, "hipSetDevice", unsafe { (api.set_device)(dev) })?;
    let props = device_props(api, dev)?;
    let attr = |a: c_int| -> Result<i32> {
        let mut v: c_int = 0;
        // SAFETY: out-pointer to a local, valid device, attribute from the enum.
        check(api, "hipDeviceGetAttribute", unsafe {
            (api.device_get_attribute)(&mut v, a, dev)
        })?;
        Ok(v)
    };
    // The attribute and the properties field should agree; trust whichever
    // gives a real wave size.
    let wave = match attr(ffi::ATTR_WARP_SIZE) {
        Ok(w @ (32 | 64)) => w,
        _ if matches!(props.warp_size, 32 | 64) => props.warp_size,
        Ok(w) => {
            return Err(unavailable(format!(
                "unexpected wave size {w} / {}",
                props.warp_size
            )));
        }
        Err(e) => return Err(e),
    } as u32;
    let l2 = attr(ffi::ATTR_L2_CACHE_SIZE).unwrap_or(props.l2_bytes);
    // Picks the ELF (or reports the missing arch) before any load.
    let (obj, elf) = objects::amd_for(&props.gcn_arch_name)?;
    let mut image = vec![0u64; elf.len().div_ceil(8)];
    bytemuck::cast_slice_mut::<u64, u8>(&mut image)[..elf.len()].copy_from_slice(elf);
    let mut module: ffi::Module = ptr::null_mut();
    // SAFETY: `image` holds a complete ELF code object and outlives the module.
    let rc = unsafe { (api.module_load_data)(&mut module, image.as_ptr().cast()) };
    check(api, "hipModuleLoadData", rc)?;
    // From here on `hip` owns the module and the stream: Drop releases them
    // if a later step fails.
    let mut hip = Hip {
        api,
        info: DeviceInfo {
            backend: BackendKind::Hip,
            name: props.name,
            arch: obj.to_string(),
            code_object: format!(
                "{obj} ELF (code object v{})",
                crate::code_objects::AMD_CODE_OBJECT_VERSION
            ),
            driver: String::new(),
            wave,
            l2_bytes: l2.max(0) as usize,
            total_mem: props.total_mem,
            load_ms: 0.0,
        },
        ordinal: dev,
        module,
        stream: ptr::null_mut(),
        funcs: HashMap::new(),
        _image: image,
    };
    for name in crate::ops::KERNELS {
        let c = CString::new(*name).map_err(|_| unavailable("kernel name with NUL"))?;
        let mut f: ffi::Function = ptr::null_mut();
        // SAFETY: module is loaded; `c` is NUL-terminated.
        check(api, "hipModuleGetFunction", unsafe {
            (api.module_get_function)(&mut f, hip.module, c.as_ptr())
        })?;
        hip.funcs.insert(*name, f);
    }
    let mut stream: ffi::Stream = ptr::null_mut();
    // SAFETY: out-pointer to a local; this device is current.
    let rc = unsafe { (api.stream_create_with_flags)(&mut stream, ffi::HIP_STREAM_NON_BLOCKING) };
    check(api, "hipStreamCreateWithFlags", rc)?;
    hip.stream = stream;
    hip.info.load_ms = t0.elapsed().as_secs_f64() * 1e3;
    let (mut runtime, mut driver): (c_int, c_int) = (0, 0);
    // SAFETY: out-pointer to a local.
    check(api, "hipRuntimeGetVersion", unsafe {
        (api.runtime_get_version)(&mut runtime)
    })?;
    // SAFETY: out-pointer to a local.
    check(api, "hipDriverGetVersion", unsafe {
        (api.driver_get_version)(&mut driver)
    })?;
    hip.info.driver = format!(
        "HIP runtime {}, driver {} ({})",
        hip_version(runtime),
        hip_version(driver),
        api.lib_name
    );
    Ok(hip)
}

/// `HIP_VERSION` = major * 10^7 + minor * 10^5 + patch, as `major.minor.patch`.
fn hip_version(v: c_int) -> String {
    format!("{}.{}.{}", v / 10_000_000, (v / 100_000) % 100, v % 100_000)
}

impl Hip {
    fn bind(&self) -> Result<()> {
        // SAFETY: the ordinal was valid at open.
        check(self.api, "hipSetDevice", unsafe {
            (self.api.set_device)(self.ordinal)
        })
    }

    fn sync_stream(&self) -> Result<()> {
        // SAFETY: our stream.
        check(self.api, "hipStreamSynchronize", unsafe {
            (self.api.stream_synchronize)(self.stream)
        })
    }
}

impl Backend for Hip {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn alloc(&self, bytes: usize) -> Result<u64> {
        self.bind()?;
        let mut p: *mut c_void = ptr::null_mut();
        // SAFETY: plain device allocation (never managed memory).
        check(self.api, "hipMalloc", unsafe {
            (self.api.malloc)(&mut p, bytes.max(1))
        })?;
        Ok(p as u64)
    }

    unsafe fn free(&self, ptr: u64) {
        if self.bind().is_ok() {
            // Queued work may still use the buffer: let it finish first.
            let _ = self.sync_stream();
            // SAFETY: ptr came from hipMalloc (caller contract).
            let _ = unsafe { (self.api.free)(ptr as *mut c_void) };
        }
    }

    unsafe fn upload(&self, dst: u64, src: &[u8]) -> Result<()> {
        self.bind()?;
        // SAFETY: caller contract; `src` outlives the copy because we wait.
        let rc = unsafe {
            (self.api.memcpy_htod_async)(
                dst as ffi::DevPtr,
                src.as_ptr().cast_mut().cast(),
                src.len(),
                self.stream,
            )
        };
        check(self.api, "hipMemcpyHtoDAsync", rc)?;
        self.sync_stream()
    }

    unsafe fn download(&self, dst: &mut [u8], src: u64) -> Result<()> {
        self.bind()?;
        // SAFETY: caller contract; we wait before returning.
        let rc = unsafe {
            (self.api.memcpy_dtoh_async)(
                dst.as_mut_ptr().cast(),
                src as ffi::DevPtr,
                dst.len(),
                self.stream,
            )
        };
        check(self.api, "hipMemcpyDtoHAsync", rc)?;
        self.sync_stream()
    }

    unsafe fn copy(&self, dst: u64, src: u64, bytes: usize) -> Result<()> {
        self.bind()?;
        // SAFETY: caller contract.
        let rc = unsafe {
            (self.api.memcpy_dtod_async)(dst as ffi::DevPtr, src as ffi::DevPtr, bytes, self.stream)
        };
        check(self.api, "hipMemcpyDtoDAsync", rc)
    }

    unsafe fn launch(&self, kernel: &'static str, l: Launch, args: &[Arg]) -> Result<()> {
        self.bind()?;
        let f = *self
            .funcs
            .get(kernel)
            .ok_or_else(|| unavailable(format!("kernel {kernel} not loaded")))?;
        let mut args = args.to_vec();
        let mut params = Arg::param_ptrs(&mut args);
        // SAFETY: caller contract; `params` points at `args`, both alive
        // across the call, and the runtime copies the values at launch.
        let rc = unsafe {
            (self.api.module_launch_kernel)(
                f,
                l.grid.0,
                l.grid.1,
                1,
                l.block,
                1,
                1,
                l.shared_bytes,
                self.stream,
                params.as_mut_ptr(),
                ptr::null_mut(),
            )
        };
        check(self.api, "hipModuleLaunchKernel", rc)
    }

    fn synchronize(&self) -> Result<()> {
        self.bind()?;
        self.sync_stream()
    }

    fn record(&self) -> Result<EventHandle> {
        self.bind()?;
        let mut e: ffi::Event = ptr::null_mut();
        // SAFETY: out-pointer to a local.
        check(self.api, "hipEventCreate", unsafe {
            (self.api.event_create)(&mut e)
        })?;
        // SAFETY: fresh event, our stream.
        let rc = unsafe { (self.api.event_record)(e, self.stream) };
        if let Err(err) = check(self.api, "hipEventRecord", rc) {
            // SAFETY: created above, never handed out.
            let _ = unsafe { (self.api.event_destroy)(e) };
            return Err(err);
        }
        Ok(EventHandle::Gpu(e as usize))
    }

    fn elapsed_ms(&self, start: &EventHandle, end: &EventHandle) -> Result<f32> {
        self.bind()?;
        match (start, end) {
            (EventHandle::Gpu(a), EventHandle::Gpu(b)) => {
                let (a, b) = (*a as ffi::Event, *b as ffi::Event);
                // SAFETY: event created by `record`.
                check(self.api, "hipEventSynchronize", unsafe {
                    (self.api.event_synchronize)(b)
                })?;
                let mut ms = 0f32;
                // SAFETY: events created by `record`; out-pointer to a local.
                check(self.api, "hipEventElapsedTime", unsafe {
                    (self.api.event_elapsed_time)(&mut ms, a, b)
                })?;
                Ok(ms)
            }
            _ => Err(unavailable("events of another backend")),
        }
    }

    fn destroy_event(&self, e: &EventHandle) {
        if let EventHandle::Gpu(h) = e
            && self.bind().is_ok()
        {
            // SAFETY: created by `record`, destroyed once (Event's Drop).
            let _ = unsafe { (self.api.event_destroy)(*h as ffi::Event) };
        }
    }

    fn mem_info(&self) -> Result<(usize, usize)> {
        self.bind()?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: out-pointers to locals.
        check(self.api, "hipMemGetInfo", unsafe {
            (self.api.mem_get_info)(&mut free, &mut total)
        })?;
        Ok((free, total))
    }
}

impl Drop for Hip {
    fn drop(&mut self) {
        if self.bind().is_ok() {
            // SAFETY: handles created in `open`, released once; a null stream
            // (open failed before creating it) is skipped.
            unsafe {
                if !self.stream.is_null() {
                    let _ = (self.api.stream_synchronize)(self.stream);
                    let _ = (self.api.stream_destroy)(self.stream);
                }
                let _ = (self.api.module_unload)(self.module);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reason_ok(reason: &str) -> bool {
        [
            "libamdhip64 not found",
            "no device",
            "hipErrorNoDevice",
            "hipErrorInvalidDevice",
        ]
        .iter()
        .any(|s| reason.contains(s))
    }

    /// On a machine without an AMD GPU (with or without ROCm installed),
    /// opening fails with a typed, readable error instead of panicking.
    #[test]
    fn open_without_device_is_unavailable() {
        match open(0) {
            Ok(h) => {
                // A real AMD GPU: the probe worked end to end.
                assert!(h.info().arch.starts_with("gfx"), "{:?}", h.info());
                assert!(matches!(h.info().wave, 32 | 64));
            }
            // A real GPU whose arch was not built.
            Err(Error::NoCodeObject { arch, .. }) => assert!(arch.starts_with("gfx")),
            Err(Error::BackendUnavailable { backend, reason }) => {
                assert_eq!(backend, BackendKind::Hip);
                assert!(reason_ok(&reason), "unexpected reason: {reason}");
            }
            Err(e) => panic!("unexpected error: {e}"),
        }
    }

    #[test]
    fn unavailable_error_displays() {
        if let Err(e) = open(0) {
            let msg = e.to_string();
            eprintln!("hip open(0): {msg}");
            assert!(msg.contains("Hip"), "{msg}");
            assert!(!msg.trim().is_empty());
        }
        let e = Error::Driver {
            backend: BackendKind::Hip,
            call: "hipMalloc",
            detail: "hipErrorOutOfMemory (2)".into(),
        };
        assert_eq!(
            e.to_string(),
            "Hip call hipMalloc failed: hipErrorOutOfMemory (2)"
        );
    }

    /// The loader reports a missing library (simulated with bogus names).
    #[test]
    fn missing_library_is_unavailable() {
        let names = &["libwavefuse-no-such-hip.so", "libamdhip64.so.999"];
        let err = Api::load(names).map(|_| ()).map_err(unavailable);
        match err {
            Err(Error::BackendUnavailable { backend, reason }) => {
                assert_eq!(backend, BackendKind::Hip);
                assert!(reason.contains("libamdhip64 not found"), "{reason}");
                assert!(
                    reason.contains("libwavefuse-no-such-hip.so")
                        && reason.contains("libamdhip64.so.999")
                );
                let msg = Error::BackendUnavailable { backend, reason }.to_string();
                eprintln!("missing library: {msg}");
                assert!(msg.starts_with("backend Hip unavailable: libamdhip64 not found"));
            }
            other => panic!("expected BackendUnavailable, got {:?}", other.err()),
        }
    }

    /// The offsets pick the right fields out of a buffer laid out like each
    /// header version's struct.
    #[test]
    fn props_offsets_read_fields() {
        for l in [&ffi::R0000, &ffi::R0600] {
            assert!(
                l.gcn_arch_name + ffi::PROP_STR_LEN <= l.size && l.size <= ffi::PROPS_BUF_BYTES
            );
            assert_eq!(l.total_global_mem % 8, 0);
            let mut buf = vec![0u8; ffi::PROPS_BUF_BYTES];
            let put =
                |buf: &mut [u8], off: usize, s: &[u8]| buf[off..off + s.len()].copy_from_slice(s);
            put(&mut buf, l.name, b"AMD Instinct MI210");
            put(&mut buf, l.gcn_arch_name, b"gfx90a:sramecc+:xnack-");
            put(&mut buf, l.total_global_mem, &(64u64 << 30).to_ne_bytes());
            put(&mut buf, l.warp_size, &64i32.to_ne_bytes());
            put(&mut buf, l.l2_cache_size, &(8i32 << 20).to_ne_bytes());
            let p = parse_props(&buf, l);
            assert_eq!(
                p,
                Props {
                    name: "AMD Instinct MI210".into(),
                    gcn_arch_name: "gfx90a:sramecc+:xnack-".into(),
                    total_mem: 64 << 30,
                    warp_size: 64,
                    l2_bytes: 8 << 20,
                }
            );
        }
        // An unterminated field stops at its array's end.
        let buf = vec![b'x'; 700];
        assert_eq!(c_str_at(&buf, 396, ffi::PROP_STR_LEN).len(), 256);
        // ... and at the buffer's end; out of range reads as empty.
        assert_eq!(c_str_at(&buf, 690, ffi::PROP_STR_LEN).len(), 10);
        assert_eq!(c_str_at(&buf, 900, ffi::PROP_STR_LEN), "");
    }

    /// Shared loader: whichever way it goes on this machine, it does not panic
    /// and picks the layout that matches the symbols present.
    #[test]
    fn shared_loader_picks_a_layout() {
        match Api::shared() {
            Ok(api) => {
                eprintln!("loaded {} ({})", api.lib_name, api.props_layout.symbol);
                assert!(ffi::LIB_NAMES.contains(&api.lib_name));
            }
            Err(e) => assert!(e.contains("libamdhip64 not found"), "{e}"),
        }
    }
}
