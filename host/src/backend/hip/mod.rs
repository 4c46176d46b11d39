//! AMD backend: the HIP module API, with libamdhip64 opened at run time
//! (no ROCm needed to build). Three layers, as cudarc's: [`ffi`] (the
//! entry points, bound by hand: see there why), [`result`] (each call
//! checked, its `hipError_t` kept) and this backend.
mod ffi;
pub mod result;

use super::{Arg, Backend, Launch, RawEvent, RawStream};
use crate::info::{BackendKind, DeviceInfo};
use crate::registry::Kernel;
use crate::{Error, Result, objects};
use ffi::Api;
use result::{self as hip, HipError};
use std::ffi::{CString, c_int};
use std::ptr;
use std::time::Instant;

/// One HIP device with its module loaded and one non-blocking stream.
/// The backend's device made current for one call. When it drops, the
/// device that was current before is current again, so that an engine's
/// own device survives every wavefuse call.
struct Bound {
    api: &'static Api,
    prev: c_int,
    ours: c_int,
}

impl Drop for Bound {
    fn drop(&mut self) {
        if self.prev != self.ours {
            let _ = hip::set_device(self.api, self.prev);
        }
    }
}

pub struct Hip {
    api: &'static Api,
    info: DeviceInfo,
    ordinal: c_int,
    runtime_major: i32,
    module: ffi::Module,
    stream: ffi::Stream,
    /// Indexed by `Kernel as usize`.
    funcs: Vec<ffi::Function>,
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

impl From<HipError> for Error {
    fn from(e: HipError) -> Error {
        Error::Driver {
            backend: BackendKind::Hip,
            call: e.call,
            code: e.code,
            detail: e.name,
        }
    }
}

fn unavailable(reason: impl Into<String>) -> Error {
    Error::BackendUnavailable {
        backend: BackendKind::Hip,
        reason: reason.into(),
    }
}

/// The process-wide HIP library, or why it did not load.
pub fn api() -> Result<&'static Api> {
    Api::shared().map_err(unavailable)
}

