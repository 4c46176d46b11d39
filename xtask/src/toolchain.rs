//! The pinned nightly: installing it, locating its tools, running its
//! cargo in a clean environment.
use crate::manifest::Toolchain;
use crate::recipe::{CHANNEL, COMPONENTS};
use crate::{Result, fail};
use std::env;
use std::path::PathBuf;
use std::process::Command;

/// Installs the pinned toolchain and its components when missing.
pub fn ensure() -> Result<()> {
    let installed = output(Command::new("rustup").args(["toolchain", "list"]))?;
    let have = installed.lines().any(|l| {
        l.split_whitespace()
            .next()
            .is_some_and(|t| t.starts_with(&format!("{CHANNEL}-")))
    });
    if have {
        let comps = output(Command::new("rustup").args([
            "component",
            "list",
            "--installed",
            "--toolchain",
            CHANNEL,
        ]))?;
        let missing: Vec<&str> = COMPONENTS
            .iter()
            .copied()
            .filter(|c| {
                !comps
                    .lines()
                    .any(|l| l.starts_with(&format!("{c}-")) || l == *c)
            })
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        eprintln!("xtask: adding {missing:?} to {CHANNEL}");
        return run(Command::new("rustup")
            .args(["component", "add", "--toolchain", CHANNEL])
            .args(&missing));
    }
    eprintln!("xtask: installing {CHANNEL} (the GPU builds' pinned nightly)");
    run(Command::new("rustup").args([
        "toolchain",
        "install",
        CHANNEL,
        "--profile",
        "minimal",
        "--component",
        &COMPONENTS.join(","),
    ]))
}

/// Absolute path of one of the pinned toolchain's binaries.
pub fn which(tool: &str) -> Result<PathBuf> {
    let p = output(Command::new("rustup").args(["which", "--toolchain", CHANNEL, tool]))?;
    Ok(PathBuf::from(p.trim()))
}

/// The pinned rustc's identity.
pub fn identity() -> Result<Toolchain> {
    let v = output(Command::new(which("rustc")?).arg("-vV"))?;
    Toolchain::from_verbose_version(&v).ok_or_else(|| fail(format!("cannot parse rustc -vV: {v}")))
}

/// The pinned toolchain's `llvm-tools` folder (llc, llvm-readobj, ...).
pub fn llvm_bin() -> Result<PathBuf> {
    let rustc = which("rustc")?;
    let sysroot = output(Command::new(&rustc).args(["--print", "sysroot"]))?;
    let host = output(Command::new(&rustc).arg("-vV"))?
        .lines()
        .find_map(|l| l.strip_prefix("host: ").map(str::to_string))
        .ok_or_else(|| fail("rustc -vV has no host line"))?;
    let dir = PathBuf::from(sysroot.trim())
        .join("lib/rustlib")
        .join(host)
        .join("bin");
    if !dir.join("llc").exists() {
        return Err(fail(format!(
            "{} has no llc: `rustup component add llvm-tools --toolchain {CHANNEL}`",
            dir.display()
        )));
    }
    Ok(dir)
}

/// The pinned cargo with an empty environment but what locates the
/// toolchain: the outer build's variables (cargo's own, wrappers, flags,
/// profile overrides) must not reach the GPU builds, and one of them makes
/// compiler_builtins fail on AMDGPU.
pub fn cargo() -> Result<Command> {
    let mut cmd = Command::new(which("cargo")?);
    cmd.env_clear();
    for v in ["PATH", "HOME", "RUSTUP_HOME", "CARGO_HOME", "TMPDIR"] {
        if let Some(val) = env::var_os(v) {
            cmd.env(v, val);
        }
    }
    // rustc and any proxy cargo calls resolve to the pinned nightly.
    cmd.env("RUSTUP_TOOLCHAIN", CHANNEL);
    cmd.env("RUSTC", which("rustc")?);
    Ok(cmd)
}

/// Runs `cmd`, failing on a non-zero exit.
pub fn run(cmd: &mut Command) -> Result<()> {
    let st = cmd
        .status()
        .map_err(|e| fail(format!("cannot run {cmd:?}: {e}")))?;
    if st.success() {
        Ok(())
    } else {
        Err(fail(format!("{cmd:?} failed: {st}")))
    }
}

/// Runs `cmd` and returns its stdout.
pub fn output(cmd: &mut Command) -> Result<String> {
    let o = cmd
        .output()
        .map_err(|e| fail(format!("cannot run {cmd:?}: {e}")))?;
    if !o.status.success() {
        return Err(fail(format!(
            "{cmd:?} failed: {}\n{}",
            o.status,
            String::from_utf8_lossy(&o.stderr)
        )));
    }
    Ok(String::from_utf8_lossy(&o.stdout).into_owned())
}
