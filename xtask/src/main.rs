//! wavefuse's developer commands (`cargo xtask ...`, stable Rust).
//!
//! An xtask rather than a script: the manifest's source list and hashes
//! are computed by one piece of Rust that both the regeneration and the
//! stable staleness test (`cargo test -p xtask`) use, so the two cannot
//! disagree about which files feed the code objects.
mod kernels;
mod manifest;
mod recipe;
mod toolchain;
mod vendor;

use std::env;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// A command's failure: what went wrong and what to do.
#[derive(Debug)]
pub struct Fail(String);

/// Result of every step.
pub type Result<T> = std::result::Result<T, Fail>;

/// A failure with this message.
pub fn fail(m: impl Into<String>) -> Fail {
    Fail(m.into())
}

/// The workspace's target folder (`CARGO_TARGET_DIR` or `<root>/target`).
pub fn target_dir(root: &Path) -> PathBuf {
    env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .map(|p| if p.is_absolute() { p } else { root.join(p) })
        .unwrap_or_else(|| root.join("target"))
}

const USAGE: &str = "\
usage: cargo xtask COMMAND

  kernels [--clean] [--check] [--target-dir DIR]
      Rebuild every GPU code object with the pinned nightly (installed if
      missing) under target/kernels/, copy them into host/kernels/ and
      rewrite host/kernels/MANIFEST. --clean: from empty target folders.
      --check: compare with host/kernels/ instead of writing there.

  amd-route --mcpu CPU [--llc PATH] [--ld-lld PATH] [--bitcode-cpu CPU] [--out FILE]
      The route for AMD targets rustc's LLVM does not know (Hygon gfx936):
      rustc emits the kernels' fat-LTO LLVM bitcode for amdgcn-amd-amdhsa,
      the given llc (LLVM major >= rustc's) compiles it for -mcpu=CPU and
      ld.lld links the code object. Default llc / ld.lld: the pinned
      toolchain's llvm-tools. Default --out: target/amd-route/CPU.elf.

  toolchain
      Print the pinned nightly channel.
";

fn main() -> ExitCode {
    let args: Vec<String> = env::args().skip(1).collect();
    let root = manifest::workspace_root();
    let r = match args.first().map(String::as_str) {
        Some("kernels") => parse_kernels(&args[1..]).and_then(|o| kernels::run(&root, &o)),
        Some("amd-route") => vendor::parse(&args[1..]).and_then(|o| vendor::run(&root, &o)),
        Some("toolchain") => {
            println!("{}", recipe::CHANNEL);
            Ok(())
        }
        Some("help" | "-h" | "--help") | None => {
            print!("{USAGE}");
            Ok(())
        }
        Some(other) => Err(fail(format!("unknown command `{other}`\n\n{USAGE}"))),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(Fail(m)) => {
            eprintln!("xtask: error: {m}");
            ExitCode::FAILURE
        }
    }
}

fn parse_kernels(args: &[String]) -> Result<kernels::Opts> {
    let mut o = kernels::Opts {
        target_dir: None,
        clean: false,
        check: false,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--clean" => o.clean = true,
            "--check" => o.check = true,
            "--target-dir" => {
                let d = it
                    .next()
                    .ok_or_else(|| fail("--target-dir needs a folder"))?;
                o.target_dir = Some(PathBuf::from(d));
            }
            other => return Err(fail(format!("kernels: unknown argument `{other}`"))),
        }
    }
    Ok(o)
}
