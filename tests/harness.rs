//! The harness (the README's main command) as CI runs it: a clean run
//! passes, and a case that leaks device memory fails the run, naming the
//! case and the bytes.
use std::process::Command;

fn harness(extra: &[&str]) -> std::process::Output {
    let out = std::env::temp_dir().join(format!("wavefuse-harness-test-{}", std::process::id()));
    let o = Command::new(env!("CARGO_BIN_EXE_wavefuse-suite"))
        .args([
            "--backend",
            "cpu",
            "--quick",
            "--reps",
            "2",
            "--only",
            "layer_norm",
        ])
        .arg("--out")
        .arg(&out)
        .args(extra)
        .output()
        .expect("run the harness");
    let _ = std::fs::remove_dir_all(&out);
    o
}

#[test]
fn a_leaking_case_fails_the_run() {
    let clean = harness(&[]);
    assert!(
        clean.status.success(),
        "clean run failed: {}",
        String::from_utf8_lossy(&clean.stderr)
    );
    let leaky = harness(&["--inject-leak", "4096"]);
    let err = String::from_utf8_lossy(&leaky.stderr);
    assert!(!leaky.status.success(), "a leak passed: {err}");
    assert!(
        err.contains("device memory in use grew by 4096 bytes"),
        "{err}"
    );
}
