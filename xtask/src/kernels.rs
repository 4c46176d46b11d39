//! `cargo xtask kernels`: rebuild every committed object with the pinned
//! nightly under `target/kernels/`, copy them into `host/kernels/` and
//! rewrite the manifest.
use crate::manifest::{self, Built};
use crate::recipe::{self, Kind, Object};
use crate::toolchain;
use crate::{Result, fail};
use std::fs;
use std::path::{Path, PathBuf};

/// Options of the command.
pub struct Opts {
    /// Where the nested builds go (default `<target>/kernels`).
    pub target_dir: Option<PathBuf>,
    /// Remove that folder first: a from-scratch build.
    pub clean: bool,
    /// Compare with host/kernels instead of writing there.
    pub check: bool,
}

/// Runs the command.
pub fn run(root: &Path, opts: &Opts) -> Result<()> {
    toolchain::ensure()?;
    let tc = toolchain::identity()?;
    let base = opts
        .target_dir
        .clone()
        .unwrap_or_else(|| crate::target_dir(root).join("kernels"));
    if opts.clean && base.exists() {
        // Never remove a folder outside the workspace's target folder.
        if !base.starts_with(crate::target_dir(root)) {
            return Err(fail(format!(
                "--clean removes only folders under {}, not {}",
                crate::target_dir(root).display(),
                base.display()
            )));
        }
        fs::remove_dir_all(&base).map_err(|e| fail(format!("rm {}: {e}", base.display())))?;
    }
    let mut built = Vec::new();
    let mut bytes = Vec::new();
    for o in recipe::OBJECTS {
        let b = build(root, &base.join(o.arch), o)?;
        eprintln!(
            "xtask: {} {} bytes sha256 {}",
            o.file(),
            b.len(),
            &manifest::sha256(&b)[..16]
        );
        built.push(Built {
            object: *o,
            size: b.len() as u64,
            sha256: manifest::sha256(&b),
        });
        bytes.push(b);
    }
    let sources = manifest::sources(root).map_err(|e| fail(format!("sources: {e}")))?;
    let text = manifest::render(&tc, &sources, &built);
    let dir = root.join(manifest::DIR);
    if opts.check {
        let mut bad = Vec::new();
        for (o, b) in recipe::OBJECTS.iter().zip(&bytes) {
            if fs::read(dir.join(o.file())).ok().as_ref() != Some(b) {
                bad.push(o.file());
            }
        }
        if fs::read_to_string(root.join(manifest::PATH)).ok() != Some(text) {
            bad.push("MANIFEST".into());
        }
        if !bad.is_empty() {
            return Err(fail(format!(
                "{} differ from a fresh build: {bad:?} (run `cargo xtask kernels`)",
                manifest::DIR
            )));
        }
        eprintln!(
            "xtask: {} matches a fresh build byte for byte",
            manifest::DIR
        );
        return Ok(());
    }
    fs::create_dir_all(&dir).map_err(|e| fail(format!("mkdir {}: {e}", dir.display())))?;
    for (o, b) in recipe::OBJECTS.iter().zip(&bytes) {
        write(&dir.join(o.file()), b)?;
    }
    write(&root.join(manifest::PATH), text.as_bytes())?;
    eprintln!("xtask: wrote {} ({} objects)", manifest::DIR, bytes.len());
    Ok(())
}

fn write(p: &Path, b: &[u8]) -> Result<()> {
    fs::write(p, b).map_err(|e| fail(format!("write {}: {e}", p.display())))
}

/// Builds one object into `target_dir` and returns its bytes.
fn build(root: &Path, target_dir: &Path, o: &Object) -> Result<Vec<u8>> {
    let out = nested(
        root,
        target_dir,
        o.triple(),
        &o.rustflags(),
        &o.kernel_flags(),
    )?;
    let p = match o.kind {
        Kind::AmdElf => out.join("wavefuse_device.elf"),
        Kind::Ptx => out.join("deps/wavefuse_device.s"),
    };
    let b = fs::read(&p).map_err(|e| fail(format!("read {}: {e}", p.display())))?;
    match o.kind {
        Kind::AmdElf => Ok(b),
        Kind::Ptx => {
            let text = String::from_utf8(b).map_err(|e| fail(format!("{}: {e}", p.display())))?;
            recipe::launch_bounds(&text)
                .map(String::into_bytes)
                .map_err(|e| fail(format!("{}: {e}", p.display())))
        }
    }
}

/// Runs the pinned cargo on the device crate as the recipe says, with
/// `rustflags` for every crate and `kernel_flags` for the kernel crate
/// only; returns the profile's output folder.
pub fn nested(
    root: &Path,
    target_dir: &Path,
    triple: &str,
    rustflags: &[String],
    kernel_flags: &[String],
) -> Result<PathBuf> {
    let mut cmd = toolchain::cargo()?;
    cmd.current_dir(root)
        .args(recipe::cargo_args())
        .args(["--target", triple])
        .arg("--target-dir")
        .arg(target_dir)
        .arg("--")
        .args(kernel_flags)
        .env("CARGO_ENCODED_RUSTFLAGS", rustflags.join("\x1f"));
    toolchain::run(&mut cmd)?;
    Ok(target_dir.join(triple).join("gpu"))
}
