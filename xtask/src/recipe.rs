//! How the committed code objects are built: the one place that names the
//! toolchain, the objects, the profile and the flags. The manifest records
//! all of it, so a change here shows up in `host/kernels/MANIFEST` (and the
//! staleness test fails until the objects are regenerated).

/// The pinned nightly. The GPU builds need it (`-Zbuild-std=core`, the
/// kernel ABI, core's `f16`); nothing else in the workspace does.
pub const CHANNEL: &str = "nightly-2026-05-20";

/// Components the GPU builds use: `rust-src` for `-Zbuild-std`,
/// `llvm-tools` for the bitcode route's `llc`/`ld.lld` and the static AMD
/// checks' `llvm-readobj`/`llvm-objdump`.
pub const COMPONENTS: &[&str] = &["rust-src", "llvm-tools"];

/// The AMD code object version written (ELF ABI version 3). LLVM 22's
/// default is v6, which older ROCm/DTK loaders reject.
pub const AMD_CODE_OBJECT_VERSION: u32 = 5;

/// The GPU profile, passed to the nested cargo as `--config` so that no
/// setting of the workspace's root manifest feeds the objects. Every key a
/// custom profile inherits from `release` is set.
pub const PROFILE: &[(&str, &str)] = &[
    ("inherits", "\"release\""),
    ("opt-level", "3"),
    ("lto", "\"fat\""),
    ("codegen-units", "1"),
    ("panic", "\"abort\""),
    ("debug", "false"),
    ("debug-assertions", "false"),
    ("overflow-checks", "false"),
    ("incremental", "false"),
    ("strip", "\"none\""),
    ("rpath", "false"),
];

/// Flags for the kernel crate only (not core / compiler_builtins, which
/// this setting breaks on AMDGPU): full unrolling of the fixed-trip row
/// loops keeps rows in registers (without it the affine LayerNorm spills
/// its row to local memory on NVPTX).
pub const KERNEL_FLAGS: &[&str] = &["-Cllvm-args=-unroll-threshold=1000"];

/// PTX performance directives for entry points whose register budget
/// decides their speed: (entry-name prefix, `.maxntid`: the threads per
/// workgroup they are launched with, `.minnctapersm`: the workgroups per SM
/// ptxas must fit). rustc has no way to attach NVVM launch bounds, so they
/// are written after the entry's parameter list. The window attention
/// without bounds took 176 registers (3 workgroups per SM); with 4 it was
/// 1.5x faster on the H200. The affine LayerNorm entries
/// take 64-68 registers with their refinement tiers: they are held to 56
/// in `LN_AFFINE_BLOCK`-thread workgroups (18 per SM), the 256-thread
/// ones to 64 (4 per SM); both measured faster than without bounds on the
/// H200. The 192-wide affine
/// add+LayerNorm, whose refinement is a real call on NVIDIA, is held to 32
/// (64 warps per SM), which measured about 4.5% faster there.
pub const PTX_LAUNCH_BOUNDS: &[(&str, u32, u32)] = &[
    (
        "wf_window_attention_",
        wavefuse_shared::geometry::ATTN_WAVES * 32,
        wavefuse_shared::geometry::ATTN_MIN_BLOCKS_SM,
    ),
    (
        "wf_layer_norm_affine_",
        wavefuse_shared::LN_AFFINE_BLOCK,
        wavefuse_shared::LN_AFFINE_MIN_BLOCKS_SM,
    ),
    (
        "wf_layer_norm_gather_affine_",
        wavefuse_shared::LN_AFFINE_BLOCK,
        wavefuse_shared::LN_AFFINE_MIN_BLOCKS_SM,
    ),
    (
        "wf_add_layer_norm_gather_affine_",
        wavefuse_shared::ROW_BLOCK,
        wavefuse_shared::ROW_AFFINE_MIN_BLOCKS_SM,
    ),
    (
        "wf_add_layer_norm_affine_192",
        wavefuse_shared::ADD_LN_AFFINE_192_BLOCK,
        wavefuse_shared::ADD_LN_AFFINE_192_MIN_BLOCKS_SM,
    ),
    (
        "wf_add_layer_norm_affine_768",
        wavefuse_shared::ROW_BLOCK,
        wavefuse_shared::ROW_AFFINE_MIN_BLOCKS_SM,
    ),
];

/// `ptx` with [`PTX_LAUNCH_BOUNDS`] applied to every matching entry point;
/// an error when a listed prefix matches no entry.
pub fn launch_bounds(ptx: &str) -> Result<String, String> {
    let mut out = String::with_capacity(ptx.len() + 256);
    let mut rest = ptx;
    let mut hits = vec![0usize; PTX_LAUNCH_BOUNDS.len()];
    while let Some(i) = rest.find(".entry ") {
        let (head, tail) = rest.split_at(i);
        out.push_str(head);
        let name_end = tail.find('(').ok_or("an .entry without a parameter list")?;
        let name = tail[".entry ".len()..name_end].trim();
        // The parameter list ends at the first `)` that starts a line.
        let close = tail
            .find("\n)")
            .ok_or("an .entry parameter list without `)`")?
            + 2;
        out.push_str(&tail[..close]);
        for (n, (prefix, threads, blocks)) in PTX_LAUNCH_BOUNDS.iter().enumerate() {
            if name.starts_with(prefix) {
                out.push_str(&format!(
                    "\n.maxntid {threads}, 1, 1\n.minnctapersm {blocks}"
                ));
                hits[n] += 1;
            }
        }
        rest = &tail[close..];
    }
    out.push_str(rest);
    match hits.iter().position(|&h| h == 0) {
        Some(n) => Err(format!(
            "no PTX entry point starts with {}",
            PTX_LAUNCH_BOUNDS[n].0
        )),
        None => Ok(out),
    }
}

