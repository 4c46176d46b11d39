//! The whole network at a reduced grid and depth (and, in the candle
//! build, a reduced width) against the f64 oracle
//! (`oracle::network`: embedding and recovery written point by point from
//! the convolutions' definitions, the trunk from the stage, downsample and
//! upsample oracles), independent of the PyTorch fixture. The grid, 9 x 96,
//! is the smallest that exercises every pad and crop: latitude 9 -> 12 for
//! the patches and back, levels 13 -> 14 and back, h1 = 3 -> 4 for the
//! downsample and back, and both scales' windows padded in latitude.
//!
//! Four wiring mistakes of the embedding and recovery each fail the f32
//! comparison by orders of magnitude: the surface slab last, the upper-air
//! patch features transposed, the crop one row late, the statistics in
//! reversed level order.
mod oracle;

use candle_core::{DType, Device, Tensor};
use pangu::config::{BlockOrder, Depths, Geometry};
use pangu::model::{Build, Faults, Options, Pangu};
use pangu::weights::{self, Meta, Weights};
use std::sync::OnceLock;

const LAT: usize = 9;
const LON: usize = 96;
const DEPTHS: Depths = Depths([2, 2, 2, 2]);
const SEED: u64 = 5;

struct Case {
    g: Geometry,
    w: Weights,
    upper: Vec<f32>,
    surface: Vec<f32>,
    want: (Vec<f64>, Vec<f64>),
}

/// The weights, inputs and the oracle's output at the released width,
/// computed once.
fn case() -> &'static Case {
    static CASE: OnceLock<Case> = OnceLock::new();
    CASE.get_or_init(|| make_case(192, false))
}

/// The same at width 32 (one head at the first scale, two at the
/// second), which only the candle build runs.
fn narrow_case() -> &'static Case {
    static CASE: OnceLock<Case> = OnceLock::new();
    CASE.get_or_init(|| make_case(32, false))
}

