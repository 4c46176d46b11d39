//! Embedded code objects (the committed `host/kernels/`, listed by build.rs)
//! and picking one for a device.
use crate::Error;

include!(concat!(env!("OUT_DIR"), "/objects.rs"));

/// The ELF for a HIP device's `gcnArchName` (`gfx90a:sramecc+:xnack-`).
pub fn amd_for(gcn_arch_name: &str) -> Result<(&'static str, &'static [u8]), Error> {
    let base = gcn_arch_name.split(':').next().unwrap_or(gcn_arch_name);
    AMD.iter()
        .find(|(a, _)| *a == base)
        .map(|(a, b)| (*a, *b))
        .ok_or_else(|| Error::NoCodeObject {
            arch: base.to_string(),
            built: AMD.iter().map(|(a, _)| a.to_string()).collect(),
            hint: "; WAVEFUSE_AMD_ARCHS may have left it out at build time; an arch rustc's LLVM does not know (Hygon gfx936) is built by `cargo xtask amd-route` and embedded with WAVEFUSE_AMD_EXTRA (README: Hygon gfx936)",
        })
}

/// The newest PTX whose target is not above the device's compute
/// capability; with `WAVEFUSE_PTX_ARCH=sm_NN` set at run time, that one
/// (when embedded and not above the device): a newer GPU runs an older
/// target's PTX through the driver's compiler, which is how the sm_80
/// objects are tested on an sm_90 device.
pub fn ptx_for(major: i32, minor: i32) -> Result<(&'static str, &'static str), Error> {
    ptx_among(
        major,
        minor,
        std::env::var("WAVEFUSE_PTX_ARCH").ok().as_deref(),
    )
}

fn ptx_among(
    major: i32,
    minor: i32,
    only: Option<&str>,
) -> Result<(&'static str, &'static str), Error> {
    let cc = (major * 10 + minor) as u32;
    PTX.iter()
        .filter(|(a, _)| only.is_none_or(|o| o == *a))
        .filter_map(|(a, p)| {
            a.strip_prefix("sm_")
                .and_then(|n| n.parse::<u32>().ok())
                .map(|n| (n, *a, *p))
        })
        .filter(|(n, _, _)| *n <= cc)
        .max_by_key(|(n, _, _)| *n)
        .map(|(_, a, p)| (a, p))
        .ok_or_else(|| Error::NoCodeObject {
            arch: format!("sm_{cc}"),
            built: PTX.iter().map(|(a, _)| a.to_string()).collect(),
            hint: "; WAVEFUSE_PTX_ARCHS may have left it out at build time; the committed targets are listed in xtask/src/recipe.rs",
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_newest_ptx_not_above_device() {
        if PTX.iter().any(|(a, _)| *a == "sm_90") {
            assert_eq!(ptx_for(9, 0).map(|p| p.0).ok(), Some("sm_90"));
        }
        if PTX.iter().any(|(a, _)| *a == "sm_80") {
            assert_eq!(ptx_for(8, 6).map(|p| p.0).ok(), Some("sm_80"));
        }
        assert!(matches!(ptx_for(5, 0), Err(Error::NoCodeObject { .. })));
        if PTX.iter().any(|(a, _)| *a == "sm_80") {
            assert_eq!(
                ptx_among(9, 0, Some("sm_80")).map(|p| p.0).ok(),
                Some("sm_80")
            );
        }
        assert!(ptx_among(9, 0, Some("sm_75")).is_err());
        assert!(ptx_among(8, 0, Some("sm_90")).is_err());
    }

    #[test]
    fn amd_error_names_arch_and_built() {
        match amd_for("gfx936:sramecc+:xnack-") {
            Err(Error::NoCodeObject { arch, built, .. }) => {
                assert_eq!(arch, "gfx936");
                assert_eq!(built.len(), AMD.len());
            }
            other => panic!("expected NoCodeObject, got {:?}", other.map(|o| o.0)),
        }
        if let Some((a, _)) = AMD.first() {
            assert_eq!(
                amd_for(&format!("{a}:sramecc+:xnack-")).map(|o| o.0).ok(),
                Some(*a)
            );
        }
    }
}
