//! Downsample and upsample of both builds against an f64 oracle written
//! from the definitions (merge order `(dy, dx)`, zero tokens past the last
//! latitude, split and crop, LayerNorm with affine, bias-less Linears), at
//! a grid whose first scale has an odd latitude count (25 x 96: h1 = 7, so
//! the merge reads one row of padding and the split drops one row), and
//! the merge and split gathers as inverse token moves.
mod oracle;

use candle_core::{DType, Device, Tensor};
use pangu::config::Geometry;
use pangu::downsample::{Downsample, merge_table};
use pangu::model::Build;
use pangu::stage::{Affine, WavefuseOps};
use pangu::upsample::{Upsample, split_table};
use wavefuse_candle::Plan;

const LAT: usize = 25;
const LON: usize = 96;

/// xorshift64*: uniform values in `center +- a`, rounded to f16 (so every
/// build reads the same inputs).
struct Rng(u64);

impl Rng {
    fn vals(&mut self, n: usize, center: f64, a: f64) -> Vec<f64> {
        (0..n)
            .map(|_| {
                self.0 ^= self.0 >> 12;
                self.0 ^= self.0 << 25;
                self.0 ^= self.0 >> 27;
                let u =
                    (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64;
                half::f16::from_f64(center + a * (2.0 * u - 1.0)).to_f64()
            })
            .collect()
    }
}

fn tensor(v: &[f64], dims: &[usize], dtype: DType) -> Tensor {
    Tensor::from_slice(v, dims, &Device::Cpu)
        .unwrap()
        .to_dtype(dtype)
        .unwrap()
}

fn to64(x: &Tensor) -> Vec<f64> {
    x.to_dtype(DType::F64)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap()
}

struct Down {
    x: Vec<f64>,
    gamma: Vec<f64>,
    beta: Vec<f64>,
    w: Vec<f64>,
}

fn down_case(seed: u64, g: &Geometry) -> Down {
    let mut r = Rng(seed);
    Down {
        x: r.vals(g.n1() * 192, 0.0, 2.0),
        gamma: r.vals(768, 1.0, 0.5),
        beta: r.vals(768, 0.0, 0.5),
        w: r.vals(384 * 768, 0.0, 1.0 / 768f64.sqrt()),
    }
}

fn scales(g: &Geometry) -> oracle::Scales {
    oracle::Scales {
        h1: g.h1,
        w1: g.w1,
        h2: g.h2,
        w2: g.w2,
    }
}

fn down_oracle(c: &Down, g: &Geometry) -> Vec<f64> {
    oracle::downsample(&c.x, scales(g), &c.gamma, &c.beta, &c.w)
}

fn down_run(c: &Down, g: &Geometry, build: Build, dtype: DType) -> Vec<f64> {
    let dev = Device::Cpu;
    let norm = Affine::new(
        tensor(&c.gamma, &[768], dtype),
        tensor(&c.beta, &[768], dtype),
    )
    .unwrap();
    let d = Downsample::new(*g, 192, build, norm, tensor(&c.w, &[384, 768], dtype), &dev).unwrap();
    let y = d
        .forward(&tensor(&c.x, &[g.n1(), 192], dtype), &WavefuseOps::new())
        .unwrap();
    assert_eq!(y.dims(), &[g.n2(), 384]);
    to64(&y)
}

struct Up {
    x: Vec<f64>,
    w1: Vec<f64>,
    gamma: Vec<f64>,
    beta: Vec<f64>,
    w2: Vec<f64>,
}

fn up_case(seed: u64, g: &Geometry) -> Up {
    let mut r = Rng(seed);
    Up {
        x: r.vals(g.n2() * 384, 0.0, 2.0),
        w1: r.vals(768 * 384, 0.0, 1.0 / 384f64.sqrt()),
        gamma: r.vals(192, 1.0, 0.5),
        beta: r.vals(192, 0.0, 0.5),
        w2: r.vals(192 * 192, 0.0, 1.0 / 192f64.sqrt()),
    }
}

fn up_oracle(c: &Up, g: &Geometry) -> Vec<f64> {
    oracle::upsample(&c.x, scales(g), &c.w1, &c.gamma, &c.beta, &c.w2)
}

fn up_run(c: &Up, g: &Geometry, build: Build, dtype: DType) -> Vec<f64> {
    let dev = Device::Cpu;
    let norm = Affine::new(
        tensor(&c.gamma, &[192], dtype),
        tensor(&c.beta, &[192], dtype),
    )
    .unwrap();
    let u = Upsample::new(
        *g,
        192,
        build,
        tensor(&c.w1, &[768, 384], dtype),
        norm,
        tensor(&c.w2, &[192, 192], dtype),
        &dev,
    )
    .unwrap();
    let y = u
        .forward(&tensor(&c.x, &[g.n2(), 384], dtype), &WavefuseOps::new())
        .unwrap();
    assert_eq!(y.dims(), &[g.n1(), 192]);
    to64(&y)
}

#[test]
fn downsample_matches_f64_oracle() {
    let g = Geometry::new(LAT, LON).unwrap();
    assert_eq!(g.h1 % 2, 1, "the merge must read a padding row");
    for seed in [1u64, 2] {
        let c = down_case(seed, &g);
        let want = down_oracle(&c, &g);
        let (m64, _) = oracle::errors(&down_run(&c, &g, Build::Candle, DType::F64), &want);
        let (c16, cr16) = oracle::errors(&down_run(&c, &g, Build::Candle, DType::F16), &want);
        let (w16, wr16) = oracle::errors(&down_run(&c, &g, Build::Wavefuse, DType::F16), &want);
        eprintln!(
            "downsample seed {seed}: candle f64 max {m64:.1e}; candle f16 max {c16:.4} rms {cr16:.5}; \
             wavefuse f16 max {w16:.4} rms {wr16:.5}"
        );
        assert!(m64 < 1e-10, "candle f64 max {m64}");
        assert!(
            c16 < DOWN_MAX && cr16 < DOWN_RMS,
            "candle f16 max {c16} rms {cr16}"
        );
        assert!(
            w16 < DOWN_MAX && wr16 < DOWN_RMS,
            "wavefuse f16 max {w16} rms {wr16}"
        );
    }
}

#[test]
fn upsample_matches_f64_oracle() {
    let g = Geometry::new(LAT, LON).unwrap();
    assert!(2 * g.h2 > g.h1, "the split must drop a row");
    for seed in [3u64, 4] {
        let c = up_case(seed, &g);
        let want = up_oracle(&c, &g);
        let (m64, _) = oracle::errors(&up_run(&c, &g, Build::Candle, DType::F64), &want);
        let (c16, cr16) = oracle::errors(&up_run(&c, &g, Build::Candle, DType::F16), &want);
        let (w16, wr16) = oracle::errors(&up_run(&c, &g, Build::Wavefuse, DType::F16), &want);
        eprintln!(
            "upsample seed {seed}: candle f64 max {m64:.1e}; candle f16 max {c16:.4} rms {cr16:.5}; \
             wavefuse f16 max {w16:.4} rms {wr16:.5}"
        );
        assert!(m64 < 1e-10, "candle f64 max {m64}");
        assert!(
            c16 < UP_MAX && cr16 < UP_RMS,
            "candle f16 max {c16} rms {cr16}"
        );
        assert!(
            w16 < UP_MAX && wr16 < UP_RMS,
            "wavefuse f16 max {w16} rms {wr16}"
        );
    }
}

// Outputs have RMS ~1 (f16 ulp 2^-10..2^-8 over most of them). Measured on
// the CPU, both f16 builds: downsample max 1.1e-3-1.7e-3, RMS 1.8e-4-2.1e-4;
// upsample max 1.2e-3-1.3e-3, RMS 2.2e-4-2.3e-4. Tolerances about 3x. A
// merge read in the wrong order or a split that keeps the wrong row is off
// by O(1).
const DOWN_MAX: f64 = 0.005;
const DOWN_RMS: f64 = 6e-4;
const UP_MAX: f64 = 0.005;
const UP_RMS: f64 = 7e-4;

/// The wavefuse merge followed by the split gathers every real token back
/// bit for bit (the merge's padding rows are zeros and never read back).
#[test]
fn merge_then_split_is_the_identity_on_real_tokens() {
    let g = Geometry::new(LAT, LON).unwrap();
    let dev = Device::Cpu;
    let x = tensor(
        &Rng(9).vals(g.n1() * 192, 0.0, 4.0),
        &[g.n1(), 192],
        DType::F16,
    );
    let merge = Plan::new(&merge_table(&g), g.n1(), &dev).unwrap();
    let split = Plan::new(&split_table(&g), g.n2() * 4, &dev).unwrap();
    let m = wavefuse_candle::gather(&x, &merge).unwrap();
    assert_eq!(m.dims(), &[g.n2() * 4, 192]);
    let back = wavefuse_candle::gather(&m, &split).unwrap();
    assert_eq!(to64(&back), to64(&x));
    // The merge's padding rows are +0.
    let rows = to64(&m);
    for (r, &src) in merge_table(&g).iter().enumerate() {
        if src < 0 {
            assert!(rows[r * 192..(r + 1) * 192].iter().all(|v| *v == 0.0));
        }
    }
}
