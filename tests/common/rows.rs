//! Rows for the LayerNorm family's suites, drawn so that ill-conditioned
//! rows come up often: large offsets with small spreads, constant and
//! near-constant rows, +-65504, subnormals, tiny values with large
//! outliers; and affine parameters that nearly cancel the normalised row.
use super::Rng;
use super::oracle;
use half::f16;

/// Kinds of rows [`ln_row`] draws.
pub const ROW_KINDS: u8 = 10;

/// A finite f16 drawn uniformly over bit patterns (so uniformly over
/// binades, subnormals and both signs included).
pub fn any_finite(rng: &mut Rng) -> f16 {
    loop {
        let v = f16::from_bits(rng.next_u64() as u16);
        if v.is_finite() {
            return v;
        }
    }
}

/// `v` rounded to f16, saturating at +-65504.
fn sat(v: f64) -> f16 {
    f16::from_f64(v.clamp(-65504.0, 65504.0))
}

/// The f16 spacing at `v`.
fn quantum(v: f64) -> f64 {
    super::ulp16(v)
}

/// One row of `w` halves of kind `kind` (modulo [`ROW_KINDS`]):
/// 0. centred, `scale * N(0,1)`, scale 1e-3..5e4;
/// 1. large offset (up to 65504, either sign), spread of 1-64 f16
///    quanta at that offset (mean 2048 with sigma 1 is one of these);
/// 2. constant (any finite f16, subnormals, +-0 and +-65504 included);
/// 3. near-constant: a constant row with 1-3 elements one or two quanta off;
/// 4. values within a few hundred of +-65504 (either sign, mixed);
/// 5. subnormals, possibly offset by a few subnormal quanta;
/// 6. many equal tiny values, 1-4 large outliers, one element at the f16
///    nearest the mean (outputs near 0 in a row whose mean carries tiny
///    bits);
/// 7. two values, in random positions;
/// 8. `scale * N(0,1)` plus an offset of `3 * scale` or -100;
/// 9. two values, each in exactly half of the row, in random positions,
///    mostly a few quanta apart at a large offset: the normalised values
///    are exactly +-1 when eps is 0 (with [`affine`] kind 4, outputs that
///    cancel to exactly 0).
pub fn ln_row(rng: &mut Rng, kind: u8, w: usize) -> Vec<f16> {
    let sign = |rng: &mut Rng| if rng.below(2) == 0 { 1.0 } else { -1.0 };
    match kind % ROW_KINDS {
        0 => {
            let scale = 10f64.powf(-3.0 + 7.7 * rng.unit());
            rng.halves(w, scale, 0.0)
        }
        1 => {
            let offset = sign(rng) * 2f64.powf(16.0 * rng.unit()).min(65504.0);
            let spread = quantum(offset) * 2f64.powf(6.0 * rng.unit());
            (0..w)
                .map(|_| sat(offset + spread * rng.normal()))
                .collect()
        }
        2 => vec![any_finite(rng); w],
        3 => {
            let c = any_finite(rng).to_f64().clamp(-65472.0, 65472.0);
            let mut x = vec![sat(c); w];
            for _ in 0..1 + rng.below(3) {
                let i = rng.below(w as u64) as usize;
                let steps = (1 + rng.below(2)) as f64 * sign(rng);
                x[i] = sat(c + steps * quantum(c));
            }
            x
        }
        4 => (0..w)
            .map(|_| sat(sign(rng) * (65504.0 - 32.0 * rng.below(8) as f64)))
            .collect(),
        5 => {
            let off = rng.below(64) as f64 * sign(rng);
            (0..w)
                .map(|_| {
                    let k = off + (rng.below(1024) as f64) * sign(rng);
                    sat(k * 2f64.powi(-24))
                })
                .collect()
        }
        6 => {
            let tiny = f16::from_bits(1 + rng.below(0x1400) as u16);
            let mut x = vec![tiny; w];
            for _ in 0..1 + rng.below(4) {
                let i = rng.below(w as u64) as usize;
                x[i] = sat(sign(rng) * 2f64.powf(5.0 + 10.9 * rng.unit()));
            }
            let mean = x.iter().map(|v| v.to_f64()).sum::<f64>() / w as f64;
            let j = rng.below(w as u64) as usize;
            // Replacing x[j] moves the mean; aim at the mean of the others.
            let rest = (mean * w as f64 - x[j].to_f64()) / (w - 1) as f64;
            x[j] = sat(rest);
            x
        }
        7 => {
            let (a, b) = (any_finite(rng), any_finite(rng));
            (0..w)
                .map(|_| if rng.below(2) == 0 { a } else { b })
                .collect()
        }
        8 => {
            let scale = 10f64.powf(-3.0 + 7.7 * rng.unit());
            let offset = if rng.below(2) == 0 {
                3.0 * scale
            } else {
                -100.0
            };
            rng.halves(w, scale, offset)
        }
        _ => {
            let (a, b) = if rng.below(4) == 0 {
                (any_finite(rng), any_finite(rng))
            } else {
                let c = sign(rng) * 2f64.powf(16.0 * rng.unit()).min(65000.0);
                let steps = (1 + rng.below(8)) as f64;
                (sat(c), sat(c + steps * quantum(c)))
            };
            let mut x: Vec<f16> = (0..w).map(|i| if i < w / 2 { a } else { b }).collect();
            for i in (1..w).rev() {
                x.swap(i, rng.below(i as u64 + 1) as usize);
            }
            x
        }
    }
}

