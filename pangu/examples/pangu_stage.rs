//! Runs the Pangu-Weather stage on candle: loads weights and input (the
//! PyTorch reference's `pangu_<scale>.safetensors`, or seeded random ones),
//! runs the chosen builds, checks the f16 stage against the same source in
//! f32, writes the outputs for the reference script, and on CUDA times the
//! stage and each block (CUDA-event medians on candle's stream) with the
//! stream-ordered pool's high-water mark.
//!
//! ```text
//! pangu_stage [--scale s1|s2|tiny|tiny192] [--order post|pre]
//!             [--weights FILE | --random SEED]
//!             [--build candle,wavefuse,wavefuse-unfused] [--device cpu|cuda]
//!             [--out DIR [--dump]] [--reps N] [--breakdown N]
//! ```
//! `--order post` (default): the released weights' blocks (post-norm, mask
//! along level and latitude, longitude wrapping); `--order pre`: the
//! profiled student model's (pre-norm, Swin's three-axis mask).
//! `--dump`: one more stage forward per build that keeps every step's
//! operands and results, written to `DIR/steps_<build>_<scale>.safetensors`
//! (`benches/pangu_rounding.py` compares them with PyTorch step by step).
//! `--breakdown N`: N more stage forwards per build with a timestamp at
//! every step boundary (CUDA events on candle's stream), printed as each
//! step's median and the medians summed by step name.
//! On the CPU (CI): `pangu_stage --scale tiny --random 1 --device cpu`.
use candle_core::{DType, Device, Tensor};
use pangu::stage::{self, BlockOrder, CandleOps, Probe, Stage, StageConfig, StageOps, WavefuseOps};
use std::collections::HashMap;
use std::time::Instant;

/// One build: its ops and their step timer.
enum Build {
    Candle(CandleOps),
    Wavefuse(WavefuseOps),
}

impl Build {
    fn ops(&self) -> &dyn StageOps {
        match self {
            Build::Candle(o) => o,
            Build::Wavefuse(o) => o,
        }
    }

    fn probe(&self) -> &Probe {
        match self {
            Build::Candle(o) => o.probe(),
            Build::Wavefuse(o) => o.probe(),
        }
    }
}

/// A build's ops that also keep every step's operands and results
/// (`--dump`): tensors named `b{block}.{step}.{operand}`, for
/// `benches/pangu_rounding.py`'s step-by-step comparison with PyTorch.
struct Dump<'a> {
    inner: &'a dyn StageOps,
    block: std::cell::Cell<usize>,
    kept: std::cell::RefCell<HashMap<String, Tensor>>,
}

