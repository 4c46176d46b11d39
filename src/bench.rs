//! Timing: cold first launch, warm-up, per-launch device events over
//! rotated input sets, and a same-byte device copy in the same run.
use crate::cases::{Case, Instance};
use serde::Serialize;
use wavefuse::{Device, DeviceBuffer, f16};

/// One case's measured result (one JSON record).
#[derive(Serialize, Clone)]
pub struct Record {
    pub variant: String,
    pub shape: String,
    pub dtype: &'static str,
    pub bytes: usize,
    pub sets: usize,
    pub reps: usize,
    pub cold_first_launch_us: f64,
    pub median_us: f64,
    pub p10_us: f64,
    pub p90_us: f64,
    pub raw_us: Vec<f64>,
    pub gbps: f64,
    pub copy_median_us: f64,
    pub copy_raw_us: Vec<f64>,
    pub copy_gbps: f64,
    pub pct_of_copy: f64,
    pub mem_used_before: usize,
    pub mem_used_after: usize,
    /// Device memory still in use after the case beyond what was in use
    /// before it (0 = no growth).
    pub mem_growth_bytes: usize,
    pub max_err_ulp: f64,
    /// Output elements compared with the f64 oracle: every element every
    /// input set holds after the timed loop (in-place kernels: the state
    /// after all their launches, replayed on the host).
    pub checked_outputs: usize,
    pub correct: bool,
}

fn used(dev: &Device) -> usize {
    dev.mem_info()
        .map(|(f, t)| t.saturating_sub(f))
        .unwrap_or(0)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i]
}

/// Input sets so the working set is >= 4x the last-level cache.
fn n_sets(dev: &Device, bytes: usize) -> usize {
    let l2 = dev.info().l2_bytes;
    if l2 == 0 {
        return 2;
    }
    (4 * l2).div_ceil(bytes.max(1)).clamp(2, 64)
}

/// Per-launch device-event times in microseconds.
///
/// All launches and events are queued first and read after one final
/// wait: reading each pair inside the loop would idle the device between
/// launches and time the host's enqueue latency too. On a GPU a few ms of
/// copies are queued ahead (`spacer`), so the device never waits for the
/// host while the timed launches are being queued.
fn time_loop(
    dev: &Device,
    reps: usize,
    spacer: Option<&mut Spacer>,
    mut f: impl FnMut(usize) -> wavefuse::Result<()>,
) -> wavefuse::Result<Vec<f64>> {
    if let Some(sp) = spacer {
        sp.queue()?;
    }
    let mut ev = Vec::with_capacity(reps);
    for i in 0..reps {
        let a = dev.record()?;
        f(i)?;
        ev.push((a, dev.record()?));
    }
    ev.iter()
        .map(|(a, b)| Ok(b.elapsed_ms(a)? as f64 * 1e3))
        .collect()
}

/// Device work queued ahead of a timed loop (GPU backends only).
///
/// It keeps the device busy while the timed launches are queued. Its
/// length matches `peers.py`'s 50 ms of `torch.cuda._sleep`, so both sides
/// start their loops from the same state; on the H200, 1.1, 50 and 200 ms
/// gave the same medians.
pub struct Spacer {
    a: DeviceBuffer<f16>,
    b: DeviceBuffer<f16>,
    copies: usize,
}

/// Device time the spacer queues ahead of each timed loop, as in `peers.py`.
const SPACER_MS: f64 = 50.0;

impl Spacer {
    /// 2 x 128 MiB buffers; `queue` copies them back and forth for about
    /// [`SPACER_MS`] (calibrated here with one timed copy).
    pub fn new(dev: &Device) -> wavefuse::Result<Option<Spacer>> {
        if dev.info().backend == wavefuse::BackendKind::Cpu {
            return Ok(None);
        }
        let n = 64 << 20;
        let mut sp = Spacer {
            a: dev.upload(&vec![f16::ONE; n])?,
            b: dev.alloc::<f16>(n)?,
            copies: 1,
        };
        let ms = std::env::var("WAVEFUSE_SPACER_MS")
            .ok()
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(SPACER_MS);
        sp.b.copy_from(&sp.a)?;
        let t = time_loop(dev, 3, None, |_| sp.b.copy_from(&sp.a))?;
        let per_copy = t.iter().copied().fold(f64::INFINITY, f64::min).max(1.0);
        sp.copies = ((ms * 1e3 / per_copy).ceil() as usize).clamp(2, 10_000);
        Ok(Some(sp))
    }

