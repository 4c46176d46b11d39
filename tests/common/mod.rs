//! Shared test support: the backends to test (opened explicitly, coverage
//! asserted and reported), the emulator as reference, and what the suite
//! shares with the harness (`wavefuse_suite`: f64 oracles, ulp measures,
//! the LayerNorm row check, the input generator).
//!
//! Settings (environment variables):
//! - `WAVEFUSE_TEST_GPU_ONLY=1`: kernel tests run on GPU backends only
//!   (the sanitizer runs); no GPU opening is a failure, with each open
//!   error.
//! - `WAVEFUSE_REQUIRE=cuda,hip,cpu64,cpu32` (any subset): a named backend
//!   that does not open fails every kernel test, with the open error
//!   (driver missing, no code object for the device's arch, ...).
//! - `WAVEFUSE_BACKENDS_LOG=FILE`: each test binary appends one line
//!   naming the backends its kernel tests ran on and why the others did
//!   not open.
#![allow(dead_code, unused_imports)]

pub mod oracle;
pub mod rows;

use std::io::Write as _;
use std::sync::Once;
use wavefuse::{BackendKind, Choice, Device, Wave};
pub use wavefuse_suite::check::{POISON, check_ln_row, ulp_err, ulp16};
pub use wavefuse_suite::rng::Rng;

/// The backends the suite knows, by the names `WAVEFUSE_REQUIRE` uses.
pub const BACKENDS: [(&str, Choice); 4] = [
    ("cuda", Choice::Cuda(0)),
    ("hip", Choice::Hip(0)),
    ("cpu64", Choice::Cpu(Wave::W64)),
    ("cpu32", Choice::Cpu(Wave::W32)),
];

/// The backend names `WAVEFUSE_REQUIRE` lists (an unknown name is an error).
pub fn required() -> Vec<String> {
    let v = std::env::var("WAVEFUSE_REQUIRE").unwrap_or_default();
    let names: Vec<String> = v
        .split(',')
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect();
    for n in &names {
        assert!(
            BACKENDS.iter().any(|(b, _)| b == n),
            "WAVEFUSE_REQUIRE names `{n}`; known: cuda, hip, cpu64, cpu32"
        );
    }
    names
}

/// Whether kernel tests run on GPU backends only.
pub fn gpu_only() -> bool {
    std::env::var_os("WAVEFUSE_TEST_GPU_ONLY").is_some()
}

/// The backends to test: CUDA and HIP device 0 when they open, the CPU
/// emulator in wave64 and wave32 always (both must open), each opened
/// explicitly so that an open error is seen, not discarded. Panics (fails
/// the calling test) when a backend named by `WAVEFUSE_REQUIRE` does not
/// open, or when `WAVEFUSE_TEST_GPU_ONLY` is set and no GPU opens; the
/// message carries the open errors. Reports the outcome once per test
/// binary ([`report`]).
///
/// The backends are opened once per test binary and shared (a `Device` is
/// `Sync`): a property test's cases reuse them instead of opening a device
/// (a context and a module load on a GPU) per case.
pub fn devices() -> Vec<Device> {
    static OPEN: std::sync::OnceLock<Vec<Device>> = std::sync::OnceLock::new();
    // A failed check panics inside the initialiser, which leaves it unset:
    // every later call checks (and fails) again.
    OPEN.get_or_init(open_devices).clone()
}

fn open_devices() -> Vec<Device> {
    let required = required();
    let gpu_only = gpu_only();
    let mut ran = Vec::new();
    let mut missing = Vec::new();
    for (name, choice) in BACKENDS {
        match Device::open(choice) {
            Ok(d) if gpu_only && d.info().backend == BackendKind::Cpu => {}
            Ok(d) => ran.push((name, d)),
            Err(e) => missing.push((name, e.to_string())),
        }
    }
    let why = |missing: &[(&str, String)]| {
        missing
            .iter()
            .map(|(n, e)| format!("{n}: {e}"))
            .collect::<Vec<_>>()
            .join("; ")
    };
    report(&ran, &missing);
    for (n, e) in &missing {
        assert!(
            !required.iter().any(|r| r == n),
            "WAVEFUSE_REQUIRE names {n}, which did not open: {e}"
        );
        assert!(
            !n.starts_with("cpu"),
            "the {n} emulator must always open: {e}"
        );
    }
    assert!(
        !ran.is_empty(),
        "WAVEFUSE_TEST_GPU_ONLY is set but no GPU backend opened ({})",
        why(&missing)
    );
    ran.into_iter().map(|(_, d)| d).collect()
}

