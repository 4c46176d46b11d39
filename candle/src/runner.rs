//! How a wavefuse kernel runs on candle tensors: the wavefuse device behind
//! a candle device (opened once per device and kept), the operand checks
//! every op shares, and the two data paths.
//!
//! - CUDA: candle's own memory and candle's own stream. Each operand is a
//!   view ([`wavefuse::View::from_raw`]) of the tensor's CUDA allocation at
//!   its layout's start offset, taken through cudarc's `device_ptr` /
//!   `device_ptr_mut` on candle's stream (so cudarc's read/write events stay
//!   right); outputs are fresh allocations from candle's device; the kernel
//!   is queued on candle's stream ([`wavefuse::Device::wrap_stream`]) and
//!   nothing waits for it. No copies.
//! - CPU: wavefuse's CPU emulator (the same kernel source, run thread by
//!   thread). Operands are staged through emulator buffers (upload, run,
//!   download): the emulator is the correctness backend, and staging keeps
//!   16-byte alignment independent of the host allocator.
//!
//! Operand rule (both paths): the dtype the op names, a contiguous layout,
//! and a start offset that keeps the 16-byte alignment of the allocation
//! (for f16: a multiple of 8 elements). Anything else is an error that
//! names the op and the argument and says what to call; nothing is copied
//! behind the caller's back.
use candle_core::{CpuStorage, DType, DeviceLocation, Layout, Result};
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use wavefuse::{Elem, View, ViewMut, f16};

/// Alignment the kernels' 16-byte vector paths need.
const ALIGN_BYTES: usize = 16;

/// Where a wavefuse device lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum DevKey {
    Cpu,
    Cuda(usize),
}

impl DevKey {
    pub(crate) fn of(dev: &candle_core::Device) -> Result<DevKey> {
        match dev.location() {
            DeviceLocation::Cpu => Ok(DevKey::Cpu),
            DeviceLocation::Cuda { gpu_id } => Ok(DevKey::Cuda(gpu_id)),
            loc => candle_core::bail!("wavefuse: no backend for candle device {loc:?}"),
        }
    }
}

/// The wavefuse device for `key`, opened on first use and kept for the
/// life of the process: one per candle device, so plans and tables built
/// for it are valid for every later launch there.
pub(crate) fn wf_device(key: DevKey) -> Result<wavefuse::Device> {
    static DEVICES: OnceLock<Mutex<HashMap<DevKey, wavefuse::Device>>> = OnceLock::new();
    let mut m = DEVICES
        .get_or_init(Default::default)
        .lock()
        // A panic while holding the lock leaves a valid map.
        .unwrap_or_else(|e| e.into_inner());
    if let Some(d) = m.get(&key) {
        return Ok(d.clone());
    }
    let choice = match key {
        DevKey::Cpu => wavefuse::Choice::Cpu(wavefuse::Wave::W64),
        DevKey::Cuda(n) => wavefuse::Choice::Cuda(n),
    };
    let d = wavefuse::Device::open(choice)
        .map_err(|e| candle_core::Error::Msg(format!("wavefuse: cannot open {key:?}: {e}")))?;
    m.insert(key, d.clone());
    Ok(d)
}

/// A wavefuse error as a candle error, prefixed with the candle op.
pub(crate) fn wf_err(op: &'static str) -> impl Fn(wavefuse::Error) -> candle_core::Error {
    move |e| candle_core::Error::Msg(format!("{op}: {e}"))
}

/// One operand as an op names it: the storage, its layout, the argument's
/// name and the dtype the kernel reads.
pub(crate) struct Operand<'a, S> {
    pub s: &'a S,
    pub l: &'a Layout,
    pub name: &'static str,
    pub dtype: DType,
}

impl<S> Clone for Operand<'_, S> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<S> Copy for Operand<'_, S> {}

impl<'a, S> Operand<'a, S> {
    /// An f16 operand (ops that take another dtype set `dtype` after
    /// checking the storage's).
    pub fn f16(s: &'a S, l: &'a Layout, name: &'static str) -> Self {
        Operand {
            s,
            l,
            name,
            dtype: DType::F16,
        }
    }
}

