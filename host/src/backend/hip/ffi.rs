//! Hand-written minimal FFI to the HIP runtime (`libamdhip64`), resolved at
//! run time with `libloading`.
//!
//! Why by hand and not a `-sys` crate:
//! - `hip-runtime-sys` links `libamdhip64` at build time (its build fails
//!   without ROCm headers and libraries) and its bindings come from HIP 5.4;
//! - `cubecl-hip-sys` picks its binding version at build time from
//!   `hipconfig`, so the binary is tied to the ROCm it was built against.
//!
//! We want one binary, built without ROCm, that opens whatever
//! `libamdhip64` (5.x to 7.x) the machine has. The ~25 entry points below
//! have had the same C ABI across those versions. The one exception is
//! `hipDeviceProp_t`, whose layout changed in ROCm 6 (the symbol became
//! `hipGetDevicePropertiesR0600`); it is handled by [`PropsLayout`], which
//! reads the few fields we need at fixed byte offsets out of an over-sized
//! buffer instead of declaring the struct.
use libloading::Library;
use std::ffi::{CStr, c_char, c_float, c_int, c_uint, c_void};
use std::sync::OnceLock;

/// `hipError_t` (a C enum, `int`-sized in every version; ROCm 7 gives it a
/// `uint32_t` base, same size and values).
pub type HipError = c_int;
/// `hipSuccess`.
pub const HIP_SUCCESS: HipError = 0;
/// `hipErrorNoDevice`.
pub const HIP_ERROR_NO_DEVICE: HipError = 100;
/// `hipErrorNotReady`: an event or stream whose work has not finished.
pub const HIP_ERROR_NOT_READY: HipError = 600;
/// `hipErrorInvalidDevice`.
pub const HIP_ERROR_INVALID_DEVICE: HipError = 101;

/// `hipStream_t`.
pub type Stream = *mut c_void;
/// `hipModule_t`.
pub type Module = *mut c_void;
/// `hipFunction_t`.
pub type Function = *mut c_void;
/// `hipEvent_t`.
pub type Event = *mut c_void;
/// `hipDeviceptr_t` (a `void*` on the AMD platform).
pub type DevPtr = *mut c_void;

/// `hipPointerAttribute_t`: the same six members in ROCm 5 (first one
/// `memoryType`) and ROCm >= 6 (renamed `type`), in Debian's ROCm 5.2
/// `/usr/include/hip/hip_runtime_api.h` and ROCm/HIP at rocm-6.0.0. What
/// the memory-type values mean changed in ROCm 6: see
/// [`memory_is_device`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct PointerAttributes {
    /// `hipMemoryType`.
    pub memory_type: c_int,
    /// Device ordinal.
    pub device: c_int,
    /// `void* devicePointer`.
    pub device_pointer: usize,
    /// `void* hostPointer`.
    pub host_pointer: usize,
    /// `int isManaged`.
    pub is_managed: c_int,
    /// `unsigned allocationFlags`.
    pub allocation_flags: c_uint,
}

/// Whether a `hipPointerAttribute_t` describes memory the device
/// addresses. ROCm 5's `hipMemoryType` is Host 0, Device 1, Array 2,
/// Unified 3 (Debian's 5.2 header); ROCm >= 6 took CUDA's values:
/// Unregistered 0, Host 1, Device 2, Managed 3 (ROCm/HIP rocm-6.0.0
/// `hip_runtime_api.h`). Managed memory counts as device memory.
pub fn memory_is_device(a: &PointerAttributes, runtime_major: i32) -> bool {
    let device = if runtime_major >= 6 { 2 } else { 1 };
    a.memory_type == device || a.is_managed != 0
}

/// `hipStreamNonBlocking` (flag of `hipStreamCreateWithFlags`).
pub const HIP_STREAM_NON_BLOCKING: c_uint = 0x01;

