//! A Linear with its bias in the GEMM's epilogue: `y = f16(x W^T + b)`,
//! the f32 accumulator plus the bias rounded once to f16, as PyTorch's f16
//! `F.linear` gives it (cuBLAS adds the bias in its epilogue). A GEMM whose
//! f16 output gets the bias in a second op rounds twice,
//! `f16(f16(x W^T) + b)`; in the Pangu stage that second rounding of the
//! QKV and projection outputs (and a third, of the first MLP layer's, before
//! the GELU) was what kept the candle + wavefuse build's output error above
//! PyTorch's own (`benches/pangu_rounding.py` measures each point).
//!
//! [`linear_no_bias`] is the same GEMM without a bias (the default
//! epilogue): no zero-bias buffer, nothing added.
//!
//! Operands: `x` `[rows, in]`, `w` `[out, in]` (PyTorch's layout), `b`
//! `[out]`, all f16 and contiguous, each starting on a 256-byte boundary of
//! its storage (cuBLASLt's default alignment preference, which its algorithm
//! heuristic assumes); anything else is an error naming the op and the
//! argument. The output is a fresh `[rows, out]` f16 tensor.
//!
//! - CUDA: one `cublasLtMatmul` with `CUBLASLT_EPILOGUE_BIAS` (f32 compute,
//!   f32 scale, f16 A/B/C/D and bias) on candle's stream, reading candle's
//!   memory and writing an allocation from candle's device; one cuBLASLt
//!   handle per candle device, created on first use and kept (with its
//!   workspace: 32 MiB on Hopper, from candle's stream).
//! - CPU: the same numerics by a different route: the operands widened to
//!   f32, candle's f32 GEMM, the bias added in f32, one rounding to f16.
//!   (candle's own f16 CPU GEMM accumulates in f32 per depth block but adds
//!   the blocks in f16, so for `in` above its block size it rounds more
//!   than once; the wavefuse build must not model that.)
use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, DType, Layout, Result, Shape, Tensor};
use half::f16;

const OP: &str = "wavefuse-linear";

/// cuBLASLt's default minimum alignment of A, B, C and D
/// (`CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*_BYTES`).
const LT_ALIGN_BYTES: usize = 256;

/// `y = x W^T + b` rounded once: `CustomOp3` on `x` `[rows, in]`, `w`
/// `[out, in]`, `b` `[out]` (see the module docs).
#[derive(Clone, Copy, Debug, Default)]
pub struct Linear;

/// `y = x W^T` rounded once: `CustomOp2` on `x` `[rows, in]`, `w` `[out,
/// in]` (see the module docs).
#[derive(Clone, Copy, Debug, Default)]
pub struct LinearNoBias;

/// Rows, inputs and outputs of a checked operand triple, and each operand's
/// start offset in its storage (the bias's 0 when there is none).
#[derive(Clone, Copy, Debug)]
struct Dims {
    rows: usize,
    inp: usize,
    out: usize,
    starts: [usize; 3],
}

fn operand(name: &'static str, dtype: DType, l: &Layout) -> Result<usize> {
    if dtype != DType::F16 {
        candle_core::bail!("{OP}: `{name}` is {dtype:?}, expected F16");
    }
    let Some((start, _)) = l.contiguous_offsets() else {
        candle_core::bail!(
            "{OP}: `{name}` is not contiguous (shape {:?}, stride {:?}); call .contiguous() first",
            l.dims(),
            l.stride()
        );
    };
    if !(start * 2).is_multiple_of(LT_ALIGN_BYTES) {
        candle_core::bail!(
            "{OP}: `{name}` starts at element {start} of its storage, not on a {LT_ALIGN_BYTES}-byte \
             boundary; call .force_contiguous() first"
        );
    }
    Ok(start)
}

type Operand<'a> = (&'static str, DType, &'a Layout);

