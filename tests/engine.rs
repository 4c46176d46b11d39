//! wavefuse as an engine uses it: on memory it did not allocate, on a
//! stream it does not own.
//!
//! On the emulator (always): host memory wrapped by `View::from_raw`, the
//! checks that answer bad spans and streams. On CUDA (when a device is
//! present; required when `WAVEFUSE_TEST_GPU_ONLY` or `WAVEFUSE_REQUIRE`
//! names it): buffers and a non-blocking stream made with cudarc, a chain
//! of kernels queued on that stream with no synchronisation between the
//! launches, guard regions around every span, the pointer and stream
//! rejections, a plan dropped while work that reads it is still queued,
//! the device itself dropped while work is queued on the engine's stream,
//! and the engine's current context left as it was.
mod common;

use common::{Rng, agrees_with_emulator};
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr};
use half::f16;
use std::sync::Arc;
use wavefuse::{
    Choice, Device, Error, GatherPlan, GeluBias, GeluMode, Stream, View, ViewMut, Wave,
    add_layer_norm, bias_gelu, gather, layer_norm, layer_norm_gather,
};
use wavefuse_shared::window::{Grid3, Shift3, Window3, WindowPlan};

const W: usize = 192;

/// A small Pangu-shaped grid (2 x 12 x 24 tokens, windows 2 x 6 x 12,
/// shifted): its partition table is the gather the chain uses.
fn plan_table() -> (Vec<i32>, usize) {
    let p = WindowPlan::new(
        Grid3 { z: 2, h: 11, w: 22 },
        Window3 { z: 2, h: 6, w: 12 },
        Shift3 { z: 1, h: 3, w: 6 },
    )
    .expect("plan");
    (p.partition_table(), p.n_tokens_in())
}

/// The inputs of one chain.
struct Inputs {
    residual: Vec<f16>,
    branch: Vec<f16>,
    bias: Vec<f16>,
    table: Vec<i32>,
    rows: usize,
}

fn inputs(seed: u64) -> Inputs {
    let (table, rows) = plan_table();
    let mut rng = Rng(seed);
    Inputs {
        residual: rng.halves(rows * W, 2.0, 0.5),
        branch: rng.halves(rows * W, 1.0, 0.0),
        bias: rng.halves(W, 0.5, 0.0),
        table,
        rows,
    }
}

/// What the chain leaves behind: the residual (updated in place), the
/// normalised rows, the gathered LayerNorm and GELU(y + bias).
#[derive(Debug)]
struct Outputs {
    residual: Vec<f16>,
    y: Vec<f16>,
    windows: Vec<f16>,
    gelu: Vec<f16>,
}

/// The chain on wavefuse's own buffers and stream (the reference, on the
/// emulator).
fn chain_owned(dev: &Device, i: &Inputs) -> Outputs {
    let plan = GatherPlan::new(dev, &i.table, i.rows).expect("plan");
    let mut residual = dev.upload(&i.residual).expect("upload");
    let branch = dev.upload(&i.branch).expect("upload");
    let bias = dev.upload(&i.bias).expect("upload");
    let mut y = dev.alloc::<f16>(i.rows * W).expect("alloc");
    let mut windows = dev.alloc::<f16>(plan.len() * W).expect("alloc");
    let mut gelu = dev.alloc::<f16>(i.rows * W).expect("alloc");
    add_layer_norm(
        dev,
        &mut residual.view_mut(),
        &branch.view(),
        &mut y.view_mut(),
        W,
        None,
        1e-5,
    )
    .expect("add_layer_norm");
    layer_norm_gather(
        dev,
        &plan,
        &residual.view(),
        &mut windows.view_mut(),
        W,
        None,
        1e-5,
    )
    .expect("layer_norm_gather");
    bias_gelu(
        dev,
        &y.view(),
        GeluBias::F16(&bias.view()),
        &mut gelu.view_mut(),
        W,
        GeluMode::Erf,
    )
    .expect("bias_gelu");
    Outputs {
        residual: residual.download().expect("download"),
        y: y.download().expect("download"),
        windows: windows.download().expect("download"),
        gelu: gelu.download().expect("download"),
    }
}