/// `hipDeviceAttributeL2CacheSize`: 19 in the `hipDeviceAttribute_t` enum of
/// ROCm/HIP `include/hip/hip_runtime_api.h` at rocm-5.0.0, rocm-5.7.1,
/// rocm-6.0.0 and amd-staging (2024), and of ROCm/rocm-systems
/// `projects/hip/include/hip/hip_runtime_api.h` (ROCm 7; removed entries are
/// kept as `hipDeviceAttributeUnusedN` so the numbering never moved).
pub const ATTR_L2_CACHE_SIZE: c_int = 19;
/// `hipDeviceAttributeWarpSize`: 87 in the same headers (cross-checked
/// against the properties' `warpSize` field, see `hip.rs`).
pub const ATTR_WARP_SIZE: c_int = 87;

/// Library names tried in order.
pub const LIB_NAMES: &[&str] = &[
    "libamdhip64.so",
    "libamdhip64.so.7",
    "libamdhip64.so.6",
    "libamdhip64.so.5",
];

/// Byte offsets of the `hipDeviceProp_t` fields we read, for one layout.
///
/// Computed with `offsetof` (gcc, x86_64 Linux) on the struct text of each
/// header version:
/// - R0000 (ROCm 5.x, `hipGetDeviceProperties`): ROCm/HIP
///   `include/hip/hip_runtime_api.h` at tags rocm-5.0.0, rocm-5.4.0 and
///   rocm-5.7.1, and Debian's ROCm 5.2.3 `/usr/include/hip` — identical:
///   sizeof 792, name 0, totalGlobalMem 256, warpSize 276, l2CacheSize 340,
///   gcnArchName 396.
/// - R0600 (ROCm >= 6, `hipGetDevicePropertiesR0600`): ROCm/HIP at
///   rocm-6.0.0, rocm-6.2.2 and amd-staging (late 2024) — identical:
///   sizeof 1472, name 0, totalGlobalMem 288, warpSize 308,
///   l2CacheSize 616, gcnArchName 1160. ROCm 7's header (ROCm/rocm-systems
///   `projects/hip/include/hip/hip_runtime_api.h`) declares the same
///   members in the same order (new ones go into `reserved`/`hipReserved`).
#[derive(Debug)]
pub struct PropsLayout {
    /// Entry point that fills this layout.
    pub symbol: &'static str,
    /// `sizeof(hipDeviceProp_t)` in this layout.
    pub size: usize,
    /// `char name[256]`.
    pub name: usize,
    /// `size_t totalGlobalMem`.
    pub total_global_mem: usize,
    /// `int warpSize`.
    pub warp_size: usize,
    /// `int l2CacheSize`.
    pub l2_cache_size: usize,
    /// `char gcnArchName[256]`.
    pub gcn_arch_name: usize,
}

/// ROCm 5.x `hipDeviceProp_t` (now `hipDeviceProp_tR0000`).
pub const R0000: PropsLayout = PropsLayout {
    symbol: "hipGetDeviceProperties",
    size: 792,
    name: 0,
    total_global_mem: 256,
    warp_size: 276,
    l2_cache_size: 340,
    gcn_arch_name: 396,
};

/// ROCm >= 6 `hipDeviceProp_tR0600`.
pub const R0600: PropsLayout = PropsLayout {
    symbol: "hipGetDevicePropertiesR0600",
    size: 1472,
    name: 0,
    total_global_mem: 288,
    warp_size: 308,
    l2_cache_size: 616,
    gcn_arch_name: 1160,
};

// Both layouts fit in the buffer handed to the runtime.
const _: () = assert!(R0000.size <= PROPS_BUF_BYTES && R0600.size <= PROPS_BUF_BYTES);

/// Length of the `name` and `gcnArchName` arrays.
pub const PROP_STR_LEN: usize = 256;

/// Bytes of the zeroed buffer handed to `hipGetDeviceProperties*`: far
/// above either layout, so a later version that grows the struct cannot
/// write past it.
pub const PROPS_BUF_BYTES: usize = 8192;