fn check(x: Operand, w: Operand, b: Option<Operand>) -> Result<Dims> {
    let starts = [
        operand(x.0, x.1, x.2)?,
        operand(w.0, w.1, w.2)?,
        match b {
            Some(b) => operand(b.0, b.1, b.2)?,
            None => 0,
        },
    ];
    let (rows, inp) = match *x.2.dims() {
        [r, i] => (r, i),
        ref d => candle_core::bail!("{OP}: `x` is {d:?}, expected [rows, in]"),
    };
    let out = match *w.2.dims() {
        [o, i] if i == inp => o,
        ref d => {
            candle_core::bail!("{OP}: `w` is {d:?}, expected [out, {inp}] (x is [{rows}, {inp}])")
        }
    };
    if let Some(b) = b
        && b.2.dims() != [out]
    {
        candle_core::bail!("{OP}: `b` is {:?}, expected [{out}]", b.2.dims());
    }
    if inp == 0 {
        candle_core::bail!("{OP}: `x` is [{rows}, 0]: no inputs to the Linear");
    }
    // cuBLASLt takes 64-bit sizes but 32-bit-safe leading dimensions are
    // what every algorithm supports.
    if [rows, inp, out].iter().any(|&d| d > i32::MAX as usize) {
        candle_core::bail!("{OP}: [{rows}, {inp}] x [{out}, {inp}] overflows cuBLASLt's sizes");
    }
    Ok(Dims {
        rows,
        inp,
        out,
        starts,
    })
}

/// The CPU route: operands widened to f32, candle's f32 GEMM, the bias (if
/// any) added in f32, one rounding to f16.
fn cpu_linear(
    x: &CpuStorage,
    w: &CpuStorage,
    b: Option<&CpuStorage>,
    d: Dims,
) -> Result<(CpuStorage, Shape)> {
    let widen = |s: &CpuStorage, start: usize, len: usize, dims: &[usize]| -> Result<Tensor> {
        let v: Vec<f32> = s.as_slice::<f16>()?[start..start + len]
            .iter()
            .map(|h| h.to_f32())
            .collect();
        Tensor::from_vec(v, dims, &candle_core::Device::Cpu)
    };
    if d.rows * d.out == 0 {
        return Ok((CpuStorage::F16(Vec::new()), Shape::from((d.rows, d.out))));
    }
    let xt = widen(x, d.starts[0], d.rows * d.inp, &[d.rows, d.inp])?;
    let wt = widen(w, d.starts[1], d.out * d.inp, &[d.out, d.inp])?;
    let mut y = xt.matmul(&wt.t()?)?;
    if let Some(b) = b {
        y = y.broadcast_add(&widen(b, d.starts[2], d.out, &[d.out])?)?;
    }
    let y: Vec<f16> = y
        .flatten_all()?
        .to_vec1::<f32>()?
        .into_iter()
        .map(f16::from_f32)
        .collect();
    Ok((CpuStorage::F16(y), Shape::from((d.rows, d.out))))
}

impl candle_core::CustomOp3 for Linear {
    fn name(&self) -> &'static str {
        OP
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let d = check(
            ("x", s1.dtype(), l1),
            ("w", s2.dtype(), l2),
            Some(("b", s3.dtype(), l3)),
        )?;
        cpu_linear(s1, s2, Some(s3), d)
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
        s3: &candle_core::CudaStorage,
        l3: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let d = check(
            ("x", s1.dtype(), l1),
            ("w", s2.dtype(), l2),
            Some(("b", s3.dtype(), l3)),
        )?;
        cuda::linear(s1, s2, Some(s3), d)
    }
}

impl candle_core::CustomOp2 for LinearNoBias {
    fn name(&self) -> &'static str {
        OP
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let d = check(("x", s1.dtype(), l1), ("w", s2.dtype(), l2), None)?;
        cpu_linear(s1, s2, None, d)
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let d = check(("x", s1.dtype(), l1), ("w", s2.dtype(), l2), None)?;
        cuda::linear(s1, s2, None, d)
    }
}