/// `width`; with `per_position`, the recovery biases are one per patch
/// position (`[160]`, `[64]`, as in the released files), each its own
/// value.
fn make_case(width: usize, per_position: bool) -> Case {
    let g = Geometry::new(LAT, LON).unwrap();
    let dir = std::env::temp_dir().join(format!(
        "pangu-network-test-{}-{width}-{per_position}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("w.safetensors");
    let meta = Meta {
        order: BlockOrder::Post,
        interval_hours: Some(24),
        grid: Some((LAT, LON)),
        depths: DEPTHS,
        width,
    };
    let mut t = weights::seeded_tensors(&g, &meta, SEED);
    if per_position {
        for (name, shape, v) in t.iter_mut() {
            let n = match name.as_str() {
                "patch_recovery.conv.bias" => 160,
                "patch_recovery.conv_surface.bias" => 64,
                _ => continue,
            };
            *shape = vec![n];
            *v = (0..n)
                .map(|i| 0.05 * ((i * 37 % 11) as f32 - 5.0))
                .collect();
        }
    }
    weights::write_file(&path, &t, &meta).unwrap();
    let w = Weights::read(&path, &g).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let (upper, surface) = weights::seeded_inputs(&g, SEED + 1);
    let up64: Vec<f64> = upper.iter().map(|&x| f64::from(x)).collect();
    let sf64: Vec<f64> = surface.iter().map(|&x| f64::from(x)).collect();
    let want = oracle::network(&w, &g, DEPTHS, &up64, &sf64);
    Case {
        g,
        w,
        upper,
        surface,
        want,
    }
}

fn run(c: &Case, opts: Options) -> (Vec<f64>, Vec<f64>) {
    let dev = Device::Cpu;
    let m = Pangu::load(&c.w, c.g, &dev, opts).unwrap();
    let fd = m.field_dtype();
    let u = Tensor::from_slice(&c.upper, (5, 13, LAT, LON), &dev)
        .unwrap()
        .to_dtype(fd)
        .unwrap();
    let s = Tensor::from_slice(&c.surface, (4, LAT, LON), &dev)
        .unwrap()
        .to_dtype(fd)
        .unwrap();
    let (yu, ys) = m.forward(&u, &s).unwrap();
    let f64s = |t: &Tensor| -> Vec<f64> {
        t.to_dtype(DType::F64)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap()
    };
    (f64s(&yu), f64s(&ys))
}

/// Worst max and worst RMS error over the 69 output channels, each in
/// units of its channel's statistic std (the scale the network works in).
fn channel_errors(c: &Case, got: &(Vec<f64>, Vec<f64>)) -> (f64, f64) {
    let us = oracle::v(&c.w, "upper_std");
    let ss = oracle::v(&c.w, "surface_std");
    let plane = LAT * LON;
    let mut worst = (0.0f64, 0.0f64);
    let chans = (0..65)
        .map(|k| (&got.0, &c.want.0, k, us[k]))
        .chain((0..4).map(|k| (&got.1, &c.want.1, k, ss[k])));
    for (g, w, k, std) in chans {
        let (max, rms) = oracle::errors(&g[k * plane..][..plane], &w[k * plane..][..plane]);
        worst = (worst.0.max(max / std), worst.1.max(rms / std));
    }
    worst
}

#[test]
fn f32_network_matches_f64_oracle() {
    let c = case();
    let e = channel_errors(c, &run(c, Options::new(Build::Candle, DType::F32)));
    eprintln!(
        "candle f32 vs f64 oracle: worst channel max {:.2e}, rms {:.2e} (std units)",
        e.0, e.1
    );
    assert!(e.0 < F32_MAX, "candle f32 {e:?}");
}

#[test]
fn narrow_f32_network_matches_f64_oracle() {
    let c = narrow_case();
    let e = channel_errors(c, &run(c, Options::new(Build::Candle, DType::F32)));
    eprintln!(
        "width 32, candle f32 vs f64 oracle: worst channel max {:.2e}, rms {:.2e}",
        e.0, e.1
    );
    assert!(e.0 < F32_MAX, "candle f32 at width 32 {e:?}");
    // The wavefuse build runs the released widths only, and says so
    // before building anything.
    let e = Pangu::load(
        &c.w,
        c.g,
        &Device::Cpu,
        Options::new(Build::Wavefuse, DType::F16),
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("width") && e.contains("32") && e.contains("192"),
        "{e}"
    );
}

#[test]
fn per_position_recovery_biases_match_the_oracle() {
    let c = make_case(32, true);
    assert_eq!(c.w.get("patch_recovery.conv.bias").unwrap().dims(), [160]);
    let e = channel_errors(&c, &run(&c, Options::new(Build::Candle, DType::F32)));
    eprintln!(
        "per-position recovery biases, candle f32 vs f64 oracle: worst channel max {:.2e}",
        e.0
    );
    assert!(e.0 < F32_MAX, "{e:?}");
}

#[test]
fn f16_builds_match_f64_oracle() {
    let c = case();
    let c16 = channel_errors(c, &run(c, Options::new(Build::Candle, DType::F16)));
    let w16 = channel_errors(c, &run(c, Options::new(Build::Wavefuse, DType::F16)));
    eprintln!(
        "vs f64 oracle (std units): candle f16 max {:.2e} rms {:.2e}; wavefuse f16 max {:.2e} rms {:.2e}",
        c16.0, c16.1, w16.0, w16.1
    );
    assert!(c16.0 < F16_MAX && c16.1 < F16_RMS, "candle f16 {c16:?}");
    assert!(w16.0 < F16_MAX && w16.1 < F16_RMS, "wavefuse f16 {w16:?}");
}

#[test]
fn embedding_and_recovery_mistakes_fail_the_comparison() {
    let c = case();
    let faults = [
        Faults {
            surface_last: true,
            ..Faults::default()
        },
        Faults {
            patch_transposed: true,
            ..Faults::default()
        },
        Faults {
            crop_late: true,
            ..Faults::default()
        },
        Faults {
            levels_reversed: true,
            ..Faults::default()
        },
    ];
    for f in faults {
        let mut opts = Options::new(Build::Candle, DType::F32);
        opts.faults = f;
        let e = channel_errors(c, &run(c, opts));
        eprintln!("{f:?}: worst channel max {:.3e}", e.0);
        assert!(e.0 > 100.0 * F32_MAX, "{f:?} went unnoticed: {e:?}");
    }
}

// Tolerances in channel-std units. Measured on the CPU (seed 5): candle
// f32 max 9.8e-6; candle f16 max 9.8e-3, RMS 2.4e-3; wavefuse f16 (the
// emulator) max 6.1e-3, RMS 1.8e-3. The four wiring mistakes are off by
// 2.4 to 7e4.
const F32_MAX: f64 = 1e-4;
const F16_MAX: f64 = 0.03;
const F16_RMS: f64 = 0.006;