/// The loaded entry points. The library stays loaded as long as this lives
/// (the shared instance lives for the whole process: unloading the HIP
/// runtime while its threads run is not safe).
pub struct Api {
    _lib: Library,
    /// File name that loaded.
    pub lib_name: &'static str,
    /// Layout filled by [`Api::get_device_properties`].
    pub props_layout: &'static PropsLayout,
    /// `hipError_t hipInit(unsigned int flags)`
    pub init: unsafe extern "C" fn(c_uint) -> HipError,
    /// `hipError_t hipGetDeviceCount(int* count)`
    pub get_device_count: unsafe extern "C" fn(*mut c_int) -> HipError,
    /// `hipError_t hipSetDevice(int deviceId)`
    pub set_device: unsafe extern "C" fn(c_int) -> HipError,
    /// `hipError_t hipGetDevice(int* device)`
    pub get_device: unsafe extern "C" fn(*mut c_int) -> HipError,
    /// `hipError_t hipGetDevicePropertiesR0600(hipDeviceProp_tR0600*, int)`
    /// when present, else `hipGetDeviceProperties(hipDeviceProp_t*, int)`.
    pub get_device_properties: unsafe extern "C" fn(*mut c_void, c_int) -> HipError,
    /// `hipError_t hipDeviceGetAttribute(int* pi, hipDeviceAttribute_t attr, int deviceId)`
    pub device_get_attribute: unsafe extern "C" fn(*mut c_int, c_int, c_int) -> HipError,
    /// `hipError_t hipRuntimeGetVersion(int* runtimeVersion)`
    pub runtime_get_version: unsafe extern "C" fn(*mut c_int) -> HipError,
    /// `hipError_t hipDriverGetVersion(int* driverVersion)`
    pub driver_get_version: unsafe extern "C" fn(*mut c_int) -> HipError,
    /// `hipError_t hipMalloc(void** ptr, size_t size)`
    pub malloc: unsafe extern "C" fn(*mut *mut c_void, usize) -> HipError,
    /// `hipError_t hipFree(void* ptr)`
    pub free: unsafe extern "C" fn(*mut c_void) -> HipError,
    /// `hipError_t hipMemcpyHtoDAsync(hipDeviceptr_t dst, void* src, size_t, hipStream_t)`
    pub memcpy_htod_async: unsafe extern "C" fn(DevPtr, *mut c_void, usize, Stream) -> HipError,
    /// `hipError_t hipMemcpyDtoHAsync(void* dst, hipDeviceptr_t src, size_t, hipStream_t)`
    pub memcpy_dtoh_async: unsafe extern "C" fn(*mut c_void, DevPtr, usize, Stream) -> HipError,
    /// `hipError_t hipMemcpyDtoDAsync(hipDeviceptr_t dst, hipDeviceptr_t src, size_t, hipStream_t)`
    pub memcpy_dtod_async: unsafe extern "C" fn(DevPtr, DevPtr, usize, Stream) -> HipError,
    /// `hipError_t hipStreamCreateWithFlags(hipStream_t* stream, unsigned int flags)`
    pub stream_create_with_flags: unsafe extern "C" fn(*mut Stream, c_uint) -> HipError,
    /// `hipError_t hipStreamSynchronize(hipStream_t stream)`
    pub stream_synchronize: unsafe extern "C" fn(Stream) -> HipError,
    /// `hipError_t hipStreamDestroy(hipStream_t stream)`
    pub stream_destroy: unsafe extern "C" fn(Stream) -> HipError,
    /// `hipError_t hipModuleLoadData(hipModule_t* module, const void* image)`
    pub module_load_data: unsafe extern "C" fn(*mut Module, *const c_void) -> HipError,
    /// `hipError_t hipModuleGetFunction(hipFunction_t* function, hipModule_t module, const char* kname)`
    pub module_get_function: unsafe extern "C" fn(*mut Function, Module, *const c_char) -> HipError,
    /// `hipError_t hipModuleUnload(hipModule_t module)`
    pub module_unload: unsafe extern "C" fn(Module) -> HipError,
    /// `hipError_t hipModuleLaunchKernel(hipFunction_t f, unsigned gridDimX, gridDimY,
    /// gridDimZ, blockDimX, blockDimY, blockDimZ, unsigned sharedMemBytes,
    /// hipStream_t stream, void** kernelParams, void** extra)`
    #[allow(clippy::type_complexity)]
    pub module_launch_kernel: unsafe extern "C" fn(
        Function,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        Stream,
        *mut *mut c_void,
        *mut *mut c_void,
    ) -> HipError,
    /// `hipError_t hipEventCreate(hipEvent_t* event)`
    pub event_create: unsafe extern "C" fn(*mut Event) -> HipError,
    /// `hipError_t hipEventRecord(hipEvent_t event, hipStream_t stream)`
    pub event_record: unsafe extern "C" fn(Event, Stream) -> HipError,
    /// `hipError_t hipEventSynchronize(hipEvent_t event)`
    pub event_synchronize: unsafe extern "C" fn(Event) -> HipError,
    /// `hipError_t hipEventQuery(hipEvent_t event)`
    pub event_query: unsafe extern "C" fn(Event) -> HipError,
    /// `hipError_t hipEventElapsedTime(float* ms, hipEvent_t start, hipEvent_t stop)`
    pub event_elapsed_time: unsafe extern "C" fn(*mut c_float, Event, Event) -> HipError,
    /// `hipError_t hipEventDestroy(hipEvent_t event)`
    pub event_destroy: unsafe extern "C" fn(Event) -> HipError,
    /// `hipError_t hipMemGetInfo(size_t* free, size_t* total)`
    pub mem_get_info: unsafe extern "C" fn(*mut usize, *mut usize) -> HipError,
    /// `hipError_t hipStreamWaitEvent(hipStream_t stream, hipEvent_t event, unsigned int flags)`
    pub stream_wait_event: unsafe extern "C" fn(Stream, Event, c_uint) -> HipError,
    /// `hipError_t hipPointerGetAttributes(hipPointerAttribute_t* attributes, const void* ptr)`
    pub pointer_get_attributes:
        unsafe extern "C" fn(*mut PointerAttributes, *const c_void) -> HipError,
    /// `hipError_t hipMemGetAddressRange(hipDeviceptr_t* pbase, size_t* psize, hipDeviceptr_t dptr)`
    pub mem_get_address_range: unsafe extern "C" fn(*mut DevPtr, *mut usize, DevPtr) -> HipError,
    /// `hipError_t hipStreamGetDevice(hipStream_t stream, hipDevice_t* device)`: ROCm >= 5.6
    /// only (absent from Debian's 5.2), so optional.
    pub stream_get_device: Option<unsafe extern "C" fn(Stream, *mut c_int) -> HipError>,
    /// `const char* hipGetErrorName(hipError_t hip_error)`
    pub get_error_name: unsafe extern "C" fn(HipError) -> *const c_char,
}