/// Which kind of object a target produces.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Kind {
    /// An AMDGPU ELF code object linked by rustc's bundled rust-lld.
    AmdElf,
    /// NVIDIA PTX: the fat-LTO module emitted as assembly (no linker).
    Ptx,
}

/// One committed object.
#[derive(Clone, Copy, Debug)]
pub struct Object {
    /// The arch (`gfx90a`, `sm_90`): also the file stem under host/kernels.
    pub arch: &'static str,
    /// What is built.
    pub kind: Kind,
}

/// The committed objects, in manifest order.
pub const OBJECTS: &[Object] = &[
    Object {
        arch: "gfx908",
        kind: Kind::AmdElf,
    },
    Object {
        arch: "gfx90a",
        kind: Kind::AmdElf,
    },
    Object {
        arch: "gfx942",
        kind: Kind::AmdElf,
    },
    Object {
        arch: "sm_80",
        kind: Kind::Ptx,
    },
    Object {
        arch: "sm_90",
        kind: Kind::Ptx,
    },
];

impl Object {
    /// The file name under host/kernels.
    pub fn file(&self) -> String {
        match self.kind {
            Kind::AmdElf => format!("{}.elf", self.arch),
            Kind::Ptx => format!("{}.ptx", self.arch),
        }
    }

    /// The rustc target triple.
    pub fn triple(&self) -> &'static str {
        match self.kind {
            Kind::AmdElf => "amdgcn-amd-amdhsa",
            Kind::Ptx => "nvptx64-nvidia-cuda",
        }
    }

    /// Flags for every crate of the build (core and compiler_builtins too).
    pub fn rustflags(&self) -> Vec<String> {
        let mut f = vec![format!("-Ctarget-cpu={}", self.arch)];
        if self.arch == "sm_80" {
            // LLVM's default PTX ISA for sm_80 is 7.0; the cache-policy load
            // (`createpolicy`, `ld.global.L2::cache_hint`) needs 7.4, and
            // ptxas rejects the module without it.
            f.push("-Ctarget-feature=+ptx74".into());
        }
        if self.kind == Kind::AmdElf {
            f.push(format!(
                "-Cllvm-args=--amdhsa-code-object-version={AMD_CODE_OBJECT_VERSION}"
            ));
        }
        f
    }

    /// Flags for the kernel crate only.
    pub fn kernel_flags(&self) -> Vec<String> {
        let mut f: Vec<String> = KERNEL_FLAGS.iter().map(|s| s.to_string()).collect();
        if self.kind == Kind::Ptx {
            // The bitcode linker is not installable here: the fat-LTO module
            // emitted as assembly is the complete PTX, and `-Clinker=true`
            // turns the link step into a no-op.
            f.extend(["--emit=asm".to_string(), "-Clinker=true".to_string()]);
        }
        f
    }
}

/// The nested cargo's arguments shared by every object (before the
/// per-object `--target`/`--target-dir`).
pub fn cargo_args() -> Vec<String> {
    let mut a: Vec<String> = [
        "rustc",
        "--locked",
        "-p",
        "wavefuse-device",
        "--profile",
        "gpu",
        "-Zbuild-std=core",
        "--crate-type",
        "cdylib",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    for (k, v) in PROFILE {
        a.push("--config".into());
        a.push(format!("profile.gpu.{k}={v}"));
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A PTX module with one entry per bounded prefix (each with two
    /// parameters) and one entry without bounds.
    fn ptx() -> String {
        let mut p = String::from(".version 7.8\n");
        for (n, (prefix, ..)) in PTX_LAUNCH_BOUNDS.iter().enumerate() {
            p += &format!(
                ".visible .entry {prefix}x{n}(\n\t.param .u64 a,\n\t.param .f32 b\n)\n{{\n\tret;\n}}\n"
            );
        }
        p + ".visible .entry wf_gather_192(\n\t.param .u64 a\n)\n{\n\tret;\n}\n"
    }

    #[test]
    fn bounds_follow_the_matching_parameter_lists_only() {
        let ptx = ptx();
        let out = launch_bounds(&ptx).expect("bounds");
        let mut want = String::new();
        let mut rest = ptx.as_str();
        for (prefix, t, b) in PTX_LAUNCH_BOUNDS {
            let at = rest.find(prefix).expect("entry");
            let close = at + rest[at..].find("\n)\n").expect("params") + 3;
            want += &rest[..close];
            want += &format!(".maxntid {t}, 1, 1\n.minnctapersm {b}\n");
            rest = &rest[close..];
        }
        want += rest;
        assert_eq!(out, want);
        assert!(out.ends_with("wf_gather_192(\n\t.param .u64 a\n)\n{\n\tret;\n}\n"));
    }

    #[test]
    fn a_prefix_without_entries_is_an_error() {
        assert!(launch_bounds(".version 7.8\n").is_err());
    }
}