    fn queue(&mut self) -> wavefuse::Result<()> {
        for i in 0..self.copies {
            if i % 2 == 0 {
                self.b.copy_from(&self.a)?
            } else {
                self.a.copy_from(&self.b)?
            }
        }
        Ok(())
    }
}

pub fn run_case(
    dev: &Device,
    case: &dyn Case,
    reps: usize,
    spacer: &mut Option<Spacer>,
    inject_leak: usize,
) -> Result<Record, String> {
    let e = |e: wavefuse::Error| e.to_string();
    dev.synchronize().map_err(e)?;
    let before = used(dev);
    if inject_leak > 0 {
        // The harness's own test: memory that is never freed, which the
        // growth check below must report.
        std::mem::forget(dev.alloc::<f32>(inject_leak.div_ceil(4)).map_err(e)?);
    }
    let bytes = case.bytes();
    let sets = n_sets(dev, bytes);
    let mut inst: Vec<Box<dyn Instance>> = Vec::with_capacity(sets);
    for s in 0..sets {
        inst.push(case.setup(dev, 0x5EED ^ s as u64).map_err(e)?);
    }
    // Cold: the first launch of this kernel on this device in this process
    // (module load is reported separately in DeviceInfo::load_ms).
    let cold = time_loop(dev, 1, None, |_| inst[0].launch(dev.stream())).map_err(e)?[0];
    for i in 0..10.min(reps.max(1)) {
        inst[i % sets].launch(dev.stream()).map_err(e)?;
    }
    let raw = time_loop(dev, reps, spacer.as_mut(), |i| {
        inst[i % sets].launch(dev.stream())
    })
    .map_err(e)?;
    // Correctness of what was timed: every output element of every set
    // against the f64 oracle (in-place kernels after all their launches).
    let mut max_err = 0.0f64;
    let mut checked = 0;
    let mut correct = true;
    dev.synchronize().map_err(e)?;
    for i in inst.iter_mut() {
        match i.check(dev) {
            Ok(c) => {
                max_err = max_err.max(c.max_err_ulp);
                checked += c.outputs;
            }
            Err(msg) => {
                eprintln!("\n{} {}: {msg}", case.name(), case.shape());
                correct = false;
            }
        }
    }
    drop(inst);
    // Copy of the same byte count (read + written = bytes), rotated alike.
    let half_elems = (bytes / 2).div_ceil(2);
    let mut src: Vec<DeviceBuffer<f16>> = Vec::new();
    let mut dst: Vec<DeviceBuffer<f16>> = Vec::new();
    for _ in 0..sets {
        src.push(
            dev.upload(&vec![f16::from_f32(1.5); half_elems])
                .map_err(e)?,
        );
        dst.push(dev.alloc::<f16>(half_elems).map_err(e)?);
    }
    for i in 0..10.min(reps.max(1)) {
        dst[i % sets].copy_from(&src[i % sets]).map_err(e)?;
    }
    let copy_raw = time_loop(dev, reps, spacer.as_mut(), |i| {
        dst[i % sets].copy_from(&src[i % sets])
    })
    .map_err(e)?;
    drop((src, dst));
    dev.synchronize().map_err(e)?;
    // Growth is reported, and fails the run, by the caller.
    let after = used(dev);

    let mut s = raw.clone();
    s.sort_by(f64::total_cmp);
    let mut cs = copy_raw.clone();
    cs.sort_by(f64::total_cmp);
    let median = percentile(&s, 0.5);
    let copy_median = percentile(&cs, 0.5);
    let gbps = bytes as f64 / (median * 1e-6) / 1e9;
    let copy_gbps = (half_elems * 4) as f64 / (copy_median * 1e-6) / 1e9;
    Ok(Record {
        variant: case.name(),
        shape: case.shape(),
        dtype: "f16",
        bytes,
        sets,
        reps,
        cold_first_launch_us: cold,
        median_us: median,
        p10_us: percentile(&s, 0.1),
        p90_us: percentile(&s, 0.9),
        raw_us: raw,
        gbps,
        copy_median_us: copy_median,
        copy_raw_us: copy_raw,
        copy_gbps,
        pct_of_copy: 100.0 * copy_median / median,
        mem_used_before: before,
        mem_used_after: after,
        mem_growth_bytes: after.saturating_sub(before),
        max_err_ulp: max_err,
        checked_outputs: checked,
        correct,
    })
}