/// Checks an operand's layout against the rule in the module docs and
/// returns its elements as `(start, len)`.
pub(crate) fn span(
    op: &'static str,
    name: &'static str,
    l: &Layout,
    got: DType,
    want: DType,
) -> Result<(usize, usize)> {
    if got != want {
        candle_core::bail!("{op}: `{name}` is {got:?}, expected {want:?}");
    }
    let Some((start, end)) = l.contiguous_offsets() else {
        candle_core::bail!(
            "{op}: `{name}` is not contiguous (shape {:?}, stride {:?}); call .contiguous() first",
            l.dims(),
            l.stride()
        );
    };
    if !(start * want.size_in_bytes()).is_multiple_of(ALIGN_BYTES) {
        candle_core::bail!(
            "{op}: `{name}` starts at element {start} of its storage, not on a {ALIGN_BYTES}-byte \
             boundary; call .force_contiguous() first"
        );
    }
    Ok((start, end - start))
}

/// An operand's memory as the kernel sees it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Raw {
    ptr: u64,
    len: usize,
    dtype: DType,
}

impl Raw {
    /// Elements `off..off + len` (`None` when out of range).
    fn part(self, off: usize, len: usize) -> Option<Raw> {
        (off.checked_add(len)? <= self.len).then(|| Raw {
            ptr: self.ptr + (off * self.dtype.size_in_bytes()) as u64,
            len,
            dtype: self.dtype,
        })
    }
}

fn bad_part(op: &'static str, what: &'static str) -> wavefuse::Error {
    wavefuse::Error::BadParameter {
        op,
        what,
        value: String::new(),
        why: "part out of range (adapter bug)",
    }
}

/// The operands of one launch, as wavefuse views.
pub(crate) struct Io<'a> {
    /// The stream to queue on.
    pub q: &'a wavefuse::Stream,
    dev: &'a wavefuse::Device,
    op: &'static str,
    ins: Vec<Raw>,
    inout: Option<Raw>,
    outs: Vec<Option<Raw>>,
}

impl<'a> Io<'a> {
    /// Elements `off..off + len` of input `i` (all of it with `len ==
    /// None`), read-only.
    pub fn input<T: Elem>(
        &self,
        i: usize,
        off: usize,
        len: Option<usize>,
    ) -> wavefuse::Result<View<'a, T>> {
        let r = self
            .ins
            .get(i)
            .copied()
            .ok_or_else(|| bad_part(self.op, "input"))?;
        let r = r
            .part(off, len.unwrap_or(r.len.saturating_sub(off)))
            .ok_or_else(|| bad_part(self.op, "input"))?;
        if r.dtype.as_str() != T::NAME {
            return Err(bad_part(self.op, "input dtype"));
        }
        // SAFETY: the runner holds candle's read lock on the storage (and on
        // CUDA cudarc's read guard on candle's stream) for the whole launch,
        // the span lies inside it (`span` + `part`), and nothing writes it
        // while the queued work can read it: candle orders every later use
        // of the storage after this launch on the same stream, and frees it
        // stream-ordered.
        unsafe { View::from_raw(self.dev, r.ptr, r.len) }
    }

    /// The tensor updated in place (once).
    pub fn inout(&mut self) -> wavefuse::Result<ViewMut<'a, f16>> {
        let r = self
            .inout
            .take()
            .ok_or_else(|| bad_part(self.op, "inout"))?;
        // SAFETY: candle's write lock on the storage is held for the launch;
        // taken once, so no other view of the span is writable; inputs are
        // other storages (candle rejects aliased in-place operands).
        unsafe { ViewMut::from_raw(self.dev, r.ptr, r.len) }
    }

    /// Output `i` (once) cut into consecutive parts of `lens` elements.
    pub fn output(&mut self, i: usize, lens: &[usize]) -> wavefuse::Result<Vec<ViewMut<'a, f16>>> {
        let r = self
            .outs
            .get_mut(i)
            .and_then(Option::take)
            .ok_or_else(|| bad_part(self.op, "output"))?;
        let mut off = 0;
        let mut v = Vec::with_capacity(lens.len());
        for &n in lens {
            let p = r.part(off, n).ok_or_else(|| bad_part(self.op, "output"))?;
            off += n;
            // SAFETY: a fresh allocation of this launch, taken once, cut
            // into disjoint parts; it lives until the caller wraps it in a
            // candle storage after the launch is queued.
            v.push(unsafe { ViewMut::from_raw(self.dev, p.ptr, p.len) }?);
        }
        Ok(v)
    }
}