/// Looks one symbol up and copies the function pointer out of it. The
/// pointer's type comes from the field it is assigned to, whose doc comment
/// quotes the C prototype.
macro_rules! sym {
    ($lib:expr, $name:literal, $file:expr) => {{
        // SAFETY: the field's type is the C prototype of `$name` (see its doc
        // comment); the pointer is used only while the library is loaded
        // (it lives in the same `Api` as the `Library`).
        let s = unsafe { $lib.get(concat!($name, "\0").as_bytes()) }
            .map_err(|e| format!("{}: missing symbol {}: {e}", $file, $name))?;
        *s
    }};
}

impl Api {
    /// Opens the first library of `names` that loads and resolves every
    /// entry point. The error names every file tried.
    pub fn load(names: &[&'static str]) -> Result<Api, String> {
        let mut tried = Vec::new();
        for &file in names {
            // SAFETY: loading the HIP runtime runs its initialisers, which
            // have no preconditions on us.
            match unsafe { Library::new(file) } {
                Ok(lib) => return Api::resolve(lib, file),
                // The loader's message already names the file.
                Err(e) => tried.push(e.to_string()),
            }
        }
        Err(format!(
            "libamdhip64 not found (tried {})",
            tried.join("; ")
        ))
    }

    fn resolve(lib: Library, file: &'static str) -> Result<Api, String> {
        // ROCm >= 6 exports the new-layout entry point under its own name
        // (the header `#define`s hipGetDeviceProperties to it); the old
        // name there keeps the ROCm 5 layout. Prefer the new one.
        // SAFETY: same prototype as `get_device_properties`'s doc comment.
        let r0600 = unsafe {
            lib.get::<unsafe extern "C" fn(*mut c_void, c_int) -> HipError>(
                b"hipGetDevicePropertiesR0600\0",
            )
        }
        .map(|s| *s)
        .ok();
        let (get_device_properties, props_layout) = match r0600 {
            Some(f) => (f, &R0600),
            None => (sym!(lib, "hipGetDeviceProperties", file), &R0000),
        };
        Ok(Api {
            lib_name: file,
            props_layout,
            init: sym!(lib, "hipInit", file),
            get_device_count: sym!(lib, "hipGetDeviceCount", file),
            set_device: sym!(lib, "hipSetDevice", file),
            get_device: sym!(lib, "hipGetDevice", file),
            get_device_properties,
            device_get_attribute: sym!(lib, "hipDeviceGetAttribute", file),
            runtime_get_version: sym!(lib, "hipRuntimeGetVersion", file),
            driver_get_version: sym!(lib, "hipDriverGetVersion", file),
            malloc: sym!(lib, "hipMalloc", file),
            free: sym!(lib, "hipFree", file),
            memcpy_htod_async: sym!(lib, "hipMemcpyHtoDAsync", file),
            memcpy_dtoh_async: sym!(lib, "hipMemcpyDtoHAsync", file),
            memcpy_dtod_async: sym!(lib, "hipMemcpyDtoDAsync", file),
            stream_create_with_flags: sym!(lib, "hipStreamCreateWithFlags", file),
            stream_synchronize: sym!(lib, "hipStreamSynchronize", file),
            stream_destroy: sym!(lib, "hipStreamDestroy", file),
            module_load_data: sym!(lib, "hipModuleLoadData", file),
            module_get_function: sym!(lib, "hipModuleGetFunction", file),
            module_unload: sym!(lib, "hipModuleUnload", file),
            module_launch_kernel: sym!(lib, "hipModuleLaunchKernel", file),
            event_create: sym!(lib, "hipEventCreate", file),
            event_record: sym!(lib, "hipEventRecord", file),
            event_synchronize: sym!(lib, "hipEventSynchronize", file),
            event_query: sym!(lib, "hipEventQuery", file),
            event_elapsed_time: sym!(lib, "hipEventElapsedTime", file),
            event_destroy: sym!(lib, "hipEventDestroy", file),
            mem_get_info: sym!(lib, "hipMemGetInfo", file),
            stream_wait_event: sym!(lib, "hipStreamWaitEvent", file),
            pointer_get_attributes: sym!(lib, "hipPointerGetAttributes", file),
            mem_get_address_range: sym!(lib, "hipMemGetAddressRange", file),
            // SAFETY: same prototype as the field's doc comment.
            stream_get_device: unsafe {
                lib.get::<unsafe extern "C" fn(Stream, *mut c_int) -> HipError>(
                    b"hipStreamGetDevice\0",
                )
            }
            .map(|s| *s)
            .ok(),
            get_error_name: sym!(lib, "hipGetErrorName", file),
            _lib: lib,
        })
    }

    /// The process-wide instance from [`LIB_NAMES`], loaded once and never
    /// unloaded.
    pub fn shared() -> Result<&'static Api, String> {
        static API: OnceLock<Result<Api, String>> = OnceLock::new();
        API.get_or_init(|| Api::load(LIB_NAMES))
            .as_ref()
            .map_err(Clone::clone)
    }

    /// `hipErrorNoDevice (100)`, from `hipGetErrorName`.
    pub fn error_name(&self, e: HipError) -> String {
        // SAFETY: hipGetErrorName accepts any value and returns a static
        // string (or "hipErrorUnknown"); null is handled below.
        let p = unsafe { (self.get_error_name)(e) };
        if p.is_null() {
            return format!("hipError {e}");
        }
        // SAFETY: non-null, NUL-terminated static string owned by the runtime.
        let name = unsafe { CStr::from_ptr(p) }.to_string_lossy();
        format!("{name} ({e})")
    }
}
