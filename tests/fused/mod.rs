//! Helpers shared by the fused-kernel suites (add_layer_norm, gather and
//! the gathered LayerNorms): index-table generators and the f16 sum
//! reference.
#![allow(dead_code)]

use crate::common::Rng;
use half::f16;

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

/// gamma and beta ([`crate::common::rows::affine`] of `kind`, when given)
/// for the rows add+LayerNorm normalises: the rounded sums
/// `f16(residual + branch)`.
pub fn add_affine(
    rng: &mut Rng,
    kind: Option<u8>,
    residual: &[f16],
    branch: &[f16],
    width: usize,
    eps: f32,
) -> (Option<Vec<f16>>, Option<Vec<f16>>) {
    let Some(k) = kind else {
        return (None, None);
    };
    let sums: Vec<f16> = residual
        .iter()
        .zip(branch)
        .map(|(&a, &b)| add_f16(a, b))
        .collect();
    let (g, b) = crate::common::rows::affine(rng, k, &sums, width, eps);
    (Some(g), Some(b))
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