/// Appends, once per test binary, the line `NAME: ran on A (device, code
/// object), B; not opened: C (why)` to the file named by
/// `WAVEFUSE_BACKENDS_LOG` (and prints it to stderr).
fn report(ran: &[(&str, Device)], missing: &[(&str, String)]) {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let bin = std::env::current_exe()
            .ok()
            .and_then(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
            .unwrap_or_else(|| "?".into());
        // cargo's deps/NAME-HASH: keep NAME.
        let bin = match bin.rsplit_once('-') {
            Some((n, h)) if h.len() == 16 && h.bytes().all(|b| b.is_ascii_hexdigit()) => n.into(),
            _ => bin,
        };
        let on: Vec<String> = ran
            .iter()
            .map(|(n, d)| {
                let i = d.info();
                format!("{n} ({}, {})", i.name, i.code_object)
            })
            .collect();
        let off: Vec<String> = missing.iter().map(|(n, e)| format!("{n} ({e})")).collect();
        let line = format!(
            "{bin}: ran on {}; not opened: {}{}",
            if on.is_empty() {
                "nothing".into()
            } else {
                on.join(", ")
            },
            if off.is_empty() {
                "none".into()
            } else {
                off.join(", ")
            },
            if gpu_only() { " [GPU only]" } else { "" }
        );
        // Straight to stderr: the test harness captures `eprintln!`.
        let _ = writeln!(std::io::stderr(), "{line}");
        if let Some(path) = std::env::var_os("WAVEFUSE_BACKENDS_LOG") {
            let f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path);
            match f.and_then(|mut f| writeln!(f, "{line}")) {
                Ok(()) => {}
                Err(e) => panic!("WAVEFUSE_BACKENDS_LOG {}: {e}", path.to_string_lossy()),
            }
        }
    });
}

/// The emulator in wave64 mode: the reference backend, and where the
/// argument checks are exercised (they run before any launch, the same
/// code on every backend).
pub fn cpu() -> Device {
    Device::open(Choice::Cpu(Wave::W64)).expect("the wave64 emulator opens")
}

/// Checks one case's output from `backend` against the emulator's
/// (`reference`, from `Cpu(W64)`): the emulator in either wave mode and the
/// HIP build (IEEE arithmetic throughout) must give the same bits; the
/// NVIDIA build, whose kernels use the hardware's approximate reciprocal
/// square root / exp2 / reciprocal, may move an element by one f16 ulp.
/// Returns how many elements differ.
pub fn agrees_with_emulator(
    backend: BackendKind,
    name: &str,
    got: &[half::f16],
    reference: &[half::f16],
) -> usize {
    assert_eq!(got.len(), reference.len(), "{name}: length");
    let mut differ = 0;
    for (i, (a, b)) in got.iter().zip(reference).enumerate() {
        if a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()) {
            continue;
        }
        differ += 1;
        assert!(
            backend == BackendKind::Cuda,
            "{name} differs from the emulator at {i}: {a} vs {b}"
        );
        let e = ulp_err(*a, b.to_f64());
        assert!(e <= 1.0, "{name} at {i}: {a} vs emulator {b} ({e} ulp)");
    }
    differ
}

/// Asserts that each `call` fails with an error matching its pattern:
/// one row per bad input, `"what": call => Pattern`.
#[macro_export]
macro_rules! rejects {
    ($($what:literal: $call:expr => $pat:pat),* $(,)?) => {$(
        let e = $call;
        assert!(matches!(e, Err($pat)), "{}: {:?}", $what, e);
    )*};
}
