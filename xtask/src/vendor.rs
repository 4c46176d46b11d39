//! `cargo xtask amd-route`: an AMD code object for a `-mcpu` that rustc's
//! LLVM does not know (Hygon gfx926/928/936 exist only in the vendor's DTK
//! LLVM), through LLVM bitcode.
//!
//! 1. The pinned rustc emits the kernels' fat-LTO module as bitcode for
//!    `amdgcn-amd-amdhsa` (the recipe of the committed objects, with
//!    `--emit=llvm-bc`), optimised for `--bitcode-cpu` (default gfx90a: a
//!    wave64 gfx9 whose middle-end choices suit the family).
//! 2. When `--mcpu` differs, the functions' `target-cpu`/`target-features`
//!    attributes are removed (rustc's own llvm-dis / llvm-as), so that the
//!    vendor llc's `-mcpu` decides the code for every function.
//! 3. The given llc compiles it (`-O3`, code object v5), the given ld.lld
//!    links it as rustc links its AMD objects (`-shared --gc-sections`).
//!
//! Bitcode is read by the same or a newer LLVM, never an older one: the
//! llc must be of LLVM major >= rustc's (22); an older one is refused.
use crate::kernels;
use crate::recipe::{self, KERNEL_FLAGS};
use crate::toolchain::{self, output};
use crate::{Result, fail};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Options of the command.
pub struct Opts {
    /// The target processor (`gfx936`).
    pub mcpu: String,
    /// The llc that finishes the bitcode (default: the pinned llvm-tools').
    pub llc: Option<PathBuf>,
    /// The linker (default: the pinned llvm-tools' `gcc-ld/ld.lld`).
    pub ld_lld: Option<PathBuf>,
    /// The processor rustc optimises the bitcode for.
    pub bitcode_cpu: String,
    /// The code object written (default `target/amd-route/<mcpu>.elf`).
    pub out: Option<PathBuf>,
}

/// Parses the command's arguments.
pub fn parse(args: &[String]) -> Result<Opts> {
    let mut o = Opts {
        mcpu: String::new(),
        llc: None,
        ld_lld: None,
        bitcode_cpu: "gfx90a".into(),
        out: None,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut val = || {
            it.next()
                .cloned()
                .ok_or_else(|| fail(format!("{a} needs a value")))
        };
        match a.as_str() {
            "--mcpu" => o.mcpu = val()?,
            "--llc" => o.llc = Some(val()?.into()),
            "--ld-lld" => o.ld_lld = Some(val()?.into()),
            "--bitcode-cpu" => o.bitcode_cpu = val()?,
            "--out" => o.out = Some(val()?.into()),
            other => return Err(fail(format!("amd-route: unknown argument `{other}`"))),
        }
    }
    if o.mcpu.is_empty() {
        return Err(fail("amd-route: --mcpu CPU is required (e.g. gfx936)"));
    }
    Ok(o)
}

/// The LLVM major version an llc reports (`LLVM version 22.1.4`).
pub fn llvm_major(version_text: &str) -> Option<u32> {
    let rest = version_text.split("LLVM version").nth(1)?;
    let v = rest.split_whitespace().next()?;
    v.split('.').next()?.parse().ok()
}