/// The emulator's result for each stage of the chain, fed with what the
/// device under test actually passed between the stages (its residual and
/// its `y`): the NVIDIA kernels may move an output by one ulp, and a
/// one-ulp difference fed into the next stage can grow there (`y + bias`
/// cancels), so each stage is judged on its own inputs.
fn reference(cpu: &Device, i: &Inputs, got: &Outputs) -> Outputs {
    let first = chain_owned(cpu, i);
    let plan = GatherPlan::new(cpu, &i.table, i.rows).expect("plan");
    let residual = cpu.upload(&got.residual).expect("upload");
    let y = cpu.upload(&got.y).expect("upload");
    let bias = cpu.upload(&i.bias).expect("upload");
    let mut windows = cpu.alloc::<f16>(plan.len() * W).expect("alloc");
    let mut gelu = cpu.alloc::<f16>(i.rows * W).expect("alloc");
    layer_norm_gather(
        cpu,
        &plan,
        &residual.view(),
        &mut windows.view_mut(),
        W,
        None,
        1e-5,
    )
    .expect("layer_norm_gather");
    bias_gelu(
        cpu,
        &y.view(),
        GeluBias::F16(&bias.view()),
        &mut gelu.view_mut(),
        W,
        GeluMode::Erf,
    )
    .expect("bias_gelu");
    Outputs {
        residual: first.residual,
        y: first.y,
        windows: windows.download().expect("download"),
        gelu: gelu.download().expect("download"),
    }
}

fn compare(backend: wavefuse::BackendKind, got: &Outputs, want: &Outputs) {
    // The residual sum is exact f16 arithmetic: bit-identical everywhere.
    assert_eq!(
        got.residual.iter().map(|h| h.to_bits()).collect::<Vec<_>>(),
        want.residual
            .iter()
            .map(|h| h.to_bits())
            .collect::<Vec<_>>(),
        "residual"
    );
    agrees_with_emulator(backend, "y", &got.y, &want.y);
    agrees_with_emulator(backend, "windows", &got.windows, &want.windows);
    agrees_with_emulator(backend, "gelu", &got.gelu, &want.gelu);
}

/// The emulator's "device memory" is host memory: views over plain
/// vectors run the same chain and give the same bits.
#[test]
fn emulator_runs_on_host_memory_it_did_not_allocate() {
    for wave in [Wave::W64, Wave::W32] {
        let dev = Device::open(Choice::Cpu(wave)).expect("emulator");
        let i = inputs(7);
        let want = chain_owned(&dev, &i);
        let plan = GatherPlan::new(&dev, &i.table, i.rows).expect("plan");
        // 16-byte aligned host memory: u128 backing.
        let mut mem = vec![0u128; (4 * i.rows * W + plan.len() * W) / 8 + 8];
        let base = mem.as_mut_ptr() as u64;
        let at = |k: usize| base + (k * i.rows * W * 2) as u64;
        let n = i.rows * W;
        // SAFETY: each span lies inside `mem`, which outlives every use;
        // the emulator runs launches synchronously.
        unsafe {
            let host = |k: usize, src: &[f16]| {
                std::ptr::copy_nonoverlapping(src.as_ptr(), at(k) as *mut f16, src.len())
            };
            host(0, &i.residual);
            host(1, &i.branch);
            let mut residual = ViewMut::<f16>::from_raw(&dev, at(0), n).expect("residual");
            let branch = View::<f16>::from_raw(&dev, at(1), n).expect("branch");
            let mut y = ViewMut::<f16>::from_raw(&dev, at(2), n).expect("y");
            let mut windows =
                ViewMut::<f16>::from_raw(&dev, at(4), plan.len() * W).expect("windows");
            let bias = dev.upload(&i.bias).expect("bias");
            let mut gelu = ViewMut::<f16>::from_raw(&dev, at(3), n).expect("gelu");
            let q = dev.wrap_stream(std::ptr::null_mut()).expect("stream 0");
            add_layer_norm(&q, &mut residual, &branch, &mut y, W, None, 1e-5).expect("aln");
            let res_in = View::<f16>::from_raw(&dev, at(0), n).expect("residual");
            layer_norm_gather(&q, &plan, &res_in, &mut windows, W, None, 1e-5).expect("lng");
            let y_in = View::<f16>::from_raw(&dev, at(2), n).expect("y");
            bias_gelu(
                &q,
                &y_in,
                GeluBias::F16(&bias.view()),
                &mut gelu,
                W,
                GeluMode::Erf,
            )
            .expect("gelu");
            let read = |k: usize, len: usize| {
                std::slice::from_raw_parts(at(k) as *const f16, len).to_vec()
            };
            let got = Outputs {
                residual: read(0, n),
                y: read(2, n),
                windows: read(4, plan.len() * W),
                gelu: read(3, n),
            };
            compare(wavefuse::BackendKind::Cpu, &got, &want);
        }
    }
}

