//! A reduced-depth trunk (depths 2/2/2/2, both block orders' blocks as the
//! released weights have them: post-norm, level and latitude mask) against
//! an f64 oracle composed of independent parts: the stage oracle's blocks
//! per layer, the downsample and upsample oracles, and the skip concat
//! with layer 0's output first. In f32 (candle), and in f16 with both
//! builds (wavefuse on the emulator). A skip concatenated the wrong way
//! round fails the same comparison.
mod oracle;

use candle_core::{DType, Device, Tensor};
use pangu::config::{BlockOrder, Depths, Geometry};
use pangu::model::{Build, Faults, Options};
use pangu::stage::WavefuseOps;
use pangu::trunk::Trunk;
use pangu::weights::{self, Meta, Weights};

const LAT: usize = 25;
const LON: usize = 96;
const DEPTHS: Depths = Depths([2, 2, 2, 2]);

fn weights(g: &Geometry, seed: u64) -> Weights {
    let dir = std::env::temp_dir().join(format!("pangu-trunk-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("trunk-{seed}.safetensors"));
    let meta = Meta {
        order: BlockOrder::Post,
        interval_hours: Some(24),
        grid: Some((LAT, LON)),
        depths: DEPTHS,
        width: 192,
    };
    weights::write_file(&path, &weights::seeded_tensors(g, &meta, seed), &meta).unwrap();
    let w = Weights::read(&path, g).unwrap();
    let _ = std::fs::remove_file(&path);
    w
}

fn f64s(t: &Tensor) -> Vec<f64> {
    t.to_dtype(DType::F64)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap()
}

fn run(w: &Weights, g: &Geometry, x: &[f64], opts: Options) -> Vec<f64> {
    let dev = Device::Cpu;
    let trunk = Trunk::load(w, *g, &dev, opts).unwrap();
    let xt = Tensor::from_slice(x, (g.n1(), 192), &dev)
        .unwrap()
        .to_dtype(opts.dtype)
        .unwrap();
    let y = trunk.forward(xt.clone(), &WavefuseOps::new()).unwrap();
    assert_eq!(y.dims(), &[g.n1(), 384]);
    f64s(&y)
}

/// Fresh tokens in `+-2`, rounded to f16 so every build reads the same.
fn tokens(n: usize, seed: u64) -> Vec<f64> {
    let mut s = seed.max(1);
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let u = (s >> 11) as f64 / (1u64 << 53) as f64;
            half::f16::from_f64(4.0 * u - 2.0).to_f64()
        })
        .collect()
}

#[test]
fn reduced_depth_trunk_matches_f64_oracle() {
    let g = Geometry::new(LAT, LON).unwrap();
    for (wseed, xseed) in [(3u64, 17u64), (4, 18)] {
        let w = weights(&g, wseed);
        let x = tokens(g.n1() * 192, xseed);
        let want = oracle::trunk(&w, &g, DEPTHS, &x);
        assert_eq!(want.len(), g.n1() * 384);
        let out_rms = (want.iter().map(|v| v * v).sum::<f64>() / want.len() as f64).sqrt();
        let f32 = oracle::errors(
            &run(&w, &g, &x, Options::new(Build::Candle, DType::F32)),
            &want,
        );
        let c16 = oracle::errors(
            &run(&w, &g, &x, Options::new(Build::Candle, DType::F16)),
            &want,
        );
        let w16 = oracle::errors(
            &run(&w, &g, &x, Options::new(Build::Wavefuse, DType::F16)),
            &want,
        );
        eprintln!(
            "trunk 2/2/2/2 seed {wseed} (output rms {out_rms:.3}): candle f32 max {:.2e} rms {:.2e}; \
             candle f16 max {:.4} rms {:.5}; wavefuse f16 max {:.4} rms {:.5}",
            f32.0, f32.1, c16.0, c16.1, w16.0, w16.1
        );
        assert!(f32.0 < F32_MAX, "candle f32 {f32:?}");
        assert!(c16.0 < F16_MAX && c16.1 < F16_RMS, "candle f16 {c16:?}");
        assert!(w16.0 < WF_MAX && w16.1 < WF_RMS, "wavefuse f16 {w16:?}");
        let mut swapped = Options::new(Build::Candle, DType::F32);
        swapped.faults = Faults {
            swap_skip: true,
            ..Faults::default()
        };
        let bad = oracle::errors(&run(&w, &g, &x, swapped), &want);
        assert!(
            bad.0 > 100.0 * F32_MAX,
            "a swapped skip went unnoticed: {bad:?}"
        );
    }
}

// Outputs have RMS ~2.2 (the skip's two post-norm layers). Measured on the
// CPU (weight seeds 3, 4): candle f32 max 6.6e-6-7.4e-6; candle f16 max
// 0.022-0.023, RMS 3.8e-3-4.0e-3; wavefuse f16 max 0.014-0.016, RMS
// 2.2e-3-2.3e-3. Tolerances about 2.5x max and 2x RMS; a swapped skip is
// off by O(10).
const F32_MAX: f64 = 1e-4;
const F16_MAX: f64 = 0.06;
const F16_RMS: f64 = 0.008;
const WF_MAX: f64 = 0.04;
const WF_RMS: f64 = 0.005;

/// A weight file's tensors: name, shape, values.
type Tensors = Vec<(String, Vec<usize>, Vec<f32>)>;

/// A weight file with a layer tensor missing, misshaped, or one the depths
/// do not have is refused when read, naming the tensor (and the shapes).
#[test]
fn bad_layer_tensors_are_named() {
    let g = Geometry::new(LAT, LON).unwrap();
    let dir = std::env::temp_dir().join(format!("pangu-trunk-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let meta = Meta {
        order: BlockOrder::Post,
        interval_hours: Some(24),
        grid: Some((LAT, LON)),
        depths: DEPTHS,
        width: 192,
    };
    let base = meta.clone();
    let read_with = |edit: &dyn Fn(&mut Tensors), meta: &Meta| {
        let mut t = weights::seeded_tensors(&g, &base, 1);
        edit(&mut t);
        let path = dir.join("bad.safetensors");
        weights::write_file(&path, &t, meta).unwrap();
        let e = Weights::read(&path, &g).unwrap_err().to_string();
        let _ = std::fs::remove_file(&path);
        e
    };
    let name = "layers.2.blocks.1.mlp.fc1.weight";
    let e = read_with(&|t| t.retain(|(n, _, _)| n != name), &meta);
    assert!(e.contains(name), "{e}");
    let e = read_with(
        &|t| {
            for (n, s, v) in t.iter_mut() {
                if n == name {
                    *s = vec![384, 1536];
                    v.truncate(384 * 1536);
                }
            }
        },
        &meta,
    );
    assert!(
        e.contains(name) && e.contains("[384, 1536]") && e.contains("[1536, 384]"),
        "{e}"
    );
    // The file holds 2 blocks in layer 1; metadata claiming 3 names the
    // first block it lacks.
    let three = Meta {
        depths: Depths([2, 3, 2, 2]),
        ..meta.clone()
    };
    let e = read_with(&|_| {}, &three);
    assert!(e.contains("layers.1.blocks.2."), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}