/// An op on empty tensors is a no-op (as every wavefuse op): nothing is
/// viewed or launched when the main operand, the in-place operand or an
/// output has no elements (the shape checks have run before).
fn nothing_to_do<S>(ins: &[Operand<'_, S>], inout: Option<&Layout>, out_lens: &[usize]) -> bool {
    ins.first().is_some_and(|o| o.l.shape().elem_count() == 0)
        || inout.is_some_and(|l| l.shape().elem_count() == 0)
        || out_lens.contains(&0)
}

/// The in-place operand: storage, layout, name (always f16).
pub(crate) type InOut<'a, S> = (&'a mut S, &'a Layout, &'static str);

/// A data path: how operands of one candle backend reach a kernel.
pub(crate) trait Path {
    /// candle's storage of this backend.
    type S: candle_core::backend::BackendStorage;

    /// Checks the operands, runs `f` on views of them and of fresh f16
    /// outputs of `out_lens` elements, and returns the outputs.
    fn run(
        op: &'static str,
        ins: &[Operand<'_, Self::S>],
        inout: Option<InOut<'_, Self::S>>,
        out_lens: &[usize],
        f: impl FnOnce(&mut Io<'_>) -> wavefuse::Result<()>,
    ) -> Result<Vec<Self::S>>;

    /// The storage as candle's backend-independent one.
    fn storage(s: Self::S) -> candle_core::Storage;
}

/// The CPU emulator path.
pub(crate) struct Cpu;

impl Path for Cpu {
    type S = CpuStorage;

    fn run(
        op: &'static str,
        ins: &[Operand<'_, CpuStorage>],
        inout: Option<InOut<'_, CpuStorage>>,
        out_lens: &[usize],
        f: impl FnOnce(&mut Io<'_>) -> wavefuse::Result<()>,
    ) -> Result<Vec<CpuStorage>> {
        run_cpu(op, ins, inout, out_lens, f)
    }

    fn storage(s: CpuStorage) -> candle_core::Storage {
        candle_core::Storage::Cpu(s)
    }
}

/// Runs `f` on the CPU emulator: inputs and the in-place operand uploaded
/// to emulator buffers, outputs (`f16`, `out_lens` elements each)
/// allocated there, the in-place operand and outputs downloaded after.
fn run_cpu(
    op: &'static str,
    ins: &[Operand<'_, CpuStorage>],
    inout: Option<InOut<'_, CpuStorage>>,
    out_lens: &[usize],
    f: impl FnOnce(&mut Io<'_>) -> wavefuse::Result<()>,
) -> Result<Vec<CpuStorage>> {
    use candle_core::backend::BackendStorage;
    if nothing_to_do(ins, inout.as_ref().map(|i| i.1), out_lens) {
        return Ok(out_lens
            .iter()
            .map(|&n| CpuStorage::F16(vec![f16::ZERO; n]))
            .collect());
    }
    let dev = wf_device(DevKey::Cpu)?;
    let e = wf_err(op);
    // The uploaded inputs, alive until the launch has run.
    let mut halves = Vec::new();
    let mut bhalves = Vec::new();
    let mut floats = Vec::new();
    let mut raws = Vec::with_capacity(ins.len());
    for o in ins {
        let (start, len) = span(op, o.name, o.l, o.s.dtype(), o.dtype)?;
        let ptr = match o.dtype {
            DType::F16 => {
                let b = dev
                    .upload(&o.s.as_slice::<f16>()?[start..start + len])
                    .map_err(&e)?;
                let p = b.device_ptr();
                halves.push(b);
                p
            }
            DType::BF16 => {
                let b = dev
                    .upload(&o.s.as_slice::<wavefuse::bf16>()?[start..start + len])
                    .map_err(&e)?;
                let p = b.device_ptr();
                bhalves.push(b);
                p
            }
            DType::F32 => {
                let b = dev
                    .upload(&o.s.as_slice::<f32>()?[start..start + len])
                    .map_err(&e)?;
                let p = b.device_ptr();
                floats.push(b);
                p
            }
            d => candle_core::bail!("{op}: `{}` dtype {d:?} has no kernel", o.name),
        };
        raws.push(Raw {
            ptr,
            len,
            dtype: o.dtype,
        });
    }
    let mut io_buf = None;
    let mut inout_raw = None;
    let mut inout_dst = None;
    if let Some((s, l, name)) = inout {
        let (start, len) = span(op, name, l, s.dtype(), DType::F16)?;
        let CpuStorage::F16(v) = s else {
            candle_core::bail!("{op}: `{name}` is not f16");
        };
        let b = dev.upload(&v[start..start + len]).map_err(&e)?;
        inout_raw = Some(Raw {
            ptr: b.device_ptr(),
            len,
            dtype: DType::F16,
        });
        io_buf = Some(b);
        inout_dst = Some((v, start));
    }
    let outs = out_lens
        .iter()
        .map(|&n| dev.alloc::<f16>(n).map_err(&e))
        .collect::<Result<Vec<_>>>()?;
    let mut io = Io {
        q: dev.stream(),
        dev: &dev,
        op,
        ins: raws,
        inout: inout_raw,
        outs: outs
            .iter()
            .map(|b| {
                Some(Raw {
                    ptr: b.device_ptr(),
                    len: b.len(),
                    dtype: DType::F16,
                })
            })
            .collect(),
    };
    f(&mut io).map_err(&e)?;
    drop((halves, bhalves));
    if let (Some(b), Some((v, start))) = (io_buf, inout_dst) {
        let r = b.download().map_err(&e)?;
        v[start..start + r.len()].copy_from_slice(&r);
    }
    outs.iter()
        .map(|b| Ok(CpuStorage::F16(b.download().map_err(&e)?)))
        .collect()
}

#[cfg(feature = "cuda")]
pub(crate) use cuda::Cuda;

#[cfg(feature = "cuda")]
mod cuda {
    use super::{DevKey, InOut, Io, Operand, Path, Raw, nothing_to_do, span, wf_device, wf_err};
    use candle_core::backend::{BackendDevice, BackendStorage};
    use candle_core::cuda_backend::cudarc::driver::{
        CudaSlice, DevicePtr, DevicePtrMut, SyncOnDrop,
    };
    use candle_core::{CudaStorage, DType, DeviceLocation, Result};
    use wavefuse::f16;

    /// candle's CUDA path.
    pub(crate) struct Cuda;

    impl Path for Cuda {
        type S = CudaStorage;

        fn run(
            op: &'static str,
            ins: &[Operand<'_, CudaStorage>],
            inout: Option<InOut<'_, CudaStorage>>,
            out_lens: &[usize],
            f: impl FnOnce(&mut Io<'_>) -> wavefuse::Result<()>,
        ) -> Result<Vec<CudaStorage>> {
            run_cuda(op, ins, inout, out_lens, f)
        }

        fn storage(s: CudaStorage) -> candle_core::Storage {
            candle_core::Storage::Cuda(s)
        }
    }

    /// Runs `f` on candle's stream over candle's memory (see the module
    /// docs); outputs are `f16` allocations of `out_lens` elements from
    /// candle's device.
    fn run_cuda(
        op: &'static str,
        ins: &[Operand<'_, CudaStorage>],
        inout: Option<InOut<'_, CudaStorage>>,
        out_lens: &[usize],
        f: impl FnOnce(&mut Io<'_>) -> wavefuse::Result<()>,
    ) -> Result<Vec<CudaStorage>> {
        let cdev = match (&inout, ins.first()) {
            (Some((s, _, _)), _) => s.device.clone(),
            (None, Some(o)) => o.s.device.clone(),
            (None, None) => candle_core::bail!("{op}: no operands"),
        };
        // Checks first, so that a bad operand allocates nothing.
        let mut spans = Vec::with_capacity(ins.len());
        for o in ins {
            if o.s.device.id() != cdev.id() {
                candle_core::bail!("{op}: `{}` is on another device", o.name);
            }
            spans.push(span(op, o.name, o.l, o.s.dtype(), o.dtype)?);
        }
        let inout_span = match &inout {
            Some((s, l, name)) => Some(span(op, name, l, s.dtype(), DType::F16)?),
            None => None,
        };
        if nothing_to_do(ins, inout.as_ref().map(|i| i.1), out_lens) {
            return out_lens
                .iter()
                .map(|&n| {
                    Ok(CudaStorage::wrap_cuda_slice(
                        cdev.alloc_zeros::<f16>(n)?,
                        cdev.clone(),
                    ))
                })
                .collect();
        }
        let ordinal = match cdev.location() {
            DeviceLocation::Cuda { gpu_id } => gpu_id,
            loc => candle_core::bail!("{op}: candle CUDA device at {loc:?}"),
        };
        let dev = wf_device(DevKey::Cuda(ordinal))?;
        let e = wf_err(op);
        let stream = cdev.cuda_stream();
        // SAFETY: candle's stream of `cdev` (a stream of the device's
        // primary context, checked by wrap_stream), alive while `cdev` is,
        // which outlives `q` (dropped at the end of this function).
        let q =
            unsafe { dev.wrap_stream(stream.cu_stream() as *mut std::ffi::c_void) }.map_err(&e)?;
        let mut outs: Vec<CudaSlice<f16>> = out_lens
            .iter()
            // SAFETY: uninitialised until the kernel writes every element
            // (each op's contract), before any read on this stream.
            .map(|&n| unsafe { cdev.alloc::<f16>(n) })
            .collect::<Result<_>>()?;
        {
            // cudarc's guards: reads and writes recorded on candle's stream
            // when they drop, after the launch is queued.
            let mut guards: Vec<SyncOnDrop<'_>> = Vec::new();
            let mut raws = Vec::with_capacity(ins.len());
            for (o, &(start, len)) in ins.iter().zip(&spans) {
                let (ptr, g) = match o.dtype {
                    DType::F16 => o.s.as_cuda_slice::<f16>()?.device_ptr(&stream),
                    DType::BF16 => o.s.as_cuda_slice::<wavefuse::bf16>()?.device_ptr(&stream),
                    DType::F32 => o.s.as_cuda_slice::<f32>()?.device_ptr(&stream),
                    d => candle_core::bail!("{op}: `{}` dtype {d:?} has no kernel", o.name),
                };
                guards.push(g);
                raws.push(Raw {
                    ptr: ptr + (start * o.dtype.size_in_bytes()) as u64,
                    len,
                    dtype: o.dtype,
                });
            }
            let inout_raw = match (inout, inout_span) {
                (Some((s, _, _)), Some((start, len))) => {
                    let (ptr, g) = s.as_cuda_slice_mut::<f16>()?.device_ptr_mut(&stream);
                    guards.push(g);
                    Some(Raw {
                        ptr: ptr + (start * 2) as u64,
                        len,
                        dtype: DType::F16,
                    })
                }
                _ => None,
            };
            let mut out_raws = Vec::with_capacity(outs.len());
            for s in outs.iter_mut() {
                let len = s.len();
                let (ptr, g) = s.device_ptr_mut(&stream);
                guards.push(g);
                out_raws.push(Some(Raw {
                    ptr,
                    len,
                    dtype: DType::F16,
                }));
            }
            let mut io = Io {
                q: &q,
                dev: &dev,
                op,
                ins: raws,
                inout: inout_raw,
                outs: out_raws,
            };
            f(&mut io).map_err(&e)?;
        }
        Ok(outs
            .into_iter()
            .map(|s| CudaStorage::wrap_cuda_slice(s, cdev.clone()))
            .collect())
    }
}

/// Implements candle's `CustomOp1/2/3` for a type with
/// `fn fwd<P: Path>(&self, ins: &[Operand<'_, P::S>]) -> Result<(P::S, Shape)>`
/// on both paths, naming the operands (f16 unless `fwd` says otherwise).
macro_rules! custom_op {
    ($t:ty, $name:expr, CustomOp1, [$a:literal]) => {
        impl candle_core::CustomOp1 for $t {
            fn name(&self) -> &'static str {
                $name
            }

            fn cpu_fwd(
                &self,
                s: &candle_core::CpuStorage,
                l: &candle_core::Layout,
            ) -> candle_core::Result<(candle_core::CpuStorage, candle_core::Shape)> {
                self.fwd::<$crate::runner::Cpu>(&[$crate::runner::Operand::f16(s, l, $a)])
            }

            #[cfg(feature = "cuda")]
            fn cuda_fwd(
                &self,
                s: &candle_core::CudaStorage,
                l: &candle_core::Layout,
            ) -> candle_core::Result<(candle_core::CudaStorage, candle_core::Shape)> {
                self.fwd::<$crate::runner::Cuda>(&[$crate::runner::Operand::f16(s, l, $a)])
            }
        }
    };
    ($t:ty, $name:expr, CustomOp2, [$a:literal, $b:literal]) => {
        impl candle_core::CustomOp2 for $t {
            fn name(&self) -> &'static str {
                $name
            }

            fn cpu_fwd(
                &self,
                s1: &candle_core::CpuStorage,
                l1: &candle_core::Layout,
                s2: &candle_core::CpuStorage,
                l2: &candle_core::Layout,
            ) -> candle_core::Result<(candle_core::CpuStorage, candle_core::Shape)> {
                self.fwd::<$crate::runner::Cpu>(&[
                    $crate::runner::Operand::f16(s1, l1, $a),
                    $crate::runner::Operand::f16(s2, l2, $b),
                ])
            }

            #[cfg(feature = "cuda")]
            fn cuda_fwd(
                &self,
                s1: &candle_core::CudaStorage,
                l1: &candle_core::Layout,
                s2: &candle_core::CudaStorage,
                l2: &candle_core::Layout,
            ) -> candle_core::Result<(candle_core::CudaStorage, candle_core::Shape)> {
                self.fwd::<$crate::runner::Cuda>(&[
                    $crate::runner::Operand::f16(s1, l1, $a),
                    $crate::runner::Operand::f16(s2, l2, $b),
                ])
            }
        }
    };
    ($t:ty, $name:expr, CustomOp3, [$a:literal, $b:literal, $c:literal]) => {
        impl candle_core::CustomOp3 for $t {
            fn name(&self) -> &'static str {
                $name
            }

            fn cpu_fwd(
                &self,
                s1: &candle_core::CpuStorage,
                l1: &candle_core::Layout,
                s2: &candle_core::CpuStorage,
                l2: &candle_core::Layout,
                s3: &candle_core::CpuStorage,
                l3: &candle_core::Layout,
            ) -> candle_core::Result<(candle_core::CpuStorage, candle_core::Shape)> {
                self.fwd::<$crate::runner::Cpu>(&[
                    $crate::runner::Operand::f16(s1, l1, $a),
                    $crate::runner::Operand::f16(s2, l2, $b),
                    $crate::runner::Operand::f16(s3, l3, $c),
                ])
            }

            #[cfg(feature = "cuda")]
            fn cuda_fwd(
                &self,
                s1: &candle_core::CudaStorage,
                l1: &candle_core::Layout,
                s2: &candle_core::CudaStorage,
                l2: &candle_core::Layout,
                s3: &candle_core::CudaStorage,
                l3: &candle_core::Layout,
            ) -> candle_core::Result<(candle_core::CudaStorage, candle_core::Shape)> {
                self.fwd::<$crate::runner::Cuda>(&[
                    $crate::runner::Operand::f16(s1, l1, $a),
                    $crate::runner::Operand::f16(s2, l2, $b),
                    $crate::runner::Operand::f16(s3, l3, $c),
                ])
            }
        }
    };
}

/// Implements candle's `InplaceOp1/2/3` for a type with
/// `fn fwd_inplace<P: Path>(&self, dst: &mut P::S, dl: &Layout, ins: &[Operand<'_, P::S>]) -> Result<()>`
/// on both paths (the destination is named by `fwd_inplace`).
macro_rules! inplace_op {
    ($t:ty, $name:expr, InplaceOp1, []) => {
        impl candle_core::InplaceOp1 for $t {
            fn name(&self) -> &'static str {
                $name
            }

            fn cpu_fwd(
                &self,
                s: &mut candle_core::CpuStorage,
                l: &candle_core::Layout,
            ) -> candle_core::Result<()> {
                self.fwd_inplace::<$crate::runner::Cpu>(s, l, &[])
            }

            #[cfg(feature = "cuda")]
            fn cuda_fwd(
                &self,
                s: &mut candle_core::CudaStorage,
                l: &candle_core::Layout,
            ) -> candle_core::Result<()> {
                self.fwd_inplace::<$crate::runner::Cuda>(s, l, &[])
            }
        }
    };
    ($t:ty, $name:expr, InplaceOp2, [$b:literal]) => {
        impl candle_core::InplaceOp2 for $t {
            fn name(&self) -> &'static str {
                $name
            }

            fn cpu_fwd(
                &self,
                s1: &mut candle_core::CpuStorage,
                l1: &candle_core::Layout,
                s2: &candle_core::CpuStorage,
                l2: &candle_core::Layout,
            ) -> candle_core::Result<()> {
                self.fwd_inplace::<$crate::runner::Cpu>(
                    s1,
                    l1,
                    &[$crate::runner::Operand::f16(s2, l2, $b)],
                )
            }

            #[cfg(feature = "cuda")]
            fn cuda_fwd(
                &self,
                s1: &mut candle_core::CudaStorage,
                l1: &candle_core::Layout,
                s2: &candle_core::CudaStorage,
                l2: &candle_core::Layout,
            ) -> candle_core::Result<()> {
                self.fwd_inplace::<$crate::runner::Cuda>(
                    s1,
                    l1,
                    &[$crate::runner::Operand::f16(s2, l2, $b)],
                )
            }
        }
    };
    ($t:ty, $name:expr, InplaceOp3, [$b:literal, $c:literal]) => {
        impl candle_core::InplaceOp3 for $t {
            fn name(&self) -> &'static str {
                $name
            }

            fn cpu_fwd(
                &self,
                s1: &mut candle_core::CpuStorage,
                l1: &candle_core::Layout,
                s2: &candle_core::CpuStorage,
                l2: &candle_core::Layout,
                s3: &candle_core::CpuStorage,
                l3: &candle_core::Layout,
            ) -> candle_core::Result<()> {
                self.fwd_inplace::<$crate::runner::Cpu>(
                    s1,
                    l1,
                    &[
                        $crate::runner::Operand::f16(s2, l2, $b),
                        $crate::runner::Operand::f16(s3, l3, $c),
                    ],
                )
            }

            #[cfg(feature = "cuda")]
            fn cuda_fwd(
                &self,
                s1: &mut candle_core::CudaStorage,
                l1: &candle_core::Layout,
                s2: &candle_core::CudaStorage,
                l2: &candle_core::Layout,
                s3: &candle_core::CudaStorage,
                l3: &candle_core::Layout,
            ) -> candle_core::Result<()> {
                self.fwd_inplace::<$crate::runner::Cuda>(
                    s1,
                    l1,
                    &[
                        $crate::runner::Operand::f16(s2, l2, $b),
                        $crate::runner::Operand::f16(s3, l3, $c),
                    ],
                )
            }
        }
    };
}