#[test]
fn emulator_rejects_bad_spans_and_streams() {
    let dev = Device::open(Choice::Cpu(Wave::W64)).expect("emulator");
    let owned = dev.alloc::<f16>(64 + 2 * W).expect("alloc");
    let p = owned.device_ptr();
    // SAFETY: every call is expected to fail its checks before any use.
    unsafe {
        let null = View::<f16>::from_raw(&dev, 0, 8).map(|_| ()).unwrap_err();
        assert!(
            matches!(&null, Error::ForeignSpan { why, .. } if why.contains("null")),
            "{null}"
        );
        let wrap = View::<f16>::from_raw(&dev, u64::MAX - 7, 8)
            .map(|_| ())
            .unwrap_err();
        assert!(
            matches!(&wrap, Error::ForeignSpan { why, .. } if why.contains("overflows")),
            "{wrap}"
        );
        let huge = View::<f16>::from_raw(&dev, 0x1000, usize::MAX / 2 + 1)
            .map(|_| ())
            .unwrap_err();
        assert!(
            matches!(huge, Error::BadParameter { what: "len", .. }),
            "{huge}"
        );
        // A span that starts in a wavefuse allocation and runs past its end.
        let n = 64 + 2 * W;
        let past = ViewMut::<f16>::from_raw(&dev, p + 64, n - 31)
            .map(|_| ())
            .unwrap_err();
        assert!(
            matches!(&past, Error::ForeignSpan { why, .. } if why.contains("runs past")),
            "{past}"
        );
        assert!(View::<f16>::from_raw(&dev, p + 64, n - 32).is_ok());
        // An address that is no f16 (or f32) address.
        let odd = View::<f16>::from_raw(&dev, p + 1, 8)
            .map(|_| ())
            .unwrap_err();
        assert!(
            matches!(&odd, Error::ForeignSpan { why, .. } if why.contains("aligned to 2 bytes")),
            "{odd}"
        );
        let odd = ViewMut::<f32>::from_raw(&dev, p + 2, 8)
            .map(|_| ())
            .unwrap_err();
        assert!(
            matches!(&odd, Error::ForeignSpan { why, .. } if why.contains("aligned to 4 bytes")),
            "{odd}"
        );
        let s = dev.wrap_stream(0x1234 as *mut _).map(|_| ()).unwrap_err();
        assert!(matches!(s, Error::ForeignStream { .. }), "{s}");
        // A misaligned foreign span is accepted as a view; the op that needs
        // 16-byte vectors rejects it before launching.
        let x = View::<f16>::from_raw(&dev, p + 2, W).expect("view");
        let mut out = dev.alloc::<f16>(W).expect("alloc");
        let e = layer_norm(&dev, &x, &mut out.view_mut(), W, None, 1e-5).unwrap_err();
        assert!(matches!(e, Error::Misaligned { what: "x", .. }), "{e}");
    }
}

