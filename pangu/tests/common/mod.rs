//! Running the `pangu` binary from the integration tests.
use std::path::Path;
use std::process::{Command, Output};

/// `pangu args`, its output collected.
pub fn pangu(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pangu"))
        .args(args)
        .output()
        .expect("run pangu")
}

/// `pangu args`, which must succeed: its stdout.
pub fn ok(args: &[&str]) -> String {
    let o = pangu(args);
    assert!(
        o.status.success(),
        "pangu {args:?} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A path as a command-line argument.
pub fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}