/// Runs the route.
pub fn run(root: &Path, o: &Opts) -> Result<()> {
    toolchain::ensure()?;
    let tc = toolchain::identity()?;
    let rust_major = tc
        .llvm_major()
        .ok_or_else(|| fail(format!("rustc's LLVM version `{}`?", tc.llvm)))?;
    let bin = toolchain::llvm_bin()?;
    let llc = o.llc.clone().unwrap_or_else(|| bin.join("llc"));
    let lld = o
        .ld_lld
        .clone()
        .unwrap_or_else(|| bin.join("gcc-ld").join("ld.lld"));
    println!(
        "amd-route: LLVM-version constraint: rustc {} writes LLVM {} bitcode; the llc that \
         finishes it must be LLVM {rust_major} or newer (newer LLVM reads older bitcode, never \
         the reverse).",
        recipe::CHANNEL,
        tc.llvm
    );
    let llc_version = output(Command::new(&llc).arg("--version"))?;
    let llc_major = llvm_major(&llc_version).ok_or_else(|| {
        fail(format!(
            "{}: no `LLVM version` in its --version output",
            llc.display()
        ))
    })?;
    println!("amd-route: {} is LLVM {llc_major}", llc.display());
    if llc_major < rust_major {
        return Err(fail(format!(
            "refused: {} is LLVM {llc_major}, older than rustc's LLVM {rust_major}; it cannot read \
             this bitcode. Use a vendor toolchain whose LLVM major is >= {rust_major} (or the \
             committed gfx9 objects if the runtime accepts one).",
            llc.display()
        )));
    }

    let target = "amdgcn-amd-amdhsa";
    // An llc that does not know the cpu warns and compiles for a generic
    // one: refuse instead.
    let cpus = Command::new(&llc)
        .args(["-mtriple", target, "-mcpu=help"])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| fail(format!("{}: {e}", llc.display())))?;
    let listed = format!(
        "{}{}",
        String::from_utf8_lossy(&cpus.stdout),
        String::from_utf8_lossy(&cpus.stderr)
    );
    if !listed
        .lines()
        .any(|l| l.split_whitespace().next() == Some(o.mcpu.as_str()))
    {
        return Err(fail(format!(
            "refused: {} does not know -mcpu={} (`llc -mtriple={target} -mcpu=help` lists \
             what it knows); use the vendor's llc (Hygon: DTK's LLVM)",
            llc.display(),
            o.mcpu
        )));
    }

    let work = crate::target_dir(root).join("amd-route");
    let rustflags = vec![
        format!("-Ctarget-cpu={}", o.bitcode_cpu),
        format!(
            "-Cllvm-args=--amdhsa-code-object-version={}",
            recipe::AMD_CODE_OBJECT_VERSION
        ),
    ];
    let mut kflags: Vec<String> = KERNEL_FLAGS.iter().map(|s| s.to_string()).collect();
    // The fat-LTO module (the whole program) as bitcode; no link step.
    kflags.extend(["--emit=llvm-bc".into(), "-Clinker=true".into()]);
    let dir = kernels::nested(
        root,
        &work.join(format!("bitcode-{}", o.bitcode_cpu)),
        target,
        &rustflags,
        &kflags,
    )?;
    let mut bc = dir.join("deps").join("wavefuse_device.bc");
    if !bc.exists() {
        return Err(fail(format!("{} was not written", bc.display())));
    }
    if o.mcpu != o.bitcode_cpu {
        bc = retarget(&bin, &bc, &work.join(format!("{}.bc", o.mcpu)))?;
    }
    let obj = work.join(format!("{}.o", o.mcpu));
    toolchain::run(
        Command::new(&llc)
            .args(["-O3", "-mtriple", target])
            .arg(format!("-mcpu={}", o.mcpu))
            .arg(format!(
                "--amdhsa-code-object-version={}",
                recipe::AMD_CODE_OBJECT_VERSION
            ))
            .args(["-filetype=obj", "-o"])
            .arg(&obj)
            .arg(&bc),
    )?;
    let out = o
        .out
        .clone()
        .unwrap_or_else(|| work.join(format!("{}.elf", o.mcpu)));
    if let Some(p) = out.parent() {
        fs::create_dir_all(p).map_err(|e| fail(format!("mkdir {}: {e}", p.display())))?;
    }
    // As rustc links its AMD code objects (rust-lld, gnu flavour).
    toolchain::run(
        Command::new(&lld)
            .args(["-shared", "--gc-sections", "-O1", "--strip-debug"])
            .args(["-z", "noexecstack", "-o"])
            .arg(&out)
            .arg(&obj),
    )?;
    println!("amd-route: wrote {}", out.display());
    println!(
        "amd-route: check it: WAVEFUSE_AMD_ELF={}={} cargo test --test amd_static \
         (WAVEFUSE_LLVM_BIN=<vendor llvm bin> for a cpu rustc's llvm-objdump does not know)",
        o.mcpu,
        out.display()
    );
    println!(
        "amd-route: embed it: WAVEFUSE_AMD_EXTRA={}={} cargo build ...",
        o.mcpu,
        out.display()
    );
    Ok(())
}

/// `bc` with every function's `target-cpu` and `target-features` removed,
/// written to `out` (through rustc's own LLVM, which reads its bitcode).
fn retarget(bin: &Path, bc: &Path, out: &Path) -> Result<PathBuf> {
    let ll = output(Command::new(bin.join("llvm-dis")).arg(bc).args(["-o", "-"]))?;
    let stripped: String = ll
        .lines()
        .map(|l| {
            if l.starts_with("attributes #") {
                strip_attr(&strip_attr(l, "\"target-cpu\""), "\"target-features\"")
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    let ll_path = out.with_extension("ll");
    fs::write(&ll_path, stripped + "\n")
        .map_err(|e| fail(format!("write {}: {e}", ll_path.display())))?;
    toolchain::run(
        Command::new(bin.join("llvm-as"))
            .arg(&ll_path)
            .arg("-o")
            .arg(out),
    )?;
    Ok(out.to_path_buf())
}

/// `line` without the `key="..."` attribute.
fn strip_attr(line: &str, key: &str) -> String {
    let Some(start) = line.find(&format!("{key}=\"")) else {
        return line.to_string();
    };
    let value_start = start + key.len() + 2;
    let Some(len) = line[value_start..].find('"') else {
        return line.to_string();
    };
    let end = value_start + len + 1;
    let rest = line[end..].strip_prefix(' ').unwrap_or(&line[end..]);
    format!("{}{rest}", &line[..start])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_llvm_major() {
        let v = "LLVM (http://llvm.org/):\n  LLVM version 22.1.4\n  Optimized build.\n";
        assert_eq!(llvm_major(v), Some(22));
        assert_eq!(llvm_major("AMD LLVM version 17.0.0git"), Some(17));
        assert_eq!(llvm_major("no version"), None);
    }

    #[test]
    fn strips_one_attribute() {
        let l = r#"attributes #0 = { nounwind "target-cpu"="gfx90a" "target-features"="+a,+b" "x"="y" }"#;
        let s = strip_attr(&strip_attr(l, "\"target-cpu\""), "\"target-features\"");
        assert_eq!(s, r#"attributes #0 = { nounwind "x"="y" }"#);
    }
}
