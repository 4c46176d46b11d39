//! Soak: many launches mixing every kernel on one device, with the device
//! memory in use (and the process's resident memory) recorded before, at
//! checkpoints and after. It fails when device memory in use after the
//! launches differs from before them, or when an output is wrong.
//!
//! ```text
//! wavefuse-suite soak [--backend B] [--launches N] [--only SUBSTRING] [--stream own|per-thread]
//! ```
//!
//! `--stream per-thread` launches on the per-thread default stream
//! (`CU_STREAM_PER_THREAD` / `hipStreamPerThread`) wrapped as a caller's
//! stream, so that every launch records an event: the run also fails when
//! the process's resident memory grows by more than 64 MiB (events kept
//! after they finished would grow it).
//!
//! One input set per case at the small (`--quick`) shapes, launched round
//! robin; every 10% of the launches the device is synchronised and the
//! memory read. At the end every out-of-place output is checked against
//! the f64 oracle as the harness checks it; in-place kernels (whose state
//! after thousands of updates the host does not replay) are restored,
//! launched once more and checked.
use crate::cases;
use std::time::Instant;
use wavefuse::{BackendKind, Choice, Device};

struct Args {
    backend: Choice,
    launches: usize,
    only: Option<String>,
    per_thread: bool,
}

fn parse(args: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut a = Args {
        backend: Choice::Auto,
        launches: 1_000_000,
        only: None,
        per_thread: false,
    };
    let mut it = args;
    while let Some(s) = it.next() {
        let mut val = || it.next().ok_or(format!("{s} needs a value"));
        match s.as_str() {
            "--backend" => {
                let v = val()?;
                a.backend = Choice::parse(&v).ok_or(format!("unknown backend {v}"))?;
            }
            "--launches" => a.launches = val()?.parse().map_err(|e| format!("--launches: {e}"))?,
            "--only" => a.only = Some(val()?),
            "--stream" => {
                a.per_thread = match val()?.as_str() {
                    "own" => false,
                    "per-thread" => true,
                    v => return Err(format!("--stream {v}: expected own or per-thread")),
                }
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(a)
}

/// Device memory in use (total - free), bytes.
fn device_used(dev: &Device) -> Result<usize, String> {
    dev.mem_info()
        .map(|(free, total)| total.saturating_sub(free))
        .map_err(|e| e.to_string())
}

/// This process's resident memory in bytes (Linux; 0 elsewhere).
fn resident() -> usize {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<usize>().ok())
        .map_or(0, |pages| pages * 4096)
}

/// Runs the soak; prints one line per checkpoint and a summary.
pub fn run(args: impl Iterator<Item = String>) -> Result<(), String> {
    let a = parse(args)?;
    let dev = Device::open(a.backend).map_err(|e| format!("could not open a device: {e}"))?;
    let info = dev.info().clone();
    let e = |e: wavefuse::Error| e.to_string();
    let q = if a.per_thread {
        // SAFETY: the per-thread default stream's handle (2 on both CUDA
        // and HIP) is valid for the whole process.
        unsafe { dev.wrap_stream(2 as *mut std::ffi::c_void) }
            .map_err(|err| format!("the per-thread stream: {err}"))?
    } else {
        dev.stream().clone()
    };
    let selected: Vec<_> = cases::all(false)
        .into_iter()
        .filter(|c| {
            a.only
                .as_ref()
                .is_none_or(|o| c.name().contains(o.as_str()))
        })
        .collect();
    if selected.is_empty() {
        return Err("no case selected".into());
    }
    let mut inst = Vec::new();
    for (i, c) in selected.iter().enumerate() {
        inst.push(c.setup(&dev, 0x50A4 ^ i as u64).map_err(e)?);
    }
    // One round first: module and launch paths warm, lazy allocations made.
    for i in inst.iter_mut() {
        i.launch(&q).map_err(e)?;
    }
    q.synchronize().map_err(e)?;
    dev.synchronize().map_err(e)?;
    let (dev0, rss0) = (device_used(&dev)?, resident());
    println!(
        "soak on {} ({}, {:?}, {} stream): {} launches over {} kernels/shapes; device memory in use {} bytes, resident {} bytes",
        info.name,
        info.code_object,
        info.backend,
        if a.per_thread { "per-thread" } else { "own" },
        a.launches,
        inst.len(),
        dev0,
        rss0
    );
    let t0 = Instant::now();
    let step = (a.launches / 10).max(1);
    let mut worst_dev = dev0;
    for n in 0..a.launches {
        let k = n % inst.len();
        inst[k].launch(&q).map_err(|err| {
            format!(
                "launch {n} ({} {}): {err}",
                selected[k].name(),
                selected[k].shape()
            )
        })?;
        if (n + 1) % step == 0 || n + 1 == a.launches {
            q.synchronize().map_err(e)?;
            dev.synchronize().map_err(e)?;
            let used = device_used(&dev)?;
            worst_dev = worst_dev.max(used);
            println!(
                "  {:>9} launches, {:>7.1} s: device memory in use {used} bytes, resident {} bytes",
                n + 1,
                t0.elapsed().as_secs_f64(),
                resident()
            );
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    // Correctness at the end (see the module docs for in-place kernels).
    let mut wrong = 0;
    for (i, c) in inst.iter_mut().zip(&selected) {
        i.reset(&dev).map_err(e)?;
        i.launch(&q).map_err(e)?;
        q.synchronize().map_err(e)?;
        if let Err(msg) = i.check(&dev) {
            eprintln!("{} {}: {msg}", c.name(), c.shape());
            wrong += 1;
        }
    }
    dev.synchronize().map_err(e)?;
    let (dev1, rss1) = (device_used(&dev)?, resident());
    println!(
        "soak: {} launches in {secs:.1} s ({:.1} us each); device memory in use {dev0} -> {dev1} bytes (peak {worst_dev}), resident {rss0} -> {rss1} bytes; {wrong} of {} outputs wrong",
        a.launches,
        secs * 1e6 / a.launches.max(1) as f64,
        inst.len()
    );
    if wrong > 0 {
        return Err(format!("{wrong} case(s) gave wrong outputs"));
    }
    // Device memory must be flat. The emulator counts its own allocations;
    // on a GPU the driver's total is device-wide (nothing else runs there
    // during a bundle run).
    if dev1 != dev0 || (info.backend == BackendKind::Cpu && worst_dev != dev0) {
        return Err(format!(
            "device memory in use changed: {dev0} -> {dev1} bytes (peak {worst_dev})"
        ));
    }
    if a.per_thread && rss1 > rss0 + (64 << 20) {
        return Err(format!(
            "resident memory grew from {rss0} to {rss1} bytes over the launches"
        ));
    }
    Ok(())
}
