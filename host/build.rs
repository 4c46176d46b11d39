//! Builds the device crate's kernels for every configured GPU arch with a
//! nested cargo (rustc nightly, `-Zbuild-std=core`) and embeds the results.
//!
//! Settings (environment variables, read at build time):
//! - `WAVEFUSE_AMD_ARCHS`: comma-separated gfx targets (default `gfx90a,gfx942`;
//!   empty = none).
//! - `WAVEFUSE_AMD_CODE_OBJECT_VERSION`: 4, 5 or 6 (default 5).
//! - `WAVEFUSE_PTX_ARCHS`: comma-separated sm targets (default `sm_80,sm_90`;
//!   empty = none).
//!
//! Kernels are rebuilt only when the device or shared sources (or these
//! settings) change; each arch keeps its own target dir under
//! `target/gpu/<arch>`.
use std::env;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// AMD targets rustc's LLVM (22) knows in the gfx9 family and later.
const KNOWN_AMD: &[&str] = &[
    "gfx900",
    "gfx902",
    "gfx904",
    "gfx906",
    "gfx908",
    "gfx909",
    "gfx90a",
    "gfx90c",
    "gfx940",
    "gfx941",
    "gfx942",
    "gfx950",
    "gfx9-generic",
    "gfx9-4-generic",
    "gfx1010",
    "gfx1030",
    "gfx1100",
    "gfx1200",
];

/// Flags for the kernel crate only (not core / compiler_builtins, which
/// this setting breaks on AMDGPU): full unrolling of the fixed-trip row
/// loops keeps rows in registers (without it the affine LayerNorm spills its
/// row to local memory on NVPTX).
const KERNEL_FLAGS: &[&str] = &["-Cllvm-args=-unroll-threshold=1000"];

fn main() {
    let manifest =
        PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let root = manifest
        .parent()
        .expect("host/ lives in the workspace")
        .to_path_buf();
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    for p in [
        "device/src",
        "device/Cargo.toml",
        "shared/src",
        "shared/Cargo.toml",
        "Cargo.toml",
    ] {
        println!("cargo:rerun-if-changed={}", root.join(p).display());
    }
    for v in [
        "WAVEFUSE_AMD_ARCHS",
        "WAVEFUSE_AMD_CODE_OBJECT_VERSION",
        "WAVEFUSE_PTX_ARCHS",
    ] {
        println!("cargo:rerun-if-env-changed={v}");
    }
    let amd = list("WAVEFUSE_AMD_ARCHS", "gfx90a,gfx942");
    let ptx = list("WAVEFUSE_PTX_ARCHS", "sm_80,sm_90");
    let cov = env::var("WAVEFUSE_AMD_CODE_OBJECT_VERSION").unwrap_or_else(|_| "5".into());
    if !["4", "5", "6"].contains(&cov.as_str()) {
        panic!("WAVEFUSE_AMD_CODE_OBJECT_VERSION={cov}: must be 4, 5 or 6");
    }
    for a in &amd {
        if !KNOWN_AMD.contains(&a.as_str()) {
            panic!(
                "\n\nwavefuse: AMD arch `{a}` is unknown to rustc's LLVM (known: {KNOWN_AMD:?}).\n\
                 Hygon DCU names (gfx926/gfx928/gfx936) exist only in the vendor's DTK LLVM.\n\
                 Routes: (1) build for a compatible generic/gfx9 target the DTK runtime accepts;\n\
                 (2) emit LLVM bitcode from rustc (`--emit=llvm-bc`, target amdgcn-amd-amdhsa) and\n\
                 finish it with the DTK toolchain's llc/lld for `-mcpu={a}`; this needs DTK's LLVM\n\
                 major version >= rustc's (22): newer LLVM reads older bitcode, never the reverse.\n"
            );
        }
    }
    let target_root = env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"))
        .join("gpu");

    let mut src = String::new();
    writeln!(src, "/// AMD code objects: (gfx arch, ELF bytes).").ok();
    writeln!(src, "pub static AMD: &[(&str, &[u8])] = &[").ok();
    for a in &amd {
        let flags = vec![
            format!("-Ctarget-cpu={a}"),
            format!("-Cllvm-args=--amdhsa-code-object-version={cov}"),
        ];
        let dir = target_root.join(format!("{a}-v{cov}"));
        cargo_device(&root, &dir, "amdgcn-amd-amdhsa", &flags, false);
        let elf = dir.join("amdgcn-amd-amdhsa/gpu/wavefuse_device.elf");
        let dst = out.join(format!("wavefuse_{a}.elf"));
        copy(&elf, &dst);
        writeln!(
            src,
            "    ({a:?}, include_bytes!({:?})),",
            dst.display().to_string()
        )
        .ok();
    }
    writeln!(src, "];").ok();
    writeln!(src, "/// NVIDIA PTX: (sm arch, NUL-terminated PTX text).").ok();
    writeln!(src, "pub static PTX: &[(&str, &str)] = &[").ok();
    for s in &ptx {
        if !s.starts_with("sm_") || s[3..].parse::<u32>().is_err() {
            panic!("WAVEFUSE_PTX_ARCHS entry `{s}` is not of the form sm_NN");
        }
        let dir = target_root.join(s);
        cargo_device(
            &root,
            &dir,
            "nvptx64-nvidia-cuda",
            &[format!("-Ctarget-cpu={s}")],
            true,
        );
        let asm = dir.join("nvptx64-nvidia-cuda/gpu/deps/wavefuse_device.s");
        let dst = out.join(format!("wavefuse_{s}.ptx"));
        let mut text =
            fs::read_to_string(&asm).unwrap_or_else(|e| panic!("read {}: {e}", asm.display()));
        text.push('\0');
        fs::write(&dst, text).unwrap_or_else(|e| panic!("write {}: {e}", dst.display()));
        writeln!(
            src,
            "    ({s:?}, include_str!({:?})),",
            dst.display().to_string()
        )
        .ok();
    }
    writeln!(src, "];").ok();
    writeln!(
        src,
        "/// AMD code object version the ELFs were written with."
    )
    .ok();
    writeln!(src, "pub const AMD_CODE_OBJECT_VERSION: u32 = {cov};").ok();
    fs::write(out.join("objects.rs"), src).expect("write objects.rs");
}