#[cfg(feature = "cuda")]
mod cuda {
    use super::{Dims, OP};
    use candle_core::cuda_backend::cudarc::cublaslt::{CudaBlasLT, Matmul, MatmulConfig};
    use candle_core::cuda_backend::{CudaDevice, DeviceId};
    use candle_core::{CudaStorage, Result, Shape};
    use half::f16;
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex, OnceLock};

    /// candle device `dev`'s cuBLASLt handle, on candle's stream; created on
    /// first use and kept for the life of the process (as the wavefuse
    /// devices are).
    fn handle(dev: &CudaDevice) -> Result<Arc<CudaBlasLT>> {
        static HANDLES: OnceLock<Mutex<HashMap<DeviceId, Arc<CudaBlasLT>>>> = OnceLock::new();
        let mut m = HANDLES
            .get_or_init(Default::default)
            .lock()
            // A panic while holding the lock leaves a valid map.
            .unwrap_or_else(|e| e.into_inner());
        if let Some(h) = m.get(&dev.id()) {
            return Ok(h.clone());
        }
        let h = Arc::new(
            CudaBlasLT::new(dev.cuda_stream())
                .map_err(|e| candle_core::Error::Msg(format!("{OP}: cuBLASLt handle: {e:?}")))?,
        );
        m.insert(dev.id(), h.clone());
        Ok(h)
    }

    pub(super) fn linear(
        x: &CudaStorage,
        w: &CudaStorage,
        b: Option<&CudaStorage>,
        d: Dims,
    ) -> Result<(CudaStorage, Shape)> {
        let dev = x.device.clone();
        for (name, s) in [("w", Some(w)), ("b", b)] {
            if let Some(s) = s
                && s.device.id() != dev.id()
            {
                candle_core::bail!("{OP}: `{name}` is on another device than `x`");
            }
        }
        let shape = Shape::from((d.rows, d.out));
        let n = d.rows * d.out;
        if n == 0 {
            return Ok((
                CudaStorage::wrap_cuda_slice(dev.alloc_zeros::<f16>(n)?, dev.clone()),
                shape,
            ));
        }
        let blas = handle(&dev)?;
        let xs = x.as_cuda_slice::<f16>()?;
        let ws = w.as_cuda_slice::<f16>()?;
        let bs = b.map(|b| b.as_cuda_slice::<f16>()).transpose()?;
        let xv = xs.slice(d.starts[0]..d.starts[0] + d.rows * d.inp);
        let wv = ws.slice(d.starts[1]..d.starts[1] + d.out * d.inp);
        let bv = bs.map(|bs| bs.slice(d.starts[2]..d.starts[2] + d.out));
        // SAFETY: uninitialised until the GEMM below writes every element,
        // queued on the same stream before any read of it.
        let mut y = unsafe { dev.alloc::<f16>(n)? };
        // cuBLASLt is column-major: the row-major `[rows, out]` output is
        // the column-major `[out, rows]` matrix `W x^T`, W read transposed
        // from its row-major `[out, in]` (column-major `[in, out]`), `x^T`
        // from row-major `[rows, in]` (column-major `[in, rows]`). The bias
        // runs along the output's `out` axis (cuBLASLt's `m`).
        let cfg = MatmulConfig {
            transa: true,
            transb: false,
            transc: false,
            m: d.out as u64,
            n: d.rows as u64,
            k: d.inp as u64,
            alpha: 1.0,
            lda: d.inp as i64,
            ldb: d.inp as i64,
            beta: 0.0,
            ldc: d.out as i64,
            stride_a: None,
            stride_b: None,
            stride_c: None,
            stride_bias: None,
            batch_size: None,
        };
        // SAFETY: the views span exactly the operands' checked elements
        // (`check`: contiguous, in range of their storages, 256-byte
        // aligned starts), `y` holds `out * rows` elements, the leading
        // dimensions match the dense layouts above, and everything is on
        // candle's stream, which the handle was created on (cudarc records
        // the reads and the write on it). Without a bias, cuBLASLt's
        // default epilogue.
        unsafe { blas.matmul(cfg, &wv, &xv, &mut y, bv.as_ref(), None) }
            .map_err(|e| candle_core::Error::Msg(format!("{OP}: cublasLtMatmul: {e:?}")))?;
        Ok((CudaStorage::wrap_cuda_slice(y, dev), shape))
    }
}

/// `f16(x W^T + b)`, one rounding (see [`Linear`]).
pub fn linear(x: &Tensor, w: &Tensor, b: &Tensor) -> Result<Tensor> {
    x.apply_op3_no_bwd(w, b, &Linear)
}

/// `f16(x W^T)`, one rounding, no bias (see [`LinearNoBias`]).
pub fn linear_no_bias(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    x.apply_op2_no_bwd(w, &LinearNoBias)
}