impl<'a> Dump<'a> {
    fn new(inner: &'a dyn StageOps) -> Dump<'a> {
        Dump {
            inner,
            block: std::cell::Cell::new(0),
            kept: std::cell::RefCell::new(HashMap::new()),
        }
    }

    fn keep(&self, step: &str, ts: &[(&str, &Tensor)]) -> candle_core::Result<()> {
        let b = self.block.get();
        for (name, t) in ts {
            // A copy: the in-place steps update some operands later.
            let c = t.copy()?;
            self.kept
                .borrow_mut()
                .insert(format!("b{b}.{step}.{name}"), c);
        }
        Ok(())
    }
}

impl StageOps for Dump<'_> {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn norm_partition(
        &self,
        x: &Tensor,
        norm: &stage::Affine,
        win: &stage::Windowing,
    ) -> candle_core::Result<Tensor> {
        self.keep("norm_partition", &[("x", x)])?;
        let h = self.inner.norm_partition(x, norm, win)?;
        self.keep("norm_partition", &[("h", &h)])?;
        Ok(h)
    }

    fn add_norm_partition(
        &self,
        x: &Tensor,
        d: &Tensor,
        norm: &stage::Affine,
        win: &stage::Windowing,
    ) -> candle_core::Result<(Tensor, Tensor)> {
        self.block.set(self.block.get() + 1);
        self.keep("add_norm_partition", &[("x", x), ("d", d)])?;
        let (x, h) = self.inner.add_norm_partition(x, d, norm, win)?;
        self.keep("add_norm_partition", &[("sum", &x), ("h", &h)])?;
        Ok((x, h))
    }

    fn qkv<'w>(
        &self,
        h: &Tensor,
        w: &'w stage::weights::BlockWeights,
    ) -> candle_core::Result<(Tensor, Option<&'w Tensor>)> {
        self.inner.qkv(h, w)
    }

    fn attention(
        &self,
        qkv: &Tensor,
        qkv_bias: Option<&Tensor>,
        earth_bias: &Tensor,
        heads: usize,
        win: &stage::Windowing,
    ) -> candle_core::Result<Tensor> {
        self.keep("attention", &[("qkv", qkv)])?;
        let o = self
            .inner
            .attention(qkv, qkv_bias, earth_bias, heads, win)?;
        self.keep("attention", &[("o", &o)])?;
        Ok(o)
    }

    fn proj(
        &self,
        o: &Tensor,
        w: &stage::weights::BlockWeights,
        win: &stage::Windowing,
    ) -> candle_core::Result<Tensor> {
        let a = self.inner.proj(o, w, win)?;
        self.keep("proj", &[("a", &a)])?;
        Ok(a)
    }

    fn mlp(&self, h: &Tensor, w: &stage::weights::BlockWeights) -> candle_core::Result<Tensor> {
        let m = self.inner.mlp(h, w)?;
        self.keep("mlp", &[("m", &m)])?;
        if self.inner.name() == "wavefuse" {
            // The wavefuse MLP's first half again, its steps kept.
            let a = wavefuse_candle::linear(h, &w.fc1.w, &w.fc1.b)?;
            let g = wavefuse_candle::bias_gelu(&a, &w.fc1.zero, wavefuse_candle::GeluMode::Erf)?;
            self.keep("mlp", &[("fc1", &a), ("gelu", &g)])?;
        }
        Ok(m)
    }

    fn unpartition_add_norm(
        &self,
        x: &Tensor,
        branch: &Tensor,
        norm2: &stage::Affine,
        win: &stage::Windowing,
    ) -> candle_core::Result<(Tensor, Tensor)> {
        self.keep("unpartition_add_norm", &[("x", x)])?;
        let (x, h) = self.inner.unpartition_add_norm(x, branch, norm2, win)?;
        self.keep("unpartition_add_norm", &[("sum", &x), ("h", &h)])?;
        Ok((x, h))
    }

    fn add(&self, x: &Tensor, d: &Tensor) -> candle_core::Result<Tensor> {
        self.keep("add", &[("x", x), ("d", d)])?;
        let y = self.inner.add(x, d)?;
        self.keep("add", &[("y", &y)])?;
        Ok(y)
    }

    fn partition(&self, x: &Tensor, win: &stage::Windowing) -> candle_core::Result<Tensor> {
        self.keep("partition", &[("x", x)])?;
        let h = self.inner.partition(x, win)?;
        self.keep("partition", &[("h", &h)])?;
        Ok(h)
    }

    fn unpartition_norm_add(
        &self,
        x: &Tensor,
        branch: &Tensor,
        norm1: &stage::Affine,
        win: &stage::Windowing,
    ) -> candle_core::Result<Tensor> {
        self.keep("unpartition_norm_add", &[("x", x), ("branch", branch)])?;
        let y = self.inner.unpartition_norm_add(x, branch, norm1, win)?;
        self.keep("unpartition_norm_add", &[("sum", &y)])?;
        Ok(y)
    }

    fn mlp_norm_add(
        &self,
        x: &Tensor,
        w: &stage::weights::BlockWeights,
    ) -> candle_core::Result<Tensor> {
        self.keep("mlp_norm_add", &[("x", x)])?;
        let y = self.inner.mlp_norm_add(x, w)?;
        self.keep("mlp_norm_add", &[("sum", &y)])?;
        Ok(y)
    }
}

