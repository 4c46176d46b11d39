//! The HIP backend's no-device path through the public API. CI installs
//! Debian's libamdhip64 (ROCm 5.2) and sets WAVEFUSE_REQUIRE_HIP_LIB=1, so
//! this runs the real library's hipInit/hipGetDeviceCount on a machine with
//! no AMD GPU.
use wavefuse::{BackendKind, Choice, Device, Error};

#[test]
fn asking_for_hip_without_an_amd_gpu_is_a_clear_error() {
    match Device::open(Choice::Hip(0)) {
        Ok(d) => assert_eq!(
            d.info().backend,
            BackendKind::Hip,
            "a real AMD GPU is present"
        ),
        Err(Error::BackendUnavailable { backend, reason }) => {
            assert_eq!(backend, BackendKind::Hip);
            eprintln!("hip: {reason}");
            if std::env::var_os("WAVEFUSE_REQUIRE_HIP_LIB").is_some() {
                assert!(
                    reason.contains("no device"),
                    "libamdhip64 must load and report no device: {reason}"
                );
            } else {
                assert!(
                    reason.contains("no device") || reason.contains("not found"),
                    "{reason}"
                );
            }
        }
        // An AMD GPU whose architecture has no embedded code object (a
        // consumer card, or gfx936 without `cargo xtask amd-route`): the
        // device was found, and the error names its arch and the ones
        // built. Not a machine without an AMD GPU, so CI's setting refuses
        // it.
        Err(Error::NoCodeObject { arch, built, .. }) => {
            eprintln!("hip: an AMD GPU ({arch}) with no code object among {built:?}");
            assert!(
                std::env::var_os("WAVEFUSE_REQUIRE_HIP_LIB").is_none(),
                "expected a machine without an AMD GPU, found {arch}"
            );
            assert!(
                !arch.is_empty() && !built.contains(&arch),
                "{arch} {built:?}"
            );
        }
        Err(e) => panic!("unexpected error kind: {e}"),
    }
}

#[test]
fn auto_falls_back_to_a_working_backend() {
    let d = Device::open(Choice::Auto).expect("auto always finds the CPU emulator at least");
    eprintln!("auto picked {:?}: {}", d.info().backend, d.info().name);
    let x = d.upload(&[wavefuse::f16::ONE; 192]).expect("upload");
    assert_eq!(x.download().expect("download").len(), 192);
}

#[test]
fn choice_strings_parse() {
    assert_eq!(Choice::parse("hip:1"), Some(Choice::Hip(1)));
    assert_eq!(
        Choice::parse("cpu32"),
        Some(Choice::Cpu(wavefuse::Wave::W32))
    );
    assert_eq!(Choice::parse("auto"), Some(Choice::Auto));
    assert_eq!(Choice::parse("tpu"), None);
}
