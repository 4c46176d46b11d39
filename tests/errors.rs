//! The error variants the per-op reject tables do not reach: each made to
//! happen through the public API where the API can produce it, and what it
//! says. (The per-op tables cover UnsupportedWidth, RaggedRows,
//! LengthMismatch, Misaligned, BadParameter, WrongDevice and Aliasing;
//! `tests/engine.rs` ForeignSpan and ForeignStream; `tests/hip_no_device.rs`
//! and the HIP unit tests BackendUnavailable and a driver error's code;
//! the `objects` unit tests NoCodeObject.)
mod common;

use common::cpu;
use half::f16;
use wavefuse::{
    Choice, Device, Error, GeluBias, GeluMode, View, ViewMut, Wave, bias_gelu, layer_norm,
};

/// A launch with more threads than HIP's 32-bit count, or more elements
/// than a kernel's 32-bit index, is `TooLarge` before any launch. The
/// spans are described, never touched: the emulator's foreign views over
/// a small host buffer with a huge length (the check rejects the shape
/// before any element is read), so no memory of that size is needed.
#[test]
fn too_large_before_any_launch() {
    let dev = cpu();
    let backing = vec![0u128; 64];
    let p = backing.as_ptr() as u64;
    // LayerNorm at width 192: 32 rows per 256-thread workgroup, so 2^29
    // rows need 2^32 threads.
    let rows = 1usize << 29;
    // SAFETY: the op must reject the shape before reading or writing; no
    // element of these spans is accessed (the test fails otherwise, most
    // likely by crashing).
    let (x, mut y) = unsafe {
        (
            View::<f16>::from_raw(&dev, p, rows * 192).expect("view"),
            ViewMut::<f16>::from_raw(&dev, p + (1 << 40), rows * 192).expect("view"),
        )
    };
    let e = layer_norm(&dev, &x, &mut y, 192, None, 1e-5).unwrap_err();
    assert!(
        matches!(e, Error::TooLarge { op: "layer_norm", rows: r, .. } if r == rows),
        "{e}"
    );
    assert!(e.to_string().contains("over the launch limit"), "{e}");
    // bias + GELU indexes elements in 32 bits: 2^32 + 8 of them.
    let n = (1usize << 32) + 8;
    // SAFETY: as above.
    let (x, b, mut y) = unsafe {
        (
            View::<f16>::from_raw(&dev, p, n).expect("view"),
            View::<f16>::from_raw(&dev, p, 8).expect("view"),
            ViewMut::<f16>::from_raw(&dev, p + (1 << 41), n).expect("view"),
        )
    };
    let e = bias_gelu(&dev, &x, GeluBias::F16(&b), &mut y, 8, GeluMode::Erf).unwrap_err();
    assert!(
        matches!(
            e,
            Error::TooLarge {
                op: "bias_gelu",
                ..
            }
        ),
        "{e}"
    );
}

/// A backend call that fails is `Driver` with the call, the code and the
/// backend's words (the emulator's allocator here; the GPU backends keep
/// the `CUresult` / `hipError_t`).
#[test]
fn driver_error_names_the_call() {
    let dev = Device::open(Choice::Cpu(Wave::W64)).expect("emulator");
    let e = dev.alloc::<f32>(usize::MAX / 8).unwrap_err();
    match &e {
        Error::Driver {
            backend,
            call,
            code,
            ..
        } => {
            assert_eq!(*backend, wavefuse::BackendKind::Cpu);
            assert_eq!(*call, "alloc");
            assert_eq!(*code, -1);
        }
        other => panic!("expected Driver, got {other}"),
    }
    assert!(e.to_string().starts_with("Cpu call alloc failed"), "{e}");
    // The byte count itself overflowing is a parameter error, not a call.
    let e = dev.alloc::<f32>(usize::MAX / 2).unwrap_err();
    assert!(matches!(e, Error::BadParameter { what: "len", .. }), "{e}");
}

/// The emulator's own findings (a partial collective, a trap) reach the
/// caller as `Emulator`. The public API's checks keep every shipped kernel
/// from producing one, so this checks the conversion and its message.
#[test]
fn emulator_findings_convert() {
    let found = wavefuse_device::emu::EmuError::BadConfig("block of 0 threads");
    let e = Error::from(found);
    assert!(matches!(e, Error::Emulator(_)));
    assert_eq!(
        e.to_string(),
        "emulator: bad launch configuration: block of 0 threads"
    );
}

/// Events of two devices cannot be compared: `elapsed_ms` says which
/// argument is of another device instead of mixing handles.
#[test]
fn event_of_another_device_is_rejected() {
    let a = Device::open(Choice::Cpu(Wave::W64)).expect("emulator");
    let b = Device::open(Choice::Cpu(Wave::W64)).expect("emulator");
    let (ea, eb) = (a.record().expect("record"), b.record().expect("record"));
    let e = eb.elapsed_ms(&ea).unwrap_err();
    assert!(
        matches!(
            e,
            Error::WrongDevice {
                op: "Event::elapsed_ms",
                what: "start"
            }
        ),
        "{e}"
    );
    let later = a.record().expect("record");
    assert!(later.elapsed_ms(&ea).expect("same device") >= 0.0);
    // A stream waits only for events of its own device.
    let e = b.stream().wait(&ea).unwrap_err();
    assert!(matches!(e, Error::WrongDevice { what: "event", .. }), "{e}");
}

/// `Choice::Auto` that falls back to the emulator says why each GPU
/// backend did not open (a machine with a GPU skips nothing).
#[test]
fn auto_keeps_why_gpus_did_not_open() {
    let dev = Device::open(Choice::Auto).expect("auto");
    let info = dev.info();
    if info.backend == wavefuse::BackendKind::Cpu {
        let kinds: Vec<_> = info.skipped.iter().map(|(k, _)| *k).collect();
        assert_eq!(
            kinds,
            [wavefuse::BackendKind::Cuda, wavefuse::BackendKind::Hip],
            "{:?}",
            info.skipped
        );
        assert!(info.skipped.iter().all(|(_, why)| !why.is_empty()));
    } else {
        assert!(info.skipped.len() < 2, "{:?}", info.skipped);
    }
}