/// Opens HIP device `ordinal`, loading the code object built for its arch.
pub fn open(ordinal: usize) -> Result<Hip> {
    open_on(api()?, ordinal)
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
    let buf = hip::device_properties(api, dev)?;
    let props = parse_props(bytemuck::cast_slice(&buf), l);
    if !props.gcn_arch_name.starts_with("gfx") {
        return Err(Error::Driver {
            backend: BackendKind::Hip,
            call: l.symbol,
            code: 0,
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
    let no_device = |e: HipError| {
        let what = if e.code == ffi::HIP_ERROR_NO_DEVICE || e.code == ffi::HIP_ERROR_INVALID_DEVICE
        {
            "no device: "
        } else {
            ""
        };
        unavailable(format!(
            "{what}{} returned {} ({})",
            e.call, e.name, api.lib_name
        ))
    };
    hip::init(api).map_err(no_device)?;
    let count = hip::device_count(api).map_err(no_device)?;
    if ordinal >= count.max(0) as usize {
        return Err(unavailable(format!(
            "no device: device {ordinal} requested, {count} present"
        )));
    }
    let dev = ordinal as c_int;
    hip::set_device(api, dev)?;
    let props = device_props(api, dev)?;
    // The attribute and the properties field should agree; trust whichever
    // gives a real wave size.
    let wave = match hip::device_attribute(api, ffi::ATTR_WARP_SIZE, dev) {
        Ok(w @ (32 | 64)) => w,
        _ if matches!(props.warp_size, 32 | 64) => props.warp_size,
        Ok(w) => {
            return Err(unavailable(format!(
                "unexpected wave size {w} / {}",
                props.warp_size
            )));
        }
        Err(e) => return Err(e.into()),
    } as u32;
    let l2 = hip::device_attribute(api, ffi::ATTR_L2_CACHE_SIZE, dev).unwrap_or(props.l2_bytes);
    let runtime = hip::runtime_version(api)?;
    let driver = hip::driver_version(api)?;
    // Picks the ELF (or reports the missing arch) before any load.
    let (obj, elf) = objects::amd_for(&props.gcn_arch_name)?;
    let mut image = vec![0u64; elf.len().div_ceil(8)];
    bytemuck::cast_slice_mut::<u64, u8>(&mut image)[..elf.len()].copy_from_slice(elf);
    // SAFETY: `image` holds a complete ELF code object and outlives the
    // module (it moves into `h`, which unloads the module first).
    let module = unsafe { hip::module_load_data(api, image.as_ptr().cast()) }?;
    // From here on `h` owns the module and the stream: Drop releases them
    // if a later step fails.
    let mut h = Hip {
        api,
        info: DeviceInfo {
            backend: BackendKind::Hip,
            ordinal,
            name: props.name,
            arch: obj.to_string(),
            code_object: format!(
                "{obj} ELF (code object v{})",
                crate::code_objects::AMD_CODE_OBJECT_VERSION
            ),
            driver: format!(
                "HIP runtime {}, driver {} ({})",
                hip_version(runtime),
                hip_version(driver),
                api.lib_name
            ),
            wave,
            l2_bytes: l2.max(0) as usize,
            total_mem: props.total_mem,
            load_ms: 0.0,
            skipped: Vec::new(),
        },
        ordinal: dev,
        runtime_major: runtime / 10_000_000,
        module,
        stream: ptr::null_mut(),
        funcs: Vec::new(),
        _image: image,
    };
    for k in Kernel::ALL {
        let name = CString::new(k.name()).map_err(|_| unavailable("kernel name with NUL"))?;
        // SAFETY: the module is loaded.
        h.funcs
            .push(unsafe { hip::module_get_function(api, h.module, &name) }?);
    }
    h.stream = hip::stream_create_non_blocking(api)?;
    h.info.load_ms = t0.elapsed().as_secs_f64() * 1e3;
    Ok(h)
}

/// `HIP_VERSION` = major * 10^7 + minor * 10^5 + patch, as `major.minor.patch`.
fn hip_version(v: c_int) -> String {
    format!("{}.{}.{}", v / 10_000_000, (v / 100_000) % 100, v % 100_000)
}

impl Hip {
    fn bind(&self) -> Result<Bound> {
        let prev = hip::get_device(self.api)?;
        if prev != self.ordinal {
            hip::set_device(self.api, self.ordinal)?;
        }
        Ok(Bound {
            api: self.api,
            prev,
            ours: self.ordinal,
        })
    }
}

impl Backend for Hip {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn own_stream(&self) -> RawStream {
        self.stream as RawStream
    }

    fn alloc(&self, bytes: usize) -> Result<u64> {
        let _bound = self.bind()?;
        Ok(hip::malloc(self.api, bytes.max(1))?)
    }

    unsafe fn free(&self, ptr: u64) {
        if let Ok(_bound) = self.bind() {
            // SAFETY: our stream; then caller contract (queued work that
            // used the buffer was on it).
            unsafe {
                let _ = hip::stream_synchronize(self.api, self.stream);
                let _ = hip::free(self.api, ptr);
            }
        }
    }

    unsafe fn upload(&self, dst: u64, src: &[u8]) -> Result<()> {
        let _bound = self.bind()?;
        // SAFETY: caller contract; `src` outlives the copy because we wait.
        unsafe {
            hip::memcpy_htod_async(self.api, dst, src, self.stream)?;
            Ok(hip::stream_synchronize(self.api, self.stream)?)
        }
    }

    unsafe fn download(&self, dst: &mut [u8], src: u64) -> Result<()> {
        let _bound = self.bind()?;
        // SAFETY: caller contract; we wait before returning.
        unsafe {
            hip::memcpy_dtoh_async(self.api, dst, src, self.stream)?;
            Ok(hip::stream_synchronize(self.api, self.stream)?)
        }
    }

    unsafe fn copy(&self, dst: u64, src: u64, bytes: usize, stream: RawStream) -> Result<()> {
        let _bound = self.bind()?;
        // SAFETY: caller contract.
        Ok(unsafe { hip::memcpy_dtod_async(self.api, dst, src, bytes, stream as ffi::Stream) }?)
    }

    unsafe fn launch(&self, k: Kernel, l: Launch, args: &[Arg], stream: RawStream) -> Result<()> {
        let _bound = self.bind()?;
        let f = *self
            .funcs
            .get(k as usize)
            .ok_or_else(|| unavailable(format!("kernel {} not loaded", k.name())))?;
        let mut args = args.to_vec();
        let mut params = Arg::param_ptrs(&mut args);
        // SAFETY: caller contract; `params` points at `args`, both alive
        // across the call.
        Ok(unsafe {
            hip::launch_kernel(
                self.api,
                f,
                l.grid,
                l.block,
                l.shared_bytes,
                stream as ffi::Stream,
                &mut params,
            )
        }?)
    }

    unsafe fn synchronize(&self, stream: RawStream) -> Result<()> {
        let _bound = self.bind()?;
        // SAFETY: caller contract.
        Ok(unsafe { hip::stream_synchronize(self.api, stream as ffi::Stream) }?)
    }

    fn event_create(&self) -> Result<RawEvent> {
        let _bound = self.bind()?;
        Ok(hip::event_create(self.api)? as RawEvent)
    }

    unsafe fn event_record(&self, e: RawEvent, stream: RawStream) -> Result<()> {
        let _bound = self.bind()?;
        // SAFETY: caller contract.
        Ok(unsafe { hip::event_record(self.api, e as ffi::Event, stream as ffi::Stream) }?)
    }

    unsafe fn event_synchronize(&self, e: RawEvent) -> Result<()> {
        let _bound = self.bind()?;
        // SAFETY: caller contract.
        Ok(unsafe { hip::event_synchronize(self.api, e as ffi::Event) }?)
    }

    unsafe fn event_query(&self, e: RawEvent) -> Result<bool> {
        let _bound = self.bind()?;
        // SAFETY: caller contract.
        Ok(unsafe { hip::event_query(self.api, e as ffi::Event) }?)
    }

    unsafe fn event_elapsed(&self, start: RawEvent, end: RawEvent) -> Result<f32> {
        let _bound = self.bind()?;
        // SAFETY: caller contract.
        Ok(unsafe { hip::event_elapsed(self.api, start as ffi::Event, end as ffi::Event) }?)
    }

    unsafe fn event_destroy(&self, e: RawEvent) {
        if let Ok(_bound) = self.bind() {
            // SAFETY: caller contract.
            let _ = unsafe { hip::event_destroy(self.api, e as ffi::Event) };
        }
    }

    unsafe fn stream_wait_event(&self, stream: RawStream, e: RawEvent) -> Result<()> {
        let _bound = self.bind()?;
        // SAFETY: caller contract.
        Ok(unsafe { hip::stream_wait_event(self.api, stream as ffi::Stream, e as ffi::Event) }?)
    }

    unsafe fn check_stream(&self, stream: RawStream) -> Result<()> {
        let _bound = self.bind()?;
        // SAFETY: caller contract.
        match unsafe { hip::stream_device(self.api, stream as ffi::Stream) } {
            // Without hipStreamGetDevice (ROCm < 5.6) the stream cannot be
            // checked; HIP has one context per device, so a stream of this
            // device is the only kind the caller's contract allows.
            None => Ok(()),
            Some(Ok(d)) if d == self.ordinal => Ok(()),
            Some(Ok(d)) => Err(Error::ForeignStream {
                why: format!("the stream belongs to device {d}, not {}", self.ordinal),
            }),
            Some(Err(e)) => Err(Error::ForeignStream { why: e.to_string() }),
        }
    }

    fn check_span(&self, addr: u64, bytes: usize) -> std::result::Result<(), String> {
        let _bound = self.bind().map_err(|e| e.to_string())?;
        hip::check_span(self.api, self.runtime_major, self.info.ordinal, addr, bytes)
    }

    fn mem_info(&self) -> Result<(usize, usize)> {
        let _bound = self.bind()?;
        Ok(hip::mem_get_info(self.api)?)
    }
}

impl Drop for Hip {
    fn drop(&mut self) {
        // `bind` (hipGetDevice / hipSetDevice of the ordinal `open`
        // checked) fails only once the runtime is shutting down at process
        // exit, when it releases the device's streams and modules itself;
        // calling it on their stale handles could hit a reused one.
        if let Ok(_bound) = self.bind() {
            // SAFETY: handles created in `open`, released once; a null stream
            // (open failed before creating it) is skipped.
            unsafe {
                if !self.stream.is_null() {
                    let _ = hip::stream_synchronize(self.api, self.stream);
                    let _ = hip::stream_destroy(self.api, self.stream);
                }
                let _ = hip::module_unload(self.api, self.module);
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
        let e = Error::from(HipError {
            call: "hipMalloc",
            code: 2,
            name: "hipErrorOutOfMemory (2)".into(),
        });
        assert!(matches!(e, Error::Driver { code: 2, .. }));
        assert_eq!(
            e.to_string(),
            "Hip call hipMalloc failed: hipErrorOutOfMemory (2) (code 2)"
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

    /// The foreign-span check answers with a reason, not a crash, against
    /// whatever libamdhip64 this machine has (CI: Debian's ROCm 5.2 with no
    /// device, where the runtime reports the address as unknown).
    #[test]
    fn foreign_span_check_without_device() {
        let Ok(api) = Api::shared() else {
            assert!(
                std::env::var_os("WAVEFUSE_REQUIRE_HIP_LIB").is_none(),
                "WAVEFUSE_REQUIRE_HIP_LIB is set but libamdhip64 did not load"
            );
            return;
        };
        let host = [0u8; 64];
        for (addr, bytes) in [(host.as_ptr() as u64, 64), (0x1000, 16), (u64::MAX - 8, 4)] {
            let why = result::check_span(api, 5, 0, addr, bytes)
                .expect_err("no address is a device allocation without a device");
            eprintln!("check_span({addr:#x}, {bytes}): {why}");
            assert!(
                why.contains("not a HIP allocation") && why.contains("hipPointerGetAttributes"),
                "{why}"
            );
        }
    }

    /// The memory-type values of both ROCm generations.
    #[test]
    fn memory_type_values_by_rocm_major() {
        let a = |memory_type, is_managed| ffi::PointerAttributes {
            memory_type,
            is_managed,
            ..Default::default()
        };
        // ROCm 5: Host 0, Device 1, Array 2.
        assert!(!ffi::memory_is_device(&a(0, 0), 5));
        assert!(ffi::memory_is_device(&a(1, 0), 5));
        assert!(!ffi::memory_is_device(&a(2, 0), 5));
        // ROCm 6+: Unregistered 0, Host 1, Device 2, Managed 3.
        assert!(!ffi::memory_is_device(&a(0, 0), 6));
        assert!(!ffi::memory_is_device(&a(1, 0), 7));
        assert!(ffi::memory_is_device(&a(2, 0), 6));
        assert!(ffi::memory_is_device(&a(3, 1), 6));
        // Managed memory is device-addressable whatever its type says.
        assert!(ffi::memory_is_device(&a(0, 1), 5));
        assert_eq!(std::mem::size_of::<ffi::PointerAttributes>(), 32);
    }
}
