//! The whole network at the reduced grid (25 x 96: latitude padded at the
//! patch, both window scales and the odd 2 x 2 merge) against the PyTorch
//! reference's f64 output (`tests/data/pangu`, written by
//! `benches/pangu_model.py fixture`), in both block orders, with the
//! seeded weights both sides generate. A wrongly wired network (skip
//! concatenated the wrong way round, odd blocks unshifted) must fail the
//! same comparison.
use candle_core::{DType, Device, Tensor};
use pangu::config::{BlockOrder, Depths, Geometry};
use pangu::fields::{self, Kind};
use pangu::model::{Build, Faults, Options, Pangu};
use pangu::weights::{self, Meta, Weights};
use std::path::PathBuf;

const LAT: usize = 25;
const LON: usize = 96;
const SEED: u64 = 1;

fn data(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/data/pangu")
        .join(name)
}

fn weights(order: BlockOrder) -> Weights {
    let g = Geometry::new(LAT, LON).unwrap();
    let dir = std::env::temp_dir().join(format!("pangu-model-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // One file per call: the tests run in parallel and each removes its
    // own file once read.
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = dir.join(format!("{}-{n}.safetensors", order.name()));
    let meta = Meta {
        order,
        interval_hours: Some(24),
        grid: Some((LAT, LON)),
        depths: Depths::RELEASED,
        width: 192,
    };
    weights::write_file(&path, &weights::seeded_tensors(&g, &meta, SEED), &meta).unwrap();
    let w = Weights::read(&path, &g).unwrap();
    let _ = std::fs::remove_file(&path);
    w
}

/// Per channel, max |rust - torch| in units of the channel's std; the
/// largest over the 69 channels.
fn worst(rust: &Tensor, torch: &[f32], std: &[f64]) -> f64 {
    let r: Vec<f64> = rust
        .to_dtype(DType::F64)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap();
    assert_eq!(r.len(), torch.len());
    let plane = LAT * LON;
    let mut worst: f64 = 0.0;
    for (c, s) in std.iter().enumerate() {
        for i in c * plane..(c + 1) * plane {
            let d = (r[i] - f64::from(torch[i])).abs() / s;
            assert!(d.is_finite(), "channel {c}: non-finite output");
            worst = worst.max(d);
        }
    }
    worst
}

/// Per channel, the RMS of `rust - torch` in units of the channel's std;
/// the largest over the channels.
fn worst_rms(rust: &Tensor, torch: &[f32], std: &[f64]) -> f64 {
    let r: Vec<f64> = rust
        .to_dtype(DType::F64)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap();
    assert_eq!(r.len(), torch.len());
    let plane = LAT * LON;
    std.iter()
        .enumerate()
        .map(|(c, s)| {
            let sq: f64 = (c * plane..(c + 1) * plane)
                .map(|i| (r[i] - f64::from(torch[i])).powi(2))
                .sum();
            (sq / plane as f64).sqrt() / s
        })
        .fold(0.0, f64::max)
}

/// Max and RMS (worst channel, in channel stds) of a network against the
/// f64 reference: `[(upper max, surface max), (upper rms, surface rms)]`.
fn errors(order: BlockOrder, opts: Options) -> [(f64, f64); 2] {
    let (yu, ys, want_u, want_s) = outputs(order, opts);
    let [(_, _), (_, ustd), (_, _), (_, sstd)] = weights::statistics();
    [
        (worst(&yu, &want_u, &ustd), worst(&ys, &want_s, &sstd)),
        (
            worst_rms(&yu, &want_u, &ustd),
            worst_rms(&ys, &want_s, &sstd),
        ),
    ]
}

fn run(order: BlockOrder, opts: Options) -> (f64, f64) {
    errors(order, opts)[0]
}

fn outputs(order: BlockOrder, opts: Options) -> (Tensor, Tensor, Vec<f32>, Vec<f32>) {
    let w = weights(order);
    let g = Geometry::new(LAT, LON).unwrap();
    let dev = Device::Cpu;
    let m = Pangu::load(&w, g, &dev, opts).unwrap();
    let fd = m.field_dtype();
    let up = fields::read(&data("input_upper.npy"), Kind::Upper, "upper").unwrap();
    let sf = fields::read(&data("input_surface.npy"), Kind::Surface, "surface").unwrap();
    let u = Tensor::from_slice(&up.data, up.shape.as_slice(), &dev)
        .unwrap()
        .to_dtype(fd)
        .unwrap();
    let s = Tensor::from_slice(&sf.data, sf.shape.as_slice(), &dev)
        .unwrap()
        .to_dtype(fd)
        .unwrap();
    let (yu, ys) = m.forward(&u, &s).unwrap();
    let want_u = fields::read(
        &data(&format!("{}_upper.npy", order.name())),
        Kind::Upper,
        "ref",
    )
    .unwrap();
    let want_s = fields::read(
        &data(&format!("{}_surface.npy", order.name())),
        Kind::Surface,
        "ref",
    )
    .unwrap();
    (yu, ys, want_u.data, want_s.data)
}

/// f64 network vs PyTorch's f64 (stored as f32): agreement to f32
/// rounding of the physical fields.
const TOL: f64 = 1e-4;

#[test]
fn inputs_are_the_seeded_fields() {
    let g = Geometry::new(LAT, LON).unwrap();
    let (u, s) = weights::seeded_inputs(&g, SEED);
    let up = fields::read(&data("input_upper.npy"), Kind::Upper, "upper").unwrap();
    let sf = fields::read(&data("input_surface.npy"), Kind::Surface, "surface").unwrap();
    // Bit for bit: the Rust and Python generators agree.
    assert!(
        u.iter()
            .zip(&up.data)
            .all(|(a, b)| a.to_bits() == b.to_bits())
    );
    assert!(
        s.iter()
            .zip(&sf.data)
            .all(|(a, b)| a.to_bits() == b.to_bits())
    );
}

#[test]
fn post_norm_matches_pytorch() {
    let (u, s) = run(BlockOrder::Post, Options::new(Build::Candle, DType::F64));
    assert!(
        u < TOL && s < TOL,
        "upper {u:e}, surface {s:e} channel stds"
    );
}

#[test]
fn pre_norm_matches_pytorch() {
    // f32: candle-nn's fused LayerNorm (the pre-norm build's) has no f64
    // kernel.
    let (u, s) = run(BlockOrder::Pre, Options::new(Build::Candle, DType::F32));
    assert!(
        u < 1e-3 && s < 1e-3,
        "upper {u:e}, surface {s:e} channel stds"
    );
}

#[test]
fn f32_network_matches_pytorch() {
    let (u, s) = run(BlockOrder::Post, Options::new(Build::Candle, DType::F32));
    assert!(
        u < 1e-3 && s < 1e-3,
        "upper {u:e}, surface {s:e} channel stds"
    );
}

#[test]
fn wrong_wiring_fails_the_comparison() {
    for faults in [
        Faults {
            swap_skip: true,
            ..Faults::default()
        },
        Faults {
            no_shift: true,
            ..Faults::default()
        },
    ] {
        let mut opts = Options::new(Build::Candle, DType::F64);
        opts.faults = faults;
        let (u, s) = run(BlockOrder::Post, opts);
        assert!(
            u.max(s) > 100.0 * TOL,
            "{faults:?} went unnoticed: {u:e} {s:e}"
        );
    }
}

/// The f16 networks against the f64 reference: the wavefuse build (fused
/// kernels on the CPU emulator) and candle's own f16 ops, which round like
/// a framework's f16 eager model. The wavefuse build must be as close to
/// the reference as the candle f16 build.
#[test]
fn f16_builds_match_pytorch() {
    let c = errors(BlockOrder::Post, Options::new(Build::Candle, DType::F16));
    let w = errors(BlockOrder::Post, Options::new(Build::Wavefuse, DType::F16));
    eprintln!(
        "candle f16: max {:?} rms {:?}; wavefuse f16: max {:?} rms {:?}",
        c[0], c[1], w[0], w[1]
    );
    // Measured (channel stds, worst channel, upper / surface): candle f16
    // max 1.2e-2 / 9.3e-3, RMS 2.7e-3 / 2.4e-3; wavefuse f16 max 6.6e-3 /
    // 6.2e-3, RMS 1.6e-3 / 1.5e-3. A wiring fault (a merge or split table
    // off by one part) costs O(1).
    for (i, bound) in [(0, 0.05), (1, 0.01)] {
        let (cu, cs) = c[i];
        let (wu, ws) = w[i];
        assert!(cu.max(cs) < bound, "candle f16 {:?}", c);
        assert!(
            wu <= 1.2 * cu && ws <= 1.2 * cs,
            "wavefuse {:?} vs candle {:?}",
            w,
            c
        );
    }
}

/// The wavefuse build's MLP chunking (rows cut into chunks that each run
/// the MLP half and write their sums back over their rows) changes the
/// peak memory, never the output: every chunk count, a ragged last chunk
/// included, gives the unchunked network's bits.
#[test]
fn mlp_chunks_leave_the_output_bit_for_bit() {
    let with = |chunks: usize| {
        let opts = Options {
            mlp_chunks: chunks,
            ..Options::new(Build::Wavefuse, DType::F16)
        };
        let (yu, ys, _, _) = outputs(BlockOrder::Post, opts);
        let bits = |t: &Tensor| -> Vec<u32> {
            t.to_dtype(DType::F32)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap()
                .iter()
                .map(|v| v.to_bits())
                .collect()
        };
        (bits(&yu), bits(&ys))
    };
    let whole = with(1);
    // 25 x 96: 1344 first-scale rows (4 chunks: 3 x 384 + 192; 3 chunks:
    // 2 x 512 + 320) and 384 second-scale rows (3 x 128).
    for chunks in [3, 4] {
        assert!(with(chunks) == whole, "{chunks} chunks change the output");
    }
}