/// Whether a CUDA device must be present for this run.
fn cuda_required() -> bool {
    common::gpu_only() || common::required().iter().any(|b| b == "cuda")
}

/// The CUDA device and cudarc's view of it (the engine's), or `None` when
/// there is none and none is required.
fn cuda() -> Option<(Device, Arc<CudaContext>)> {
    // Reports this binary's backends (and enforces WAVEFUSE_REQUIRE).
    drop(common::devices());
    match Device::open(Choice::Cuda(0)) {
        Ok(d) => Some((d, CudaContext::new(0).expect("cudarc context"))),
        Err(e) => {
            assert!(!cuda_required(), "CUDA required but did not open: {e}");
            eprintln!("engine tests: no CUDA device ({e}); CUDA cases not run");
            None
        }
    }
}

/// `n` launches of queued work, or a hundredth of them (at least two)
/// under a sanitizer (`WAVEFUSE_SANITIZING`, set by the GPU bundle's
/// sanitize phase): there each kernel runs about two orders of magnitude
/// slower, so the fewer launches keep the stream busy for a similar time,
/// and the sanitizer checks each kernel the same way at any count.
fn queued(n: usize) -> usize {
    if std::env::var_os("WAVEFUSE_SANITIZING").is_some_and(|v| v == "1") {
        (n / 100).max(2)
    } else {
        n
    }
}

/// An engine allocation with `guard` poison elements on each side.
struct Guarded {
    buf: CudaSlice<u16>,
    guard: usize,
    len: usize,
}

const GUARD_BITS: u16 = 0x7e5a;

impl Guarded {
    fn new(s: &Arc<CudaStream>, data: &[f16], guard: usize) -> Guarded {
        let mut host = vec![GUARD_BITS; data.len() + 2 * guard];
        for (h, d) in host[guard..].iter_mut().zip(data) {
            *h = d.to_bits();
        }
        Guarded {
            buf: s.clone_htod(&host).expect("clone_htod"),
            guard,
            len: data.len(),
        }
    }

    fn ptr(&self, s: &Arc<CudaStream>) -> u64 {
        let (p, _sync) = self.buf.device_ptr(s);
        p + (self.guard * 2) as u64
    }

    /// # Safety
    /// As `View::from_raw`.
    unsafe fn view<'a>(&self, dev: &Device, s: &Arc<CudaStream>) -> View<'a, f16> {
        // SAFETY: caller contract.
        unsafe { View::from_raw(dev, self.ptr(s), self.len) }.expect("view")
    }

    /// # Safety
    /// As `ViewMut::from_raw`.
    unsafe fn view_mut<'a>(&self, dev: &Device, s: &Arc<CudaStream>) -> ViewMut<'a, f16> {
        // SAFETY: caller contract.
        unsafe { ViewMut::from_raw(dev, self.ptr(s), self.len) }.expect("view")
    }

    /// The span's contents, after checking that both guards are untouched.
    fn read(&self, s: &Arc<CudaStream>, name: &str) -> Vec<f16> {
        let all = s.clone_dtoh(&self.buf).expect("clone_dtoh");
        let (front, rest) = all.split_at(self.guard);
        let (body, back) = rest.split_at(self.len);
        assert!(
            front.iter().chain(back).all(|&b| b == GUARD_BITS),
            "{name}: a guard element was written"
        );
        body.iter().map(|&b| f16::from_bits(b)).collect()
    }
}