fn list(var: &str, default: &str) -> Vec<String> {
    env::var(var)
        .unwrap_or_else(|_| default.into())
        .split(',')
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

fn copy(from: &Path, to: &Path) {
    fs::copy(from, to)
        .unwrap_or_else(|e| panic!("copy {} -> {}: {e}", from.display(), to.display()));
}

fn cargo_device(root: &Path, target_dir: &Path, target: &str, flags: &[String], ptx: bool) {
    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(root)
        .args([
            "rustc",
            "-p",
            "wavefuse-device",
            "--profile",
            "gpu",
            "--target",
            target,
        ])
        .args(["-Zbuild-std=core", "--crate-type", "cdylib"])
        .arg("--target-dir")
        .arg(target_dir)
        .arg("--")
        .args(KERNEL_FLAGS);
    if ptx {
        // No bitcode linker here: the fat-LTO module emitted as assembly is
        // the complete PTX; `-Clinker=true` skips the link step.
        cmd.args(["--emit=asm", "-Clinker=true"]);
    }
    // The outer build's environment (wrappers such as clippy-driver, its
    // flags, profile and cfg variables) must not leak into the device
    // build: one of them makes compiler_builtins fail on AMDGPU. Start from
    // an empty environment and keep only what locates the toolchain.
    cmd.env_clear();
    for v in [
        "PATH",
        "HOME",
        "RUSTUP_HOME",
        "CARGO_HOME",
        "RUSTUP_TOOLCHAIN",
        "TMPDIR",
    ] {
        if let Some(val) = env::var_os(v) {
            cmd.env(v, val);
        }
    }
    cmd.env("CARGO_ENCODED_RUSTFLAGS", flags.join("\x1f"));
    let status = cmd
        .status()
        .unwrap_or_else(|e| panic!("could not run cargo for {target}: {e}"));
    if !status.success() {
        panic!("device build for {target} ({flags:?}) failed: {status}");
    }
}
