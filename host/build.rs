//! Embeds the committed GPU code objects (`kernels/`, listed by
//! `kernels/MANIFEST`). Nothing is compiled here and nothing is written
//! outside `OUT_DIR`: the objects are built from `device/` by the
//! developer command `cargo xtask kernels` (pinned nightly), so a consumer
//! on stable Rust with no GPU toolchain builds this crate.
//!
//! Settings (environment variables, read at build time):
//! - `WAVEFUSE_AMD_ARCHS`: comma list of the committed AMD objects to embed
//!   (default: all; empty = none).
//! - `WAVEFUSE_PTX_ARCHS`: the same for the committed PTX.
//! - `WAVEFUSE_AMD_EXTRA`: `ARCH=FILE[,ARCH=FILE]`, further AMD code objects
//!   to embed, built outside this crate (Hygon gfx936 through
//!   `cargo xtask amd-route`; see the README).
use std::env;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("\nwavefuse build: {e}\n");
            ExitCode::FAILURE
        }
    }
}

/// One `object` line of the manifest.
struct Listed {
    arch: String,
    file: String,
    size: u64,
}

fn run() -> Result<(), String> {
    let dir =
        PathBuf::from(env::var("CARGO_MANIFEST_DIR").map_err(|e| e.to_string())?).join("kernels");
    let out = PathBuf::from(env::var("OUT_DIR").map_err(|e| e.to_string())?);
    println!("cargo:rerun-if-changed={}", dir.display());
    for v in [
        "WAVEFUSE_AMD_ARCHS",
        "WAVEFUSE_PTX_ARCHS",
        "WAVEFUSE_AMD_EXTRA",
    ] {
        println!("cargo:rerun-if-env-changed={v}");
    }
    let manifest_path = dir.join("MANIFEST");
    let manifest = fs::read_to_string(&manifest_path)
        .map_err(|e| format!("read {}: {e}", manifest_path.display()))?;
    let field = |k: &str| {
        manifest
            .lines()
            .find_map(|l| l.strip_prefix(k).map(|v| v.trim().to_string()))
            .ok_or_else(|| format!("{} has no `{k}` line", manifest_path.display()))
    };
    let cov: u32 = field("amd-code-object-version ")?
        .parse()
        .map_err(|e| format!("amd-code-object-version: {e}"))?;
    let listed = objects(&manifest)?;
    let amd_all: Vec<&Listed> = listed.iter().filter(|o| o.file.ends_with(".elf")).collect();
    let ptx_all: Vec<&Listed> = listed.iter().filter(|o| o.file.ends_with(".ptx")).collect();
    let amd = select("WAVEFUSE_AMD_ARCHS", &amd_all)?;
    let ptx = select("WAVEFUSE_PTX_ARCHS", &ptx_all)?;

    let mut src = String::new();
    let w = &mut src;
    let _ = writeln!(w, "/// AMD code objects: (gfx arch, ELF bytes).");
    let _ = writeln!(w, "pub static AMD: &[(&str, &[u8])] = &[");
    for o in &amd {
        let p = checked(&dir, o)?;
        let _ = writeln!(w, "    ({:?}, include_bytes!({p:?})),", o.arch);
    }
    for (arch, p) in extra(cov)? {
        if amd.iter().any(|o| o.arch == arch) {
            return Err(format!(
                "WAVEFUSE_AMD_EXTRA names {arch}, which is already embedded"
            ));
        }
        let _ = writeln!(w, "    ({arch:?}, include_bytes!({p:?})),");
    }
    let _ = writeln!(w, "];");
    let _ = writeln!(w, "/// NVIDIA PTX: (sm arch, NUL-terminated PTX text).");
    let _ = writeln!(w, "pub static PTX: &[(&str, &str)] = &[");
    for o in &ptx {
        let p = checked(&dir, o)?;
        let _ = writeln!(
            w,
            "    ({:?}, concat!(include_str!({p:?}), \"\\0\")),",
            o.arch
        );
    }
    let _ = writeln!(w, "];");
    let _ = writeln!(w, "/// AMD code object version the ELFs were written with.");
    let _ = writeln!(w, "pub const AMD_CODE_OBJECT_VERSION: u32 = {cov};");
    let dst = out.join("objects.rs");
    fs::write(&dst, src).map_err(|e| format!("write {}: {e}", dst.display()))
}