/// The chain on engine memory and an engine stream, queued with no
/// synchronisation between the uploads, the launches and the downloads
/// (cudarc's copies are on the same stream): right only if every launch
/// went onto that stream in order.
#[test]
fn cuda_chain_on_engine_memory_and_stream() {
    let Some((dev, ctx)) = cuda() else { return };
    let cpu = Device::open(Choice::Cpu(Wave::W64)).expect("emulator");
    for seed in [1, 2, 3] {
        let i = inputs(seed);
        let s = ctx.new_stream().expect("engine stream");
        // SAFETY: `s` outlives `q`.
        let q = unsafe { dev.wrap_stream(s.cu_stream().cast()) }.expect("wrap");
        assert!(q.is_foreign());
        let plan = GatherPlan::new(&dev, &i.table, i.rows).expect("plan");
        let guard = 40 + seed as usize; // odd guards: spans not 256-aligned
        let residual = Guarded::new(&s, &i.residual, guard * 8);
        let branch = Guarded::new(&s, &i.branch, guard * 8);
        let bias = Guarded::new(&s, &i.bias, guard * 8);
        let y = Guarded::new(&s, &vec![f16::from_bits(GUARD_BITS); i.rows * W], guard * 8);
        let windows = Guarded::new(
            &s,
            &vec![f16::from_bits(GUARD_BITS); plan.len() * W],
            guard * 8,
        );
        let gelu = Guarded::new(&s, &vec![f16::from_bits(GUARD_BITS); i.rows * W], guard * 8);
        // SAFETY: the cudarc buffers outlive the work (read back below on
        // the same stream), and no other stream touches them.
        unsafe {
            add_layer_norm(
                &q,
                &mut residual.view_mut(&dev, &s),
                &branch.view(&dev, &s),
                &mut y.view_mut(&dev, &s),
                W,
                None,
                1e-5,
            )
            .expect("add_layer_norm");
            layer_norm_gather(
                &q,
                &plan,
                &residual.view(&dev, &s),
                &mut windows.view_mut(&dev, &s),
                W,
                None,
                1e-5,
            )
            .expect("layer_norm_gather");
            bias_gelu(
                &q,
                &y.view(&dev, &s),
                GeluBias::F16(&bias.view(&dev, &s)),
                &mut gelu.view_mut(&dev, &s),
                W,
                GeluMode::Erf,
            )
            .expect("bias_gelu");
        }
        let got = Outputs {
            residual: residual.read(&s, "residual"),
            y: y.read(&s, "y"),
            windows: windows.read(&s, "windows"),
            gelu: gelu.read(&s, "gelu"),
        };
        bias.read(&s, "bias");
        branch.read(&s, "branch");
        compare(dev.info().backend, &got, &reference(&cpu, &i, &got));
    }
}

/// wavefuse's own stream is exposed for ordering: an engine waits for
/// wavefuse's work with an event, and wavefuse waits for the engine's.
#[test]
fn cuda_orders_against_wavefuse_stream_with_events() {
    let Some((dev, ctx)) = cuda() else { return };
    let s = ctx.new_stream().expect("engine stream");
    // SAFETY: `s` outlives `q`.
    let q = unsafe { dev.wrap_stream(s.cu_stream().cast()) }.expect("wrap");
    let mut rng = Rng(11);
    let x = rng.halves(4096 * W, 3.0, 1.0);
    // The engine writes x on its stream; wavefuse's own stream waits for it.
    let xe = Guarded::new(&s, &x, 64);
    let ready = q.record().expect("record");
    dev.stream().wait(&ready).expect("wait");
    let mut y = dev.alloc::<f16>(x.len()).expect("alloc");
    // SAFETY: xe outlives the work (read back after the synchronize below).
    unsafe {
        layer_norm(&dev, &xe.view(&dev, &s), &mut y.view_mut(), W, None, 1e-5).expect("ln");
    }
    // The engine stream waits for wavefuse's work before reading y.
    let done = dev.record().expect("record");
    q.wait(&done).expect("wait");
    let cpu = Device::open(Choice::Cpu(Wave::W64)).expect("emulator");
    let xc = cpu.upload(&x).expect("upload");
    let mut yc = cpu.alloc::<f16>(x.len()).expect("alloc");
    layer_norm(&cpu, &xc.view(), &mut yc.view_mut(), W, None, 1e-5).expect("ln");
    agrees_with_emulator(
        dev.info().backend,
        "ln",
        &y.download().expect("download"),
        &yc.download().expect("download"),
    );
    xe.read(&s, "x");
}

