//! Static checks of AMD code objects (the AMD path's proof short of
//! silicon): exactly the registry's kernels, wave64, no scratch, no
//! spills, the configured code object version, MFMA instructions in the
//! matrix kernels and their workgroup memory within gfx9's 64 KiB; prints
//! VGPR counts and the widest global load per kernel.
//!
//! By default every embedded object is checked. `WAVEFUSE_AMD_ELF=
//! ARCH=FILE[,ARCH=FILE]` checks those files instead (the output of
//! `cargo xtask amd-route`, for one).
//!
//! llvm-readobj / llvm-objdump come from `WAVEFUSE_LLVM_BIN`, else the
//! running rustc's `llvm-tools`, else the pinned nightly's (the toolchain
//! named in host/kernels/MANIFEST). Without any, the checks are skipped
//! with a notice unless `WAVEFUSE_REQUIRE_LLVM_TOOLS=1` (CI) or
//! `WAVEFUSE_AMD_ELF` is set.
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use wavefuse::code_objects::{AMD, AMD_CODE_OBJECT_VERSION, KERNELS};

/// `<sysroot>/lib/rustlib/<host>/bin` of `prog pre.. rustc`, if it holds
/// llvm-readobj.
fn tool_dir(prog: &str, pre: &[&str]) -> Option<PathBuf> {
    let run = |args: &[&str]| {
        Command::new(prog)
            .args(pre)
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
    };
    let v = run(&["-vV"])?;
    let host = v
        .lines()
        .find_map(|l| l.strip_prefix("host: "))?
        .to_string();
    let sysroot = run(&["--print", "sysroot"])?;
    let d = PathBuf::from(sysroot.trim())
        .join("lib/rustlib")
        .join(host)
        .join("bin");
    d.join("llvm-readobj").exists().then_some(d)
}

/// The folder holding llvm-readobj and llvm-objdump, if any.
fn llvm_bin() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("WAVEFUSE_LLVM_BIN") {
        return Some(PathBuf::from(d));
    }
    if let Some(d) = tool_dir("rustc", &[]) {
        return Some(d);
    }
    let manifest = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("host/kernels/MANIFEST"),
    )
    .ok()?;
    let channel = manifest
        .lines()
        .find_map(|l| l.strip_prefix("toolchain "))?
        .trim()
        .to_string();
    tool_dir("rustup", &["run", &channel, "rustc"])
}

/// The objects to check: `WAVEFUSE_AMD_ELF`'s files, else the embedded ones.
fn objects() -> Vec<(String, Vec<u8>)> {
    match std::env::var("WAVEFUSE_AMD_ELF") {
        Ok(list) => list
            .split(',')
            .filter(|s| !s.trim().is_empty())
            .map(|item| {
                let (arch, file) = item
                    .trim()
                    .split_once('=')
                    .unwrap_or_else(|| panic!("WAVEFUSE_AMD_ELF: `{item}` is not ARCH=FILE"));
                let b = std::fs::read(file).unwrap_or_else(|e| panic!("{file}: {e}"));
                (arch.to_string(), b)
            })
            .collect(),
        Err(_) => AMD
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_vec()))
            .collect(),
    }
}

/// The tools, or None (with a notice) when the checks may be skipped.
fn tools() -> Option<(PathBuf, PathBuf)> {
    let required = std::env::var_os("WAVEFUSE_REQUIRE_LLVM_TOOLS").is_some()
        || std::env::var_os("WAVEFUSE_AMD_ELF").is_some();
    match llvm_bin() {
        Some(d) => Some((d.join("llvm-readobj"), d.join("llvm-objdump"))),
        None if required => panic!(
            "no llvm-readobj: `rustup component add llvm-tools` (or `cargo xtask kernels`, \
             which installs the pinned nightly with it), or set WAVEFUSE_LLVM_BIN"
        ),
        None => {
            eprintln!(
                "SKIPPED: static AMD checks need llvm-tools (`rustup component add llvm-tools`); \
                 WAVEFUSE_REQUIRE_LLVM_TOOLS=1 makes this a failure"
            );
            None
        }
    }
}

#[derive(Default, Debug)]
struct Meta {
    vgpr: u32,
    sgpr: u32,
    vgpr_spill: u32,
    sgpr_spill: u32,
    private: u32,
    wave: u32,
    group: u32,
}

/// Parses `llvm-readobj --notes` (the msgpack metadata printed as YAML).
fn kernels_meta(notes: &str) -> BTreeMap<String, Meta> {
    let mut out = BTreeMap::new();
    let mut cur: Option<(String, Meta)> = None;
    let mut pending = Meta::default();
    let num = |l: &str| {
        l.rsplit(':')
            .next()
            .and_then(|v| v.trim().parse::<u32>().ok())
            .unwrap_or(u32::MAX)
    };
    for line in notes.lines() {
        let l = line.trim().trim_start_matches("- ");
        if l.starts_with(".args:") {
            if let Some((n, m)) = cur.take() {
                out.insert(n, m);
            }
            pending = Meta::default();
        }
        let m = match cur.as_mut() {
            Some((_, m)) => m,
            None => &mut pending,
        };
        if l.starts_with(".vgpr_count:") {
            m.vgpr = num(l);
        } else if l.starts_with(".sgpr_count:") {
            m.sgpr = num(l);
        } else if l.starts_with(".vgpr_spill_count:") {
            m.vgpr_spill = num(l);
        } else if l.starts_with(".sgpr_spill_count:") {
            m.sgpr_spill = num(l);
        } else if l.starts_with(".private_segment_fixed_size:") {
            m.private = num(l);
        } else if l.starts_with(".wavefront_size:") {
            m.wave = num(l);
        } else if l.starts_with(".group_segment_fixed_size:") {
            m.group = num(l);
        } else if let Some(n) = l.strip_prefix(".name:") {
            let n = n.trim().to_string();
            if !n.ends_with(".kd") {
                cur = Some((n, std::mem::take(&mut pending)));
            }
        }
    }
    if let Some((n, m)) = cur.take() {
        out.insert(n, m);
    }
    out
}

