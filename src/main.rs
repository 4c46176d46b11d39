//! The wavefuse harness: every kernel at the Pangu shapes on the best
//! backend present (or the one asked for), checked against the f64 oracle,
//! timed with device events over rotated buffers, and compared with a
//! device-to-device copy of the same bytes measured in the same run.
//!
//! ```text
//! cargo run --release -- [--backend auto|cuda|hip|cpu|cpu32] [--out DIR]
//!                        [--reps N] [--only SUBSTRING|=NAME] [--quick]
//! ```
//! Writes `DIR/results.jsonl` (one record per case) and `DIR/chart.svg`.
//! `wavefuse-suite check ...` is the golden mode (see `golden.rs`),
//! `wavefuse-suite soak ...` the soak (see `soak.rs`).
mod bench;
mod cases;
mod golden;
mod report;
mod soak;

use std::process::ExitCode;
use wavefuse::{BackendKind, Choice, Device};

struct Args {
    backend: Choice,
    out: std::path::PathBuf,
    reps: usize,
    only: Option<String>,
    quick: bool,
    /// Fault injection for the harness's own test: device memory leaked by
    /// every case (the no-growth check must fail the run).
    inject_leak: usize,
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        backend: Choice::Auto,
        out: "target/harness".into(),
        reps: 100,
        only: None,
        quick: false,
        inject_leak: 0,
    };
    let mut it = std::env::args().skip(1);
    while let Some(s) = it.next() {
        let mut val = || it.next().ok_or(format!("{s} needs a value"));
        match s.as_str() {
            "--backend" => {
                let v = val()?;
                a.backend = Choice::parse(&v).ok_or(format!("unknown backend {v}"))?;
            }
            "--out" => a.out = val()?.into(),
            "--reps" => a.reps = val()?.parse().map_err(|e| format!("--reps: {e}"))?,
            "--only" => a.only = Some(val()?),
            "--quick" => a.quick = true,
            "--inject-leak" => {
                a.inject_leak = val()?.parse().map_err(|e| format!("--inject-leak: {e}"))?
            }
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(a)
}

fn main() -> ExitCode {
    if std::env::args().nth(1).as_deref() == Some("soak") {
        return match soak::run(std::env::args().skip(2)) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("soak: {e}");
                ExitCode::FAILURE
            }
        };
    }
    if std::env::args().nth(1).as_deref() == Some("check") {
        return match golden::run(std::env::args().skip(2)) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("check: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!(
                "{e}\nusage: wavefuse-suite [--backend auto|cuda|hip|cpu|cpu32] [--out DIR] [--reps N] [--only S] [--quick] [--inject-leak BYTES]\n       wavefuse-suite soak [--backend B] [--launches N] [--only S] [--stream own|per-thread]\n       wavefuse-suite check KERNEL --in NAME=PATH ... (src/golden.rs)"
            );
            return ExitCode::from(2);
        }
    };
    let dev = match Device::open(args.backend) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("could not open a device: {e}");
            return ExitCode::FAILURE;
        }
    };
    let info = dev.info().clone();
    eprintln!(
        "device: {} ({}, {:?}, {}), module load {:.1} ms",
        info.name, info.code_object, info.backend, info.driver, info.load_ms
    );
    let gpu = info.backend != BackendKind::Cpu;
    let all = cases::all(gpu && !args.quick);
    let selected: Vec<_> = all
        .into_iter()
        .filter(|c| {
            args.only
                .as_ref()
                .is_none_or(|o| match o.strip_prefix('=') {
                    Some(exact) => c.name() == exact,
                    None => c.name().contains(o.as_str()),
                })
        })
        .collect();
    let reps = if gpu { args.reps } else { args.reps.min(10) };
    let mut records = Vec::new();
    let mut failed = 0;
    // Memory for the spacer is taken before the first case's "before"
    // reading, so the no-growth check is not disturbed by it.
    let mut spacer = match bench::Spacer::new(&dev) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("could not allocate the timing spacer: {e}");
            return ExitCode::FAILURE;
        }
    };
    for (i, case) in selected.iter().enumerate() {
        eprint!(
            "\r[{}/{}] {} {}          ",
            i + 1,
            selected.len(),
            case.name(),
            case.shape()
        );
        match bench::run_case(&dev, case.as_ref(), reps, &mut spacer, args.inject_leak) {
            Ok(r) => {
                if !r.correct {
                    failed += 1;
                }
                // Device memory in use must come back to where it was:
                // growth across a case is a leak, and fails the run.
                if r.mem_growth_bytes > 0 {
                    eprintln!(
                        "\n{} {}: device memory in use grew by {} bytes across the case",
                        case.name(),
                        case.shape(),
                        r.mem_growth_bytes
                    );
                    failed += 1;
                }
                records.push(r);
            }
            Err(e) => {
                eprintln!("\n{} {}: {e}", case.name(), case.shape());
                failed += 1;
            }
        }
    }
    eprintln!();
    if let Err(e) = report::write_all(&args.out, &info, &records) {
        eprintln!("writing results: {e}");
        return ExitCode::FAILURE;
    }
    report::print_table(&info, &records);
    if failed > 0 {
        eprintln!("{failed} case(s) failed correctness, leaked device memory or errored");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