/// A plan dropped while a launch that reads its table is still queued
/// behind other work on the engine's stream: the drop waits for that
/// launch, so memory allocated afterwards (which may reuse the table's
/// address) cannot change what the gather reads.
#[test]
fn cuda_plan_outlives_queued_work_on_engine_stream() {
    let Some((dev, ctx)) = cuda() else { return };
    let s = ctx.new_stream().expect("engine stream");
    // SAFETY: `s` outlives `q`.
    let q = unsafe { dev.wrap_stream(s.cu_stream().cast()) }.expect("wrap");
    let (table, rows) = plan_table();
    let mut rng = Rng(5);
    let src = rng.halves(rows * W, 1.0, 0.0);
    let big = rng.halves(8192 * 768, 1.0, 0.0);
    let se = Guarded::new(&s, &src, 8);
    let out = Guarded::new(&s, &vec![f16::ZERO; table.len() * W], 8);
    let be = Guarded::new(&s, &big, 8);
    let bo = Guarded::new(&s, &big, 8);
    // SAFETY: the cudarc buffers outlive the work (read back below).
    unsafe {
        // Milliseconds of work ahead of the gather on the engine stream.
        for _ in 0..queued(200) {
            layer_norm(
                &q,
                &be.view(&dev, &s),
                &mut bo.view_mut(&dev, &s),
                768,
                None,
                1e-5,
            )
            .expect("ln");
        }
        let plan = GatherPlan::new(&dev, &table, rows).expect("plan");
        gather(
            &q,
            &plan,
            &se.view(&dev, &s),
            &mut out.view_mut(&dev, &s),
            W,
        )
        .expect("gather");
        drop(plan);
    }
    // Fresh wavefuse allocations of the table's size, full of an index
    // that would gather the wrong token.
    let junk: Vec<_> = (0..8)
        .map(|_| dev.upload(&vec![0i32; table.len()]).expect("upload"))
        .collect();
    let got = out.read(&s, "out");
    drop(junk);
    for (t, &ix) in table.iter().enumerate() {
        for c in 0..W {
            let want = if ix < 0 {
                0
            } else {
                src[ix as usize * W + c].to_bits()
            };
            assert_eq!(got[t * W + c].to_bits(), want, "token {t} col {c}");
        }
    }
}