/// The kernels that run on the matrix units (`gpu::mma`), with the
/// launch-sized workgroup memory they are launched with.
const MATRIX_KERNELS: &[(&str, u32)] = &[
    (
        "wf_window_attention_144",
        wavefuse_shared::geometry::ATTN_SHARED_BYTES,
    ),
    (
        "wf_window_attention_mask_144",
        wavefuse_shared::geometry::ATTN_SHARED_BYTES,
    ),
];

/// Workgroup memory (LDS) one gfx9 workgroup may use.
const GFX9_LDS: u32 = 64 * 1024;

/// How many instructions of each kernel start with `prefix`.
fn count_ops(asm: &str, prefix: &str) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    let mut cur = String::new();
    for line in asm.lines() {
        if let Some(n) = line.strip_suffix(">:").and_then(|l| l.split('<').nth(1)) {
            cur = n.to_string();
        } else if line.split_whitespace().any(|w| w.starts_with(prefix)) {
            *out.entry(cur.clone()).or_insert(0) += 1;
        }
    }
    out
}

/// Widest global load per kernel from the disassembly.
fn widest_loads(asm: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut cur = String::new();
    let rank = |s: &str| {
        ["dwordx4", "dwordx3", "dwordx2", "dword", "ushort", "ubyte"]
            .iter()
            .position(|w| s.ends_with(w))
    };
    for line in asm.lines() {
        if let Some(n) = line.strip_suffix(">:").and_then(|l| l.split('<').nth(1)) {
            cur = n.to_string();
        } else if let Some(op) = line
            .split_whitespace()
            .find(|w| w.starts_with("global_load_"))
        {
            let e = out.entry(cur.clone()).or_insert_with(|| op.to_string());
            if rank(op) < rank(e) {
                *e = op.to_string();
            }
        }
    }
    out
}

#[test]
fn amd_code_objects_are_wave64_without_scratch_or_spills() {
    let objs = objects();
    assert!(!objs.is_empty(), "no AMD code objects to check");
    let Some((readobj, objdump)) = tools() else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("wavefuse-static-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    for (arch, elf) in &objs {
        let path = dir.join(format!("{arch}.elf"));
        std::fs::write(&path, elf).expect("write elf");
        let notes = Command::new(&readobj)
            .arg("--notes")
            .arg(&path)
            .output()
            .expect("llvm-readobj");
        let notes = String::from_utf8_lossy(&notes.stdout);
        let meta = kernels_meta(&notes);
        let asm = Command::new(&objdump)
            .args(["-d", &format!("--mcpu={arch}")])
            .arg(&path)
            .output()
            .expect("llvm-objdump");
        let asm = String::from_utf8_lossy(&asm.stdout);
        let loads = widest_loads(&asm);
        let mfma = count_ops(&asm, "v_mfma_f32_16x16x16");
        for (k, dynamic) in MATRIX_KERNELS {
            let m = meta
                .get(*k)
                .unwrap_or_else(|| panic!("{arch}: kernel {k} missing from the code object"));
            let n = mfma.get(*k).copied().unwrap_or(0);
            println!(
                "{arch} {k:<32} v_mfma_f32_16x16x16 x{n}, workgroup memory {} static + {dynamic} launch-sized",
                m.group
            );
            assert!(n > 0, "{arch} {k}: no v_mfma_f32_16x16x16 instruction");
            assert!(
                m.group + dynamic <= GFX9_LDS,
                "{arch} {k}: {} + {dynamic} bytes of LDS exceed 64 KiB",
                m.group
            );
        }
        let exported: BTreeSet<&str> = meta.keys().map(String::as_str).collect();
        let registry: BTreeSet<&str> = KERNELS.iter().copied().collect();
        assert_eq!(
            exported, registry,
            "{arch}: the code object's kernels are not the registry's"
        );
        for k in KERNELS {
            let m = meta
                .get(*k)
                .unwrap_or_else(|| panic!("{arch}: kernel {k} missing from the code object"));
            println!(
                "{arch} {k:<32} vgpr {:>3} sgpr {:>3} wave{} private {} spills v{}/s{} widest load {}",
                m.vgpr,
                m.sgpr,
                m.wave,
                m.private,
                m.vgpr_spill,
                m.sgpr_spill,
                loads.get(*k).map_or("-", String::as_str)
            );
            assert_eq!(m.wave, 64, "{arch} {k}: wavefront size");
            assert_eq!(m.private, 0, "{arch} {k}: private segment (scratch) in use");
            assert_eq!(
                (m.vgpr_spill, m.sgpr_spill),
                (0, 0),
                "{arch} {k}: register spills"
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn amd_code_object_version_is_the_configured_one() {
    // ELF e_ident[EI_ABIVERSION]: 2 = v4, 3 = v5, 4 = v6.
    let want = AMD_CODE_OBJECT_VERSION as u8 - 2;
    for (arch, elf) in objects() {
        assert_eq!(&elf[..4], b"\x7fELF", "{arch}: not an ELF");
        assert_eq!(elf[7], 64, "{arch}: OS ABI must be AMDGPU_HSA");
        assert_eq!(elf[8], want, "{arch}: code object ABI version");
        assert_eq!(
            u16::from_le_bytes([elf[18], elf[19]]),
            224,
            "{arch}: e_machine must be EM_AMDGPU"
        );
    }
}
