//! The CPU backend: "device" memory is host memory; launches run the host
//! build of the kernels in the SIMT emulator, synchronously.
use super::{Arg, Backend, EventHandle, Launch};
use crate::device::{BackendKind, DeviceInfo, Wave};
use crate::{Error, Result};
use std::alloc::Layout;
use std::collections::HashMap;
use std::sync::Mutex;
use wavefuse_device::emu::{self, LaunchConfig};
use wavefuse_device::kernels as k;

/// Allocation alignment, as generous as GPU allocators (256 bytes).
const ALIGN: usize = 256;

pub struct Cpu {
    info: DeviceInfo,
    allocs: Mutex<HashMap<u64, Layout>>,
}

impl Cpu {
    pub fn new(wave: Wave) -> Cpu {
        Cpu {
            info: DeviceInfo {
                backend: BackendKind::Cpu,
                name: format!("CPU SIMT emulator (wave{})", wave.lanes()),
                arch: format!("cpu-wave{}", wave.lanes()),
                code_object: "host".into(),
                driver: format!("wavefuse-device {}", env!("CARGO_PKG_VERSION")),
                wave: wave.lanes(),
                l2_bytes: 0,
                total_mem: 0,
                load_ms: 0.0,
            },
            allocs: Mutex::new(HashMap::new()),
        }
    }
}

fn driver(call: &'static str, detail: impl ToString) -> Error {
    Error::Driver {
        backend: BackendKind::Cpu,
        call,
        detail: detail.to_string(),
    }
}

/// Converts a launch argument to the kernel parameter type it feeds.
trait FromArg: Sized {
    fn from_arg(a: &Arg) -> Result<Self>;
}

impl<T> FromArg for *const T {
    fn from_arg(a: &Arg) -> Result<Self> {
        match a {
            Arg::Ptr(p) => Ok(*p as usize as *const T),
            _ => Err(driver("launch", "expected a pointer argument")),
        }
    }
}

impl<T> FromArg for *mut T {
    fn from_arg(a: &Arg) -> Result<Self> {
        match a {
            Arg::Ptr(p) => Ok(*p as usize as *mut T),
            _ => Err(driver("launch", "expected a pointer argument")),
        }
    }
}

macro_rules! from_arg_scalar {
    ($($t:ty => $v:ident),*) => {$(
        impl FromArg for $t {
            fn from_arg(a: &Arg) -> Result<Self> {
                match a {
                    Arg::$v(x) => Ok(*x),
                    _ => Err(driver("launch", concat!("expected a ", stringify!($t), " argument"))),
                }
            }
        }
    )*};
}
from_arg_scalar!(u64 => U64, u32 => U32, f32 => F32);

/// Kernel arguments captured by every emulated thread.
struct Shared<T>(T);
// SAFETY: the arguments are device addresses and scalars; the kernels
// coordinate their accesses exactly as on a GPU.
unsafe impl<T> Sync for Shared<T> {}

impl<T: Copy> Shared<T> {
    fn get(&self) -> T {
        self.0
    }
}

macro_rules! dispatch {
    ($name:expr, $cfg:expr, $args:expr; $($kernel:ident($($a:ident),*);)*) => {
        match $name {
            $(stringify!($kernel) => {
                let mut it = $args.iter();
                let next = || driver("launch", "too few arguments");
                $(let $a = FromArg::from_arg(it.next().ok_or_else(next)?)?;)*
                if it.next().is_some() {
                    return Err(driver("launch", "too many arguments"));
                }
                let shared = Shared(($($a,)*));
                emu::launch($cfg, &|| {
                    let ($($a,)*) = shared.get();
                    // SAFETY: the ops layer validated every extent.
                    unsafe { k::$kernel($($a),*) }
                })?;
                Ok(())
            })*
            other => Err(driver("launch", format!("unknown kernel {other}"))),
        }
    };
}

impl Backend for Cpu {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn alloc(&self, bytes: usize) -> Result<u64> {
        let layout =
            Layout::from_size_align(bytes.max(1), ALIGN).map_err(|e| driver("alloc", e))?;
        // SAFETY: non-zero size.
        let p = unsafe { std::alloc::alloc(layout) };
        if p.is_null() {
            return Err(driver(
                "alloc",
                format!("out of host memory ({bytes} bytes)"),
            ));
        }
        let addr = p as usize as u64;
        self.allocs
            .lock()
            .map_err(|e| driver("alloc", e))?
            .insert(addr, layout);
        Ok(addr)
    }

    unsafe fn free(&self, ptr: u64) {
        if let Ok(mut m) = self.allocs.lock()
            && let Some(layout) = m.remove(&ptr)
        {
            // SAFETY: allocated by `alloc` with this layout.
            unsafe { std::alloc::dealloc(ptr as usize as *mut u8, layout) }
        }
    }

    unsafe fn upload(&self, dst: u64, src: &[u8]) -> Result<()> {
        // SAFETY: caller contract.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst as usize as *mut u8, src.len()) };
        Ok(())
    }

    unsafe fn download(&self, dst: &mut [u8], src: u64) -> Result<()> {
        // SAFETY: caller contract.
        unsafe {
            std::ptr::copy_nonoverlapping(src as usize as *const u8, dst.as_mut_ptr(), dst.len())
        };
        Ok(())
    }