#[test]
fn cuda_rejects_foreign_pointers_and_streams() {
    let Some((dev, ctx)) = cuda() else { return };
    let s = ctx.new_stream().expect("engine stream");
    let buf = Guarded::new(&s, &vec![f16::ONE; 1000], 0);
    let p = buf.ptr(&s);
    let why = |e: Error| match e {
        Error::ForeignSpan { why, .. } => why,
        other => panic!("expected ForeignSpan, got {other}"),
    };
    let host = vec![0u128; 64];
    // SAFETY: every call is expected to fail its checks before any use,
    // except the in-bounds ones, which are not used.
    unsafe {
        let h = why(View::<f16>::from_raw(&dev, host.as_ptr() as u64, 64)
            .map(|_| ())
            .unwrap_err());
        assert!(h.contains("host memory"), "{h}");
        let past = why(View::<f16>::from_raw(&dev, p, 1001)
            .map(|_| ())
            .unwrap_err());
        assert!(past.contains("runs past"), "{past}");
        let past = why(ViewMut::<f16>::from_raw(&dev, p + 1998, 2)
            .map(|_| ())
            .unwrap_err());
        assert!(past.contains("runs past"), "{past}");
        let null = why(View::<f16>::from_raw(&dev, 0, 1).map(|_| ()).unwrap_err());
        assert!(null.contains("null"), "{null}");
        assert!(View::<f16>::from_raw(&dev, p, 1000).is_ok());
        assert!(View::<f16>::from_raw(&dev, p + 1000, 500).is_ok());
        // A stream of another context of the same device.
        let other = CudaContext::new_non_primary(0, 0).expect("non-primary context");
        let os = other.new_stream().expect("stream");
        let e = dev
            .wrap_stream(os.cu_stream().cast())
            .map(|_| ())
            .unwrap_err();
        assert!(
            matches!(&e, Error::ForeignStream { why } if why.contains("primary context")),
            "{e}"
        );
        // A stream-ordered allocation made on that stream (cudarc's
        // alloc_zeros uses cuMemAllocAsync where the device has memory
        // pools) comes from the device's memory pool, not from that
        // context: accepted.
        let pooled = os.alloc_zeros::<u16>(1000).expect("pool allocation");
        let (pp, sync) = pooled.device_ptr(&os);
        assert!(View::<f16>::from_raw(&dev, pp, 1000).is_ok());
        drop(sync);
        drop(pooled);
        // cuMemAlloc in that context: memory of that context, which the
        // primary context wavefuse launches in need not map.
        other.bind_to_thread().expect("bind the other context");
        let theirs = cudarc::driver::result::malloc_sync(2000).expect("cuMemAlloc there");
        let refused = View::<f16>::from_raw(&dev, theirs, 1000).map(|_| ());
        other.bind_to_thread().expect("bind the other context");
        cudarc::driver::result::free_sync(theirs).expect("cuMemFree");
        let ctx_why = why(refused.unwrap_err());
        assert!(
            ctx_why.contains("primary context") && ctx_why.contains("memory of context"),
            "{ctx_why}"
        );
        drop(os);
        drop(other);
        // The legacy default stream of the primary context is accepted.
        let d: Stream = dev.wrap_stream(std::ptr::null_mut()).expect("null stream");
        assert!(d.is_foreign());
    }
    buf.read(&s, "buf");
}

/// The engine example's pattern: open, queue work on the engine's stream
/// (engine memory only), drop every wavefuse handle at once. The work must
/// still run to the end and give the right result: the last handle waits
/// for it before unloading the module.
#[test]
fn cuda_device_dropped_with_work_queued_on_engine_stream() {
    let Some((dev, ctx)) = cuda() else { return };
    let s = ctx.new_stream().expect("engine stream");
    let mut rng = Rng(9);
    let big = rng.halves(8192 * 768, 1.0, 0.0);
    let small = rng.halves(64 * W, 1.0, 0.0);
    let be = Guarded::new(&s, &big, 8);
    let bo = Guarded::new(&s, &big, 8);
    let x = Guarded::new(&s, &small, 8);
    let y = Guarded::new(&s, &vec![f16::ZERO; small.len()], 8);
    {
        // SAFETY: `s` outlives `q`.
        let q = unsafe { dev.wrap_stream(s.cu_stream().cast()) }.expect("wrap");
        // SAFETY: the cudarc buffers outlive the work (read back below, on
        // the same stream).
        unsafe {
            for _ in 0..queued(200) {
                layer_norm(
                    &q,
                    &be.view(&dev, &s),
                    &mut bo.view_mut(&dev, &s),
                    768,
                    None,
                    1e-5,
                )
                .expect("ln");
            }
            layer_norm(
                &q,
                &x.view(&dev, &s),
                &mut y.view_mut(&dev, &s),
                W,
                None,
                1e-5,
            )
            .expect("ln");
        }
        drop(q);
        drop(dev);
    }
    let got = y.read(&s, "y");
    let cpu = Device::open(Choice::Cpu(Wave::W64)).expect("emulator");
    let xc = cpu.upload(&small).expect("upload");
    let mut yc = cpu.alloc::<f16>(small.len()).expect("alloc");
    layer_norm(&cpu, &xc.view(), &mut yc.view_mut(), W, None, 1e-5).expect("ln");
    let want = yc.download().expect("download");
    agrees_with_emulator(wavefuse::BackendKind::Cuda, "y", &got, &want);
}