/// `n` stage forwards with the step timer on: each step's median (steps
/// in order, both blocks), then the medians summed by step name.
fn breakdown(stage: &Stage, b: &Build, x: &Tensor, dev: &Device, n: usize, tag: &str) -> Res<()> {
    let mut runs: Vec<Vec<(&'static str, f64)>> = Vec::with_capacity(n);
    for _ in 0..n {
        b.probe().start(dev)?;
        drop(stage.forward(b.ops(), x)?);
        runs.push(b.probe().finish()?);
    }
    let Some(first) = runs.first() else {
        return Ok(());
    };
    let mut total = 0.0;
    let mut by_name: Vec<(&str, f64)> = Vec::new();
    println!("{tag} breakdown ({n} forwards, median per step; blocks in order):");
    for (i, (name, _)) in first.iter().enumerate() {
        let m = median(runs.iter().map(|r| r[i].1).collect());
        total += m;
        match by_name.iter_mut().find(|(k, _)| k == name) {
            Some(e) => e.1 += m,
            None => by_name.push((name, m)),
        }
        println!("{tag}   {i:2} {name:22} {m:9.1} us");
    }
    println!("{tag}   sum of medians {total:.1} us; by step:");
    for (name, m) in by_name {
        println!("{tag}   {name:22} {m:9.1} us  {:5.1} %", 100.0 * m / total);
    }
    Ok(())
}

type Res<T> = std::result::Result<T, Box<dyn std::error::Error>>;

struct Args {
    scale: String,
    order: BlockOrder,
    weights: Option<String>,
    random: Option<u64>,
    builds: Vec<String>,
    device: String,
    out: Option<String>,
    reps: usize,
    breakdown: usize,
    dump: bool,
}

fn parse() -> Res<Args> {
    let mut a = Args {
        scale: "tiny".into(),
        order: BlockOrder::Post,
        weights: None,
        random: None,
        builds: vec!["candle".into()],
        device: "cpu".into(),
        out: None,
        reps: 20,
        breakdown: 0,
        dump: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let mut v = || it.next().ok_or_else(|| format!("{k} needs a value"));
        match k.as_str() {
            "--scale" => a.scale = v()?,
            "--order" => a.order = BlockOrder::parse(&v()?)?,
            "--weights" => a.weights = Some(v()?),
            "--random" => a.random = Some(v()?.parse()?),
            "--build" => a.builds = v()?.split(',').map(String::from).collect(),
            "--device" => a.device = v()?,
            "--out" => a.out = Some(v()?),
            "--reps" => a.reps = v()?.parse()?,
            "--breakdown" => a.breakdown = v()?.parse()?,
            "--dump" => a.dump = true,
            _ => {
                return Err(format!("unknown argument {k} (see the example's doc comment)").into());
            }
        }
    }
    if a.weights.is_none() && a.random.is_none() {
        a.random = Some(1);
    }
    Ok(a)
}

/// Wall time per call: CUDA events around the call on candle's stream, or
/// the host clock on the CPU.
enum Clock {
    Cpu,
    #[cfg(feature = "cuda")]
    Cuda(std::sync::Arc<candle_core::cuda_backend::cudarc::driver::CudaStream>),
}

impl Clock {
    fn new(dev: &Device) -> Res<Clock> {
        #[cfg(feature = "cuda")]
        if let Device::Cuda(c) = dev {
            return Ok(Clock::Cuda(c.cuda_stream()));
        }
        let _ = dev;
        Ok(Clock::Cpu)
    }

    /// Microseconds of one call of `f`: on the device, and on the host
    /// to queue it (the same on the CPU; on CUDA, the device time exceeds
    /// it unless the host is the bottleneck).
    fn time(&self, f: &mut dyn FnMut() -> candle_core::Result<Tensor>) -> Res<(f64, f64)> {
        match self {
            Clock::Cpu => {
                let t = Instant::now();
                drop(f()?);
                let us = t.elapsed().as_secs_f64() * 1e6;
                Ok((us, us))
            }
            #[cfg(feature = "cuda")]
            Clock::Cuda(s) => {
                use candle_core::cuda_backend::cudarc::driver::sys::CUevent_flags;
                let a = s.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
                let t = Instant::now();
                drop(f()?);
                let host = t.elapsed().as_secs_f64() * 1e6;
                let b = s.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
                b.synchronize()?;
                Ok((f64::from(a.elapsed_ms(&b)?) * 1e3, host))
            }
        }
    }
}

/// The stream-ordered pool's high-water mark (candle allocates with
/// cuMemAllocAsync from the device's default pool): reset, then read.
#[cfg(feature = "cuda")]
mod pool {
    use candle_core::cuda_backend::cudarc::driver::sys;

    fn default_pool() -> Option<sys::CUmemoryPool> {
        let mut dev: sys::CUdevice = 0;
        let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
        // SAFETY: candle's device made its context current on this thread;
        // both out-pointers are valid locals.
        let ok = unsafe {
            sys::cuCtxGetDevice(&mut dev) == sys::CUresult::CUDA_SUCCESS
                && sys::cuDeviceGetDefaultMemPool(&mut pool, dev) == sys::CUresult::CUDA_SUCCESS
        };
        ok.then_some(pool)
    }

    /// The pool keeps freed memory across synchronisations (its default
    /// release threshold, 0, hands it back to the driver at every
    /// synchronisation, and every forward then maps it again), as
    /// PyTorch's caching allocator does.
    pub fn keep_memory() {
        if let Some(p) = default_pool() {
            let mut max: u64 = u64::MAX;
            // SAFETY: RELEASE_THRESHOLD takes a u64.
            unsafe {
                sys::cuMemPoolSetAttribute(
                    p,
                    sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                    (&mut max as *mut u64).cast(),
                )
            };
        }
    }

    pub fn reset_high() {
        if let Some(p) = default_pool() {
            let mut zero: u64 = 0;
            // SAFETY: USED_MEM_HIGH takes a u64, and 0 resets it to the
            // current use.
            unsafe {
                sys::cuMemPoolSetAttribute(
                    p,
                    sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH,
                    (&mut zero as *mut u64).cast(),
                )
            };
        }
    }

    pub fn used(attr: sys::CUmemPool_attribute) -> Option<u64> {
        let p = default_pool()?;
        let mut v: u64 = 0;
        // SAFETY: the USED_MEM_* attributes are u64.
        let r = unsafe { sys::cuMemPoolGetAttribute(p, attr, (&mut v as *mut u64).cast()) };
        (r == sys::CUresult::CUDA_SUCCESS).then_some(v)
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn max_rms(a: &Tensor, b: &Tensor) -> Res<(f64, f64)> {
    let d = (a.to_dtype(DType::F64)? - b.to_dtype(DType::F64)?)?;
    let max = d.abs()?.max_all()?.to_scalar::<f64>()?;
    let rms = d.sqr()?.mean_all()?.sqrt()?.to_scalar::<f64>()?;
    Ok((max, rms))
}

fn main() -> Res<()> {
    let a = parse()?;
    let cfg = StageConfig::by_name(&a.scale)
        .ok_or_else(|| format!("unknown scale {}", a.scale))?
        .with_order(a.order);
    let dev = match a.device.as_str() {
        "cpu" => Device::Cpu,
        "cuda" => Device::new_cuda(0)?,
        d => return Err(format!("unknown device {d}").into()),
    };
    let t: HashMap<String, Tensor> = match (&a.weights, a.random) {
        (Some(path), _) => candle_core::safetensors::load(path, &Device::Cpu)?,
        (None, Some(seed)) => stage::weights::random_weights(&cfg, seed, 1.0)?,
        (None, None) => unreachable!("parse() sets a seed"),
    };
    let g = cfg.grid;
    println!(
        "stage {}: grid {}x{}x{} dim {} heads {} window (2,6,12) shift (1,3,6), {}-norm, mask {}, device {}",
        a.scale,
        g.z,
        g.h,
        g.w,
        cfg.dim,
        cfg.heads,
        cfg.order.name(),
        cfg.mask.name(),
        a.device
    );
    let t0 = Instant::now();
    let stage = Stage::load(cfg, &t, &dev, DType::F16)?;
    let x = stage.input(&t, &dev)?;
    dev.synchronize()?;
    println!("loaded in {:.2} s", t0.elapsed().as_secs_f64());

    // The same source in f32 (candle's ops): what the f16 build should be
    // close to. The PyTorch script's check is the real gate.
    let ref32 = {
        let s32 = Stage::load(cfg, &t, &dev, DType::F32)?;
        let ops = CandleOps::new(cfg.dim, DType::F32, &dev)?;
        s32.forward(&ops, &s32.input(&t, &dev)?)?
    };
    let clock = Clock::new(&dev)?;
    #[cfg(feature = "cuda")]
    if a.device == "cuda" {
        pool::keep_memory();
        println!(
            "stream-ordered pool: release threshold max (freed memory kept, as PyTorch's allocator)"
        );
    }
    let mut failed = false;
    for build in &a.builds {
        let b = match build.as_str() {
            "candle" => Build::Candle(CandleOps::new(cfg.dim, DType::F16, &dev)?),
            "wavefuse" => Build::Wavefuse(WavefuseOps::new()),
            "wavefuse-unfused" => Build::Wavefuse(WavefuseOps::unfused()),
            b => return Err(format!("unknown build {b}").into()),
        };
        let ops = b.ops();
        let y = match stage.forward(ops, &x) {
            Ok(y) => y,
            Err(e) => {
                println!("{build}: {e}");
                failed = true;
                continue;
            }
        };
        let y0 = stage.forward_block(ops, 0, &x)?;
        let (max, rms) = max_rms(&y, &ref32)?;
        let finite = y
            .to_dtype(DType::F32)?
            .sqr()?
            .sum_all()?
            .to_scalar::<f32>()?
            .is_finite();
        println!(
            "{build}: f16 stage vs the same stage in f32: max {max:.3e} rms {rms:.3e}, finite: {finite}"
        );
        failed |= !finite;
        if let Some(dir) = &a.out {
            std::fs::create_dir_all(dir)?;
            let path = format!("{dir}/out_{build}_{}.safetensors", a.scale);
            let outs = HashMap::from([("y".to_string(), y.clone()), ("y_block0".to_string(), y0)]);
            candle_core::safetensors::save(&outs, &path)?;
            println!("{build}: wrote {path}");
            if a.dump {
                let d = Dump::new(ops);
                drop(stage.forward(&d, &x)?);
                let path = format!("{dir}/steps_{build}_{}.safetensors", a.scale);
                candle_core::safetensors::save(&d.kept.into_inner(), &path)?;
                println!("{build}: wrote {path} (every step's operands)");
            }
        }
        drop(y);
        let parts: &[(&str, Option<usize>)] = if a.reps == 0 {
            &[]
        } else {
            &[("stage", None), ("block0", Some(0)), ("block1", Some(1))]
        };
        for &(part, block) in parts {
            let mut f = || match block {
                None => stage.forward(ops, &x),
                Some(i) => stage.forward_block(ops, i, &x),
            };
            for _ in 0..3 {
                clock.time(&mut f)?;
            }
            #[cfg(feature = "cuda")]
            pool::reset_high();
            let (times, host): (Vec<f64>, Vec<f64>) = (0..a.reps)
                .map(|_| clock.time(&mut f))
                .collect::<Res<Vec<(f64, f64)>>>()?
                .into_iter()
                .unzip();
            #[allow(unused_mut)]
            let mut mem = String::new();
            #[cfg(feature = "cuda")]
            {
                use candle_core::cuda_backend::cudarc::driver::sys::CUmemPool_attribute as A;
                if let (Some(hi), Some(cur)) = (
                    pool::used(A::CU_MEMPOOL_ATTR_USED_MEM_HIGH),
                    pool::used(A::CU_MEMPOOL_ATTR_USED_MEM_CURRENT),
                ) {
                    mem = format!(
                        "  pool high {:.1} MiB (+{:.1} over resident)",
                        hi as f64 / 1048576.0,
                        (hi - cur) as f64 / 1048576.0
                    );
                }
            }
            let min = times.iter().cloned().fold(f64::INFINITY, f64::min);
            println!(
                "{} {part:6} {build:9} median {:10.1} us  min {min:10.1} us  host {:8.1} us  ({} reps){mem}",
                a.scale,
                median(times.clone()),
                median(host),
                a.reps
            );
        }
        if a.breakdown > 0 {
            breakdown(
                &stage,
                &b,
                &x,
                &dev,
                a.breakdown,
                &format!("{} {build}", a.scale),
            )?;
        }
    }
    if failed {
        return Err("a build failed".into());
    }
    Ok(())
}