    unsafe fn copy(&self, dst: u64, src: u64, bytes: usize) -> Result<()> {
        // SAFETY: caller contract; `copy` allows overlap like a device memmove.
        unsafe { std::ptr::copy(src as usize as *const u8, dst as usize as *mut u8, bytes) };
        Ok(())
    }

    unsafe fn launch(&self, kernel: &'static str, l: Launch, args: &[Arg]) -> Result<()> {
        let cfg = &LaunchConfig {
            grid: l.grid,
            block: l.block,
            wave: self.info.wave,
            shared_bytes: l.shared_bytes as usize,
        };
        dispatch!(kernel, cfg, args;
            wf_layer_norm_192(x, y, g, b, rows, eps);
            wf_layer_norm_384(x, y, g, b, rows, eps);
            wf_layer_norm_768(x, y, g, b, rows, eps);
            wf_layer_norm_affine_192(x, y, g, b, rows, eps);
            wf_layer_norm_affine_384(x, y, g, b, rows, eps);
            wf_layer_norm_affine_768(x, y, g, b, rows, eps);
            wf_add_layer_norm_192(res, br, rout, y, g, b, rows, eps);
            wf_add_layer_norm_384(res, br, rout, y, g, b, rows, eps);
            wf_add_layer_norm_768(res, br, rout, y, g, b, rows, eps);
            wf_add_layer_norm_affine_192(res, br, rout, y, g, b, rows, eps);
            wf_add_layer_norm_affine_384(res, br, rout, y, g, b, rows, eps);
            wf_add_layer_norm_affine_768(res, br, rout, y, g, b, rows, eps);
            wf_layer_norm_gather_192(src, idx, out, g, b, n_out, n_src, eps);
            wf_layer_norm_gather_384(src, idx, out, g, b, n_out, n_src, eps);
            wf_layer_norm_gather_768(src, idx, out, g, b, n_out, n_src, eps);
            wf_layer_norm_gather_affine_192(src, idx, out, g, b, n_out, n_src, eps);
            wf_layer_norm_gather_affine_384(src, idx, out, g, b, n_out, n_src, eps);
            wf_layer_norm_gather_affine_768(src, idx, out, g, b, n_out, n_src, eps);
            wf_gather_192(src, idx, out, n_out, n_src);
            wf_gather_384(src, idx, out, n_out, n_src);
            wf_gather_768(src, idx, out, n_out, n_src);
            wf_gather_generic(src, idx, out, n_out, n_src, vecs);
            wf_add_layer_norm_gather_192(res, br, rout, idx, out, g, b, n_out, n_src, eps);
            wf_add_layer_norm_gather_384(res, br, rout, idx, out, g, b, n_out, n_src, eps);
            wf_add_layer_norm_gather_768(res, br, rout, idx, out, g, b, n_out, n_src, eps);
            wf_add_layer_norm_gather_affine_192(res, br, rout, idx, out, g, b, n_out, n_src, eps);
            wf_add_layer_norm_gather_affine_384(res, br, rout, idx, out, g, b, n_out, n_src, eps);
            wf_add_layer_norm_gather_affine_768(res, br, rout, idx, out, g, b, n_out, n_src, eps);
            wf_bias_gelu_f16(x, b, y, n, cols);
            wf_bias_gelu_bf16(x, b, y, n, cols);
            wf_bias_gelu_tanh_f16(x, b, y, n, cols);
            wf_bias_gelu_tanh_bf16(x, b, y, n, cols);
            wf_bias_gelu_f16_scalar(x, b, y, n, cols);
            wf_bias_gelu_bf16_scalar(x, b, y, n, cols);
            wf_bias_gelu_tanh_f16_scalar(x, b, y, n, cols);
            wf_bias_gelu_tanh_bf16_scalar(x, b, y, n, cols);
            wf_qkv_split(x, b, q, k, v, n, heads, tokens, scale);
            wf_qkv_split_bias(x, b, q, k, v, n, heads, tokens, scale);
            wf_bias_mask_add(s, b, m, ty, sl, heads, tv, nt, ns);
            wf_bias_mask_add_nomask(s, b, m, ty, sl, heads, tv, nt, ns);
            wf_bias_mask_softmax_144(s, p, b, m, ty, sl, rows, heads, nt, ns);
            wf_bias_mask_softmax_nomask_144(s, p, b, m, ty, sl, rows, heads, nt, ns);
        )
    }

    fn synchronize(&self) -> Result<()> {
        Ok(())
    }

    fn record(&self) -> Result<EventHandle> {
        Ok(EventHandle::Cpu(std::time::Instant::now()))
    }

    fn elapsed_ms(&self, start: &EventHandle, end: &EventHandle) -> Result<f32> {
        match (start, end) {
            (EventHandle::Cpu(a), EventHandle::Cpu(b)) => {
                Ok(b.duration_since(*a).as_secs_f32() * 1e3)
            }
            _ => Err(driver("elapsed", "events of another backend")),
        }
    }

    fn destroy_event(&self, _: &EventHandle) {}

    fn mem_info(&self) -> Result<(usize, usize)> {
        let used: usize = self
            .allocs
            .lock()
            .map_err(|e| driver("mem_info", e))?
            .values()
            .map(|l| l.size())
            .sum();
        Ok((usize::MAX - used, usize::MAX))
    }
}