/// Every call binds wavefuse's context for its duration only: a thread
/// with no current context still has none afterwards.
#[test]
fn cuda_leaves_the_current_context_as_it_was() {
    use cudarc::driver::result::ctx;
    let Some((dev, _ctx)) = cuda() else { return };
    std::thread::spawn(move || {
        // SAFETY: null unbinds the thread's context.
        unsafe { ctx::set_current(std::ptr::null_mut()) }.expect("unbind");
        let b = dev.upload(&[f16::ONE; 256]).expect("upload");
        assert_eq!(b.download().expect("download")[0], f16::ONE);
        assert_eq!(
            ctx::get_current().expect("get"),
            None,
            "wavefuse left its context current"
        );
        drop(b);
        drop(dev);
        assert_eq!(
            ctx::get_current().expect("get"),
            None,
            "dropping left a context current"
        );
    })
    .join()
    .expect("thread");
}

/// Two threads on the per-thread default stream (`CU_STREAM_PER_THREAD`:
/// one handle, a different stream in each thread) read one wavefuse
/// buffer: the first queues a long run of kernels, the second, after it,
/// one kernel. The buffer is dropped while the first thread's work is
/// still queued. Its drop must wait for both: the second thread's event
/// (the newest of the handle, soon complete) must not replace the first's.
#[test]
fn cuda_per_thread_stream_readers_keep_a_buffer_alive() {
    const ROWS: usize = 4096;
    const C: usize = 768;
    let Some((dev, _ctx)) = cuda() else { return };
    let mut rng = Rng(11);
    let src_h = rng.halves(ROWS * C, 1.0, 0.0);
    let src = dev.upload(&src_h).expect("upload");
    let mut outs: Vec<_> = (0..2)
        .map(|_| dev.alloc::<f16>(ROWS * C).expect("alloc"))
        .collect();
    for (o, launches) in outs.iter_mut().zip([queued(4000), 1]) {
        let (dev, src) = (&dev, &src);
        std::thread::scope(|sc| {
            sc.spawn(move || {
                // SAFETY: CU_STREAM_PER_THREAD (2) is live for the whole
                // process.
                let q = unsafe { dev.wrap_stream(2 as *mut std::ffi::c_void) }
                    .expect("wrap the per-thread stream");
                for _ in 0..launches {
                    layer_norm(&q, &src.view(), &mut o.view_mut(), C, None, 1e-5).expect("ln");
                }
            });
        });
    }
    drop(src);
    // Fresh allocations of the same size, full of values far from any
    // LayerNorm output, are likely to land where `src` was.
    let junk: Vec<_> = (0..8)
        .map(|_| {
            dev.upload(&vec![f16::from_f32(1e4); ROWS * C])
                .expect("upload")
        })
        .collect();
    let cpu = Device::open(Choice::Cpu(Wave::W64)).expect("emulator");
    let xc = cpu.upload(&src_h).expect("upload");
    let mut yc = cpu.alloc::<f16>(ROWS * C).expect("alloc");
    layer_norm(&cpu, &xc.view(), &mut yc.view_mut(), C, None, 1e-5).expect("ln");
    let want = yc.download().expect("download");
    for (k, o) in outs.iter().enumerate() {
        let got = o.download().expect("download");
        agrees_with_emulator(
            wavefuse::BackendKind::Cuda,
            &format!("thread {k}"),
            &got,
            &want,
        );
    }
    drop(junk);
}
