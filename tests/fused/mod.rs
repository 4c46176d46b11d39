//! Helpers shared by the fused-kernel suites (add_layer_norm, gather,
//! layer_norm_gather): the LayerNorm row check and index-table generators.
#![allow(dead_code)]

use crate::common::{POISON, Rng, oracle, ulp_err};
use half::f16;

/// Checks one LayerNorm output row against the f64 oracle applied to the
/// same f16 inputs `x`. Tolerance (that of tests/layer_norm.rs, with the
/// rounding term taken in absolute units, not ulps): 1 f16 ulp of
/// the reference (floored at the smallest normal), or the f32 conditioning
/// term `64 * 2^-24 * max|x| * rstd * (1 + |gamma|)` (the f32 error of the
/// mean when the offset dwarfs the spread; PyTorch's f32 path has it too)
/// plus the reference's own f16 rounding error, both absolute.
/// NaN references need NaN outputs; no element may still hold POISON.
/// Returns the worst error in ulps.
pub fn check_ln_row(
    got: &[f16],
    x: &[f16],
    gamma: Option<&[f16]>,
    beta: Option<&[f16]>,
    eps: f32,
) -> Result<f64, String> {
    let w = x.len();
    let want = oracle::layer_norm_row(x, gamma, beta, eps as f64);
    let max_abs = x.iter().map(|v| v.to_f64().abs()).fold(0.0, f64::max);
    let mean = x.iter().map(|v| v.to_f64()).sum::<f64>() / w as f64;
    let var = x.iter().map(|v| (v.to_f64() - mean).powi(2)).sum::<f64>() / w as f64;
    let rstd = 1.0 / (var + eps as f64).sqrt();
    let mut worst = 0.0f64;
    for i in 0..w {
        let g = got[i];
        if g.to_bits() == POISON.to_bits() {
            return Err(format!("col {i}: not written"));
        }
        let r = want[i];
        if r.is_nan() {
            if !g.is_nan() {
                return Err(format!("col {i}: want NaN, got {g}"));
            }
            continue;
        }
        if r.abs() > 65504.0 {
            continue;
        }
        let gm = gamma.map_or(1.0, |gm| gm[i].to_f64().abs());
        let cond = 64.0 * 2f64.powi(-24) * max_abs * rstd * (1.0 + gm);
        let err_abs = (g.to_f64() - r).abs();
        let e = ulp_err(g, r);
        // The output's own rounding, in absolute terms.
        let round = (f16::from_f64(r).to_f64() - r).abs();
        if !(e <= 1.0 || err_abs <= cond + round + 1e-12) {
            return Err(format!(
                "col {i}: got {g} want {r} ({e:.2} ulp, cond {cond:.3e})"
            ));
        }
        worst = worst.max(e);
    }
    Ok(worst)
}

/// Kinds of index tables the gather suites draw.
pub const TABLE_KINDS: u8 = 5;

/// An index table of `n_out` entries over `n_src` sources:
/// 0 = random with few pads, 1 = padding-heavy (~90%), 2 = all padding,
/// 3 = heavy repeats (a handful of sources), 4 = a window-partition-like
/// permutation of all sources interleaved with pad runs.
pub fn table(rng: &mut Rng, kind: u8, n_out: usize, n_src: usize) -> Vec<i32> {
    let pick = |rng: &mut Rng| rng.below(n_src as u64) as i32;
    match kind {
        0 => (0..n_out)
            .map(|_| if rng.below(10) == 0 { -1 } else { pick(rng) })
            .collect(),
        1 => (0..n_out)
            .map(|_| if rng.below(10) != 0 { -1 } else { pick(rng) })
            .collect(),
        2 => vec![-1; n_out],
        3 => {
            let few: Vec<i32> = (0..3).map(|_| pick(rng)).collect();
            (0..n_out)
                .map(|_| {
                    if rng.below(8) == 0 {
                        -1
                    } else {
                        few[rng.below(3) as usize]
                    }
                })
                .collect()
        }
        _ => {
            // Shuffled sources, then pads spread between them, cut to n_out.
            let mut perm: Vec<i32> = (0..n_src as i32).collect();
            for i in (1..perm.len()).rev() {
                perm.swap(i, rng.below(i as u64 + 1) as usize);
            }
            let mut t = Vec::with_capacity(n_out);
            let mut it = perm.into_iter().cycle();
            while t.len() < n_out {
                if rng.below(4) == 0 {
                    let run = 1 + rng.below(5) as usize;
                    t.extend(std::iter::repeat_n(-1, run.min(n_out - t.len())));
                } else if let Some(s) = it.next() {
                    t.push(s);
                }
            }
            t
        }
    }
}

/// Rounds an f64 to the nearest f16, ties to even, in one step (no detour
/// through f32): the reference for `f16(residual + branch)`.
pub fn round_f16(v: f64) -> f16 {
    if v.is_nan() {
        return f16::NAN;
    }
    if v.abs() >= 65520.0 {
        return if v > 0.0 {
            f16::INFINITY
        } else {
            f16::NEG_INFINITY
        };
    }
    if v == 0.0 {
        return f16::from_f64(v);
    }
    let e = v.abs().log2().floor().max(-14.0);
    let ulp = 2f64.powf(e - 10.0);
    let r = (v / ulp).round_ties_even() * ulp;
    // `r` is representable: any conversion is exact.
    f16::from_f64(r)
}

/// The exact f16 sum of two halves.
pub fn add_f16(a: f16, b: f16) -> f16 {
    round_f16(a.to_f64() + b.to_f64())
}

/// A partition table: every source exactly once, shuffled, with runs of
/// padding between (about `pad_per_16 / 16` of the entries are padding).
pub fn partition(rng: &mut Rng, n_src: usize, pad_per_16: u64) -> Vec<i32> {
    let mut perm: Vec<i32> = (0..n_src as i32).collect();
    for i in (1..perm.len()).rev() {
        perm.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let mut t = Vec::new();
    for s in perm {
        while rng.below(16) < pad_per_16 {
            t.push(-1);
        }
        t.push(s);
    }
    if rng.below(2) == 0 {
        t.extend(std::iter::repeat_n(-1, rng.below(9) as usize));
    }
    t
}