/// The manifest's `object FILE size=N sha256=H` lines.
fn objects(manifest: &str) -> Result<Vec<Listed>, String> {
    manifest
        .lines()
        .filter_map(|l| l.strip_prefix("object "))
        .map(|l| {
            let mut it = l.split_whitespace();
            let file = it.next().unwrap_or_default().to_string();
            let size = it
                .find_map(|t| t.strip_prefix("size="))
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| format!("MANIFEST: no size in `object {l}`"))?;
            let arch = file
                .rsplit_once('.')
                .map(|(a, _)| a.to_string())
                .ok_or_else(|| format!("MANIFEST: `{file}` has no extension"))?;
            Ok(Listed { arch, file, size })
        })
        .collect()
}

/// The committed objects a setting keeps (all when unset).
fn select<'a>(var: &str, all: &[&'a Listed]) -> Result<Vec<&'a Listed>, String> {
    let Ok(v) = env::var(var) else {
        return Ok(all.to_vec());
    };
    let committed: Vec<&str> = all.iter().map(|o| o.arch.as_str()).collect();
    v.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|a| {
            all.iter().copied().find(|o| o.arch == a).ok_or_else(|| {
                format!(
                    "{var}={v}: `{a}` is not among the committed objects {committed:?}.\n\
                     The committed set is built by `cargo xtask kernels` (xtask/src/recipe.rs).\n\
                     An AMD arch rustc's LLVM does not know (Hygon gfx926/928/936) takes the\n\
                     bitcode route: `cargo xtask amd-route --mcpu {a} --llc VENDOR_LLC --ld-lld\n\
                     VENDOR_LD_LLD`, then WAVEFUSE_AMD_EXTRA={a}=FILE (README: Hygon gfx936)."
                )
            })
        })
        .collect()
}

/// A committed object's path, after checking it is the listed size (a
/// missing or truncated file, such as an unfetched LFS pointer, fails here
/// rather than at load time on a GPU).
fn checked(dir: &Path, o: &Listed) -> Result<String, String> {
    let p = dir.join(&o.file);
    let len = fs::metadata(&p)
        .map_err(|e| format!("{}: {e}", p.display()))?
        .len();
    if len != o.size {
        return Err(format!(
            "{} is {len} bytes, MANIFEST says {}: run `cargo xtask kernels`",
            p.display(),
            o.size
        ));
    }
    Ok(p.display().to_string())
}

/// `WAVEFUSE_AMD_EXTRA`: (arch, absolute path) of each extra ELF, checked
/// to be an AMDGPU HSA code object of the embedded version.
fn extra(cov: u32) -> Result<Vec<(String, String)>, String> {
    let Ok(v) = env::var("WAVEFUSE_AMD_EXTRA") else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for item in v.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (arch, file) = item
            .split_once('=')
            .ok_or_else(|| format!("WAVEFUSE_AMD_EXTRA: `{item}` is not ARCH=FILE"))?;
        let p = fs::canonicalize(file).map_err(|e| format!("WAVEFUSE_AMD_EXTRA {file}: {e}"))?;
        println!("cargo:rerun-if-changed={}", p.display());
        let b = fs::read(&p).map_err(|e| format!("{}: {e}", p.display()))?;
        // e_ident: magic, EI_OSABI 64 = AMDGPU_HSA, EI_ABIVERSION = v - 2;
        // e_machine 224 = EM_AMDGPU.
        let ok = b.len() > 20
            && &b[..4] == b"\x7fELF"
            && b[7] == 64
            && u32::from(b[8]) + 2 == cov
            && u16::from_le_bytes([b[18], b[19]]) == 224;
        if !ok {
            return Err(format!(
                "WAVEFUSE_AMD_EXTRA {}: not an AMDGPU HSA code object v{cov}",
                p.display()
            ));
        }
        out.push((arch.to_string(), p.display().to_string()));
    }
    Ok(out)
}