/// `rows` rows of width `w`, each of a random kind, some with a NaN or an
/// infinity when `specials`.
pub fn ln_rows(rng: &mut Rng, rows: usize, w: usize, specials: bool) -> Vec<f16> {
    let mut x = Vec::with_capacity(rows * w);
    for _ in 0..rows {
        let kind = rng.below(u64::from(ROW_KINDS)) as u8;
        let mut row = ln_row(rng, kind, w);
        if specials && rng.below(8) == 0 {
            let i = rng.below(w as u64) as usize;
            row[i] = [f16::NAN, f16::INFINITY, f16::NEG_INFINITY][rng.below(3) as usize];
        }
        x.extend(row);
    }
    x
}

/// Kinds of affine parameters [`affine`] draws.
pub const AFFINE_KINDS: u8 = 5;

/// `gamma`, `beta` of width `w` for rows `x` (row-major), kind `kind`
/// (modulo [`AFFINE_KINDS`]):
/// 0. `gamma ~ 1 + N(0, 0.5)`, `beta ~ N(0, 0.5)`;
/// 1. large `|gamma|` and `beta` (up to ~1000);
/// 2. near-cancelling: `beta = -f16(o * gamma)` for the normalised values
///    `o` of one finite row of `x`, so that row's outputs lie near 0 (the
///    affine map's cancellation, at a ratio of about 2^11);
/// 3. as 0 with some `gamma` exactly 0 (the output is `beta` exactly);
/// 4. `beta = -gamma`, `|gamma|` up to 65504: where `o` is 1 the output
///    cancels to 0 (exactly, with row kind 9 and eps 0), where `o` is near 1
///    to far below `2^-24 |gamma|`.
pub fn affine(rng: &mut Rng, kind: u8, x: &[f16], w: usize, eps: f32) -> (Vec<f16>, Vec<f16>) {
    match kind % AFFINE_KINDS {
        0 => (rng.halves(w, 0.5, 1.0), rng.halves(w, 0.5, 0.0)),
        1 => (rng.halves(w, 300.0, 0.0), rng.halves(w, 300.0, 0.0)),
        2 => {
            let gamma = rng.halves(w, 1.0, 0.0);
            let rows: Vec<&[f16]> = x
                .chunks(w)
                .filter(|r| r.iter().all(|v| v.is_finite()))
                .collect();
            if rows.is_empty() {
                return (gamma, rng.halves(w, 0.5, 0.0));
            }
            let row = rows[rng.below(rows.len() as u64) as usize];
            let o = oracle::layer_norm_row(row, None, None, f64::from(eps));
            let beta = (0..w).map(|i| sat(-(o[i] * gamma[i].to_f64()))).collect();
            (gamma, beta)
        }
        4 => {
            let gamma: Vec<f16> = (0..w)
                .map(|_| {
                    sat(2f64.powf(16.0 * rng.unit()) * if rng.below(2) == 0 { 1.0 } else { -1.0 })
                })
                .collect();
            let beta = gamma.iter().map(|g| -*g).collect();
            (gamma, beta)
        }
        _ => {
            let mut gamma = rng.halves(w, 0.5, 1.0);
            for g in gamma.iter_mut() {
                if rng.below(4) == 0 {
                    *g = f16::ZERO;
                }
            }
            (gamma, rng.halves(w, 0.5, 0.0))
        }
    }
}

