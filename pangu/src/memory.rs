//! Device memory: the high-water mark of the CUDA memory pool that candle
//! allocates from (stream-ordered allocations), and the device's own
//! used/total count. `None` on the CPU.
use crate::error::Result;
use candle_core::Device;

/// High-water marks of the device's default memory pool since the last
/// [`reset_peak`], bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Peak {
    /// Bytes handed out to tensors at most (PyTorch's
    /// `max_memory_allocated`).
    pub used: u64,
    /// Bytes the pool held from the device at most (PyTorch's
    /// `max_memory_reserved`).
    pub reserved: u64,
}

#[cfg(feature = "cuda")]
mod imp {
    use super::Peak;
    use crate::error::{Error, Result};
    use candle_core::Device;
    use candle_core::cuda_backend::cudarc::driver::{result, sys};

    fn err(e: impl std::fmt::Debug) -> Error {
        Error::Candle(candle_core::Error::Msg(format!("device memory: {e:?}")))
    }

    fn pool(dev: &Device) -> Result<Option<sys::CUmemoryPool>> {
        let Device::Cuda(c) = dev else {
            return Ok(None);
        };
        let ctx = c.cuda_stream().context().clone();
        ctx.bind_to_thread().map_err(err)?;
        // SAFETY: the device handle comes from a live context.
        let pool = unsafe { result::device::get_default_mem_pool(ctx.cu_device()) }.map_err(err)?;
        Ok(Some(pool))
    }

    fn attr(pool: sys::CUmemoryPool, a: sys::CUmemPool_attribute) -> Result<u64> {
        let mut v: u64 = 0;
        // SAFETY: the *_MEM_HIGH attributes are cuuint64_t, `v` is one.
        unsafe { result::mem_pool::get_attribute(pool, a, (&mut v as *mut u64).cast()) }
            .map_err(err)?;
        Ok(v)
    }

    pub fn reset_peak(dev: &Device) -> Result<()> {
        let Some(pool) = pool(dev)? else {
            return Ok(());
        };
        dev.synchronize()?;
        for a in [
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH,
        ] {
            let mut zero: u64 = 0;
            // SAFETY: the *_MEM_HIGH attributes are reset by writing a
            // cuuint64_t zero.
            unsafe { result::mem_pool::set_attribute(pool, a, (&mut zero as *mut u64).cast()) }
                .map_err(err)?;
        }
        Ok(())
    }

    pub fn peak(dev: &Device) -> Result<Option<Peak>> {
        let Some(pool) = pool(dev)? else {
            return Ok(None);
        };
        dev.synchronize()?;
        Ok(Some(Peak {
            used: attr(
                pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH,
            )?,
            reserved: attr(
                pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH,
            )?,
        }))
    }

    pub fn device_used(dev: &Device) -> Result<Option<(u64, u64)>> {
        let Device::Cuda(c) = dev else {
            return Ok(None);
        };
        let (free, total) = c.cuda_stream().context().mem_get_info().map_err(err)?;
        Ok(Some(((total - free) as u64, total as u64)))
    }
}

#[cfg(not(feature = "cuda"))]
mod imp {
    use super::Peak;
    use crate::error::Result;
    use candle_core::Device;

    pub fn reset_peak(_: &Device) -> Result<()> {
        Ok(())
    }

    pub fn peak(_: &Device) -> Result<Option<Peak>> {
        Ok(None)
    }

    pub fn device_used(_: &Device) -> Result<Option<(u64, u64)>> {
        Ok(None)
    }
}

/// Restarts the pool's high-water marks (after synchronising).
pub fn reset_peak(dev: &Device) -> Result<()> {
    imp::reset_peak(dev)
}

/// The pool's high-water marks since [`reset_peak`] (after
/// synchronising); `None` on the CPU.
pub fn peak(dev: &Device) -> Result<Option<Peak>> {
    imp::peak(dev)
}

/// `(used, total)` bytes of the whole device now (every context and
/// allocator on it); `None` on the CPU.
pub fn device_used(dev: &Device) -> Result<Option<(u64, u64)>> {
    imp::device_used(dev)
}
