//! The candle build of the Pangu stage against the f64 oracle on the CPU
//! (tiny grid: padding along latitude, both blocks, 8 windows), the window
//! partition against the planner's tables, weight-file checks, and the
//! wavefuse build's not-wired error.
mod oracle;

use candle_core::{DType, Device, Tensor};
use wavefuse_candle::pangu::{
    self, CandleOps, Stage, StageConfig, StageOps, WavefuseOps, Windowing,
};
use wavefuse_shared::window::Shift3;

const CFG: StageConfig = StageConfig::TINY;

fn to64(x: &Tensor) -> Vec<f64> {
    x.to_dtype(DType::F64)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap()
}

/// Runs `blocks` blocks of the candle build and the oracle on fresh
/// weights; returns (max, rms) of the difference and the output RMS.
fn check(seed: u64, bias_range: f32, blocks: usize, dtype: DType) -> ((f64, f64), f64) {
    let t = pangu::weights::random_weights(&CFG, seed, bias_range).unwrap();
    let dev = Device::Cpu;
    let stage = Stage::load(CFG, &t, &dev, dtype).unwrap();
    let ops = CandleOps::new(CFG.dim, dtype, &dev).unwrap();
    let x = stage.input(&t, &dev).unwrap();
    let y = if blocks == 2 {
        stage.forward(&ops, &x).unwrap()
    } else {
        stage.forward_block(&ops, 0, &x).unwrap()
    };
    assert_eq!(y.dims(), &[CFG.tokens(), CFG.dim]);
    assert_eq!(y.dtype(), dtype);
    let want = oracle::stage(&CFG, &t, blocks);
    let rms = (want.iter().map(|v| v * v).sum::<f64>() / want.len() as f64).sqrt();
    (oracle::errors(&to64(&y), &want), rms)
}

// The f16 stage rounds every intermediate; outputs have RMS ~1.2 and reach
// ~4 (f16 ulp 2^-10..2^-8). Measured on the CPU: max 0.0023-0.0040, RMS
// 3.9e-4-5.9e-4 (seeds 1, 3, 7). Tolerances about 4x max, 2.5x RMS.
const MAX_TOL: f64 = 0.016;
const RMS_TOL: f64 = 0.0015;

/// The same source computing in f32 (candle-nn's LayerNorm has no f64):
/// the stage's logic (windowing, bias types, mask, fold, both blocks) up to
/// f32 rounding (measured max 7.9e-7).
#[test]
fn stage_in_f32_matches_oracle() {
    let ((max, rms), _) = check(11, 2.0, 2, DType::F32);
    eprintln!("f32: max {max:.3e} rms {rms:.3e}");
    assert!(max < 1e-5, "max {max} rms {rms}");
}

#[test]
fn stage_matches_f64_oracle() {
    for seed in [1u64, 7] {
        let ((max, rms), out_rms) = check(seed, 2.0, 2, DType::F16);
        eprintln!("seed {seed}: max {max:.4} rms {rms:.5} (output rms {out_rms:.3})");
        assert!(
            max < MAX_TOL && rms < RMS_TOL,
            "seed {seed}: max {max} rms {rms}"
        );
    }
}

#[test]
fn unshifted_block_matches_f64_oracle() {
    let ((max, rms), _) = check(3, 2.0, 1, DType::F16);
    eprintln!("block 0: max {max:.4} rms {rms:.5}");
    assert!(max < MAX_TOL && rms < RMS_TOL, "max {max} rms {rms}");
}

/// The candle-ops partition (pad, roll, reshape/permute) moves tokens
/// exactly as the planner's partition and reverse tables, which the
/// wavefuse kernels read.
#[test]
fn partition_agrees_with_planner_tables() {
    let dev = Device::Cpu;
    for shift in [Shift3 { z: 0, h: 0, w: 0 }, CFG.shift] {
        let win = Windowing::new(CFG.grid, CFG.window, shift, &dev, DType::F32).unwrap();
        let n = CFG.tokens();
        // Token k carries k + 1 in both channels (f32: exact).
        let ids: Vec<f32> = (0..n)
            .flat_map(|k| [(k + 1) as f32, -((k + 1) as f32)])
            .collect();
        let x = Tensor::from_vec(ids, (n, 2), &dev).unwrap();
        let y = pangu::partition(&x, &win)
            .unwrap()
            .to_vec2::<f32>()
            .unwrap();
        let table = win.plan().partition_table();
        assert_eq!(y.len(), table.len());
        for (row, &src) in y.iter().zip(&table) {
            let want = if src < 0 { 0.0 } else { (src + 1) as f32 };
            assert_eq!(row, &[want, -want]);
        }
        let back = pangu::unpartition(&pangu::partition(&x, &win).unwrap(), &win).unwrap();
        assert_eq!(back.to_vec2::<f32>().unwrap(), x.to_vec2::<f32>().unwrap());
        // The reverse table names, for each grid token, the windowed row
        // that holds it.
        let rev = win.plan().reverse_table();
        for (k, &r) in rev.iter().enumerate() {
            assert_eq!(y[r as usize][0], (k + 1) as f32);
        }
    }
}

#[test]
fn missing_or_misshaped_weights_are_errors() {
    let dev = Device::Cpu;
    let mut t = pangu::weights::random_weights(&CFG, 5, 1.0).unwrap();
    t.remove("b1.fc2.bias");
    let e = Stage::load(CFG, &t, &dev, DType::F16)
        .unwrap_err()
        .to_string();
    assert!(e.contains("b1.fc2.bias") && e.contains("missing"), "{e}");
    let mut t = pangu::weights::random_weights(&CFG, 5, 1.0).unwrap();
    t.insert(
        "b0.qkv.weight".into(),
        Tensor::zeros((3, 3), DType::F16, &dev).unwrap(),
    );
    let e = Stage::load(CFG, &t, &dev, DType::F16)
        .unwrap_err()
        .to_string();
    assert!(e.contains("b0.qkv.weight"), "{e}");
}

#[test]
fn wavefuse_build_is_not_wired_yet() {
    let t = pangu::weights::random_weights(&CFG, 5, 1.0).unwrap();
    let dev = Device::Cpu;
    let stage = Stage::load(CFG, &t, &dev, DType::F16).unwrap();
    let x = stage.input(&t, &dev).unwrap();
    let ops = WavefuseOps::new();
    assert_eq!(ops.name(), "wavefuse");
    let e = stage.forward(&ops, &x).unwrap_err().to_string();
    assert!(e.contains("not wired"), "{e}");
}