/// The eps values the suites draw (0 included: constant rows then give NaN,
/// as in the oracle and PyTorch).
pub fn eps(rng: &mut Rng) -> f32 {
    [1e-5f32, 1e-6, 1e-3, 0.0][rng.below(4) as usize]
}

/// `(residual, branch)` of `rows` rows of width `w` whose rounded sums
/// `f16(residual + branch)` are [`ln_rows`]-like: the residual is such a
/// row and the branch, per row, zeros, a few f16 quanta of the residual
/// (the sum stays ill-conditioned), `-residual` (the sum is 0), or a centred
/// `N(0, s)`; some rows hold a NaN, an infinity, or a pair of finite
/// halves whose sum overflows to infinity.
pub fn add_inputs(rng: &mut Rng, rows: usize, w: usize) -> (Vec<f16>, Vec<f16>) {
    let residual = ln_rows(rng, rows, w, false);
    let mut res = Vec::with_capacity(rows * w);
    let mut br = Vec::with_capacity(rows * w);
    for r in residual.chunks(w) {
        let mut r = r.to_vec();
        let mut b: Vec<f16> = match rng.below(4) {
            0 => vec![f16::ZERO; w],
            1 => r
                .iter()
                .map(|v| sat(quantum(v.to_f64()) * 2.0 * rng.normal()))
                .collect(),
            2 => r.iter().map(|v| -*v).collect(),
            _ => {
                let scale = 10f64.powf(-2.0 + 5.0 * rng.unit());
                rng.halves(w, scale, 0.0)
            }
        };
        if rng.below(8) == 0 {
            let i = rng.below(w as u64) as usize;
            match rng.below(3) {
                0 => r[i] = f16::NAN,
                1 => b[i] = f16::NEG_INFINITY,
                _ => {
                    r[i] = f16::from_f32(60000.0);
                    b[i] = f16::from_f32(30000.0);
                }
            }
        }
        res.extend(r);
        br.extend(b);
    }
    (res, br)
}

/// A row of two values one quantum apart at about 1024, unbalanced (so
/// the variance is not exact in any f64 formula: `K = mean^2 / var` is
/// about 2^22), with affine parameters that cancel it deeply: each
/// column's gamma (`|gamma|` in 2^10..2^15) is the f16 for which `gamma *
/// o` lies nearest the f16 grid, and `beta = -f16(gamma * o)`, so the
/// outputs are 2^-20 to 2^-26 of `|gamma o|`. Only the exact-variance tier
/// of the affine refinement gets these within an ulp (with eps 0).
#[allow(dead_code)] // not every suite that includes `common` uses it
pub fn deep_cancellation(rng: &mut Rng, w: usize) -> (Vec<f16>, Vec<f16>, Vec<f16>) {
    let a = f16::from_f64(1024.0 + rng.below(512) as f64);
    let b = f16::from_f64(a.to_f64() + 1.0);
    let n_a = w / 2 + 4 + rng.below(8) as usize;
    let mut row: Vec<f16> = (0..w).map(|j| if j < n_a { a } else { b }).collect();
    for j in (1..w).rev() {
        row.swap(j, rng.below(j as u64 + 1) as usize);
    }
    let o = oracle::layer_norm_row(&row, None, None, 0.0);
    let mut gamma = Vec::with_capacity(w);
    let mut beta = Vec::with_capacity(w);
    for &oj in &o {
        let mut best = (f64::INFINITY, f16::ONE);
        for bits in 0x6400u16..0x7800 {
            let g = f16::from_bits(bits);
            let go = g.to_f64() * oj;
            let r = (f16::from_f64(go).to_f64() - go).abs() / go.abs();
            if r < best.0 {
                best = (r, g);
            }
        }
        gamma.push(best.1);
        beta.push(-f16::from_f64(best.1.to_f64() * oj));
    }
    (row, gamma, beta)
}
