//! Static checks of every embedded AMD code object (the AMD path's proof
//! short of silicon): all kernels present, wave64, no scratch, no spills;
//! prints VGPR counts and the widest global load per kernel.
//!
//! Uses llvm-readobj / llvm-objdump from the pinned toolchain's
//! `llvm-tools` component (same LLVM as rustc).
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use wavefuse::code_objects::{AMD, KERNELS};

fn llvm_tool(name: &str) -> PathBuf {
    let sysroot = Command::new(std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into()))
        .args(["--print", "sysroot"])
        .output()
        .expect("rustc --print sysroot");
    let sysroot = String::from_utf8_lossy(&sysroot.stdout).trim().to_string();
    let host = Command::new("rustc")
        .args(["-vV"])
        .output()
        .expect("rustc -vV");
    let host = String::from_utf8_lossy(&host.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: ").map(str::to_string))
        .expect("host triple");
    let p = PathBuf::from(sysroot)
        .join("lib/rustlib")
        .join(host)
        .join("bin")
        .join(name);
    assert!(
        p.exists(),
        "{} missing: install the llvm-tools component",
        p.display()
    );
    p
}

#[derive(Default, Debug)]
struct Meta {
    vgpr: u32,
    sgpr: u32,
    vgpr_spill: u32,
    sgpr_spill: u32,
    private: u32,
    wave: u32,
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
    assert!(!AMD.is_empty(), "no AMD code objects were built");
    let readobj = llvm_tool("llvm-readobj");
    let objdump = llvm_tool("llvm-objdump");
    let dir = std::env::temp_dir().join(format!("wavefuse-static-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    for (arch, elf) in AMD {
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
        let loads = widest_loads(&String::from_utf8_lossy(&asm.stdout));
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
    let want = wavefuse::code_objects::AMD_CODE_OBJECT_VERSION as u8 - 2;
    for (arch, elf) in AMD {
        assert_eq!(&elf[..4], b"\x7fELF", "{arch}: not an ELF");
        assert_eq!(elf[7], 64, "{arch}: OS ABI must be AMDGPU_HSA");
        assert_eq!(elf[8], want, "{arch}: code object ABI version");
    }
}
