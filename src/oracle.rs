//! f64 reference implementations. Deliberately plain: no shared code with
//! the kernels, no cleverness. Used by the kernel suite and the harness.
use half::f16;

/// LayerNorm of one row in f64; `None` affine = identity.
///
/// The deviations are formed as `(W x - S) / W` from the row sum `S`,
/// which is exact in f64 (every partial sum of f16 values is a multiple of
/// 2^-24 below 2^26), so they carry one rounding each: a mean rounded to
/// f64 would put `2^-53 |mean|` into every deviation, more than an f16 ulp
/// of an affine output near 0 once `gamma` is large. The result is within
/// about `2^-50 |o gamma| + 2^-53 |y|` of the exact value.
pub fn layer_norm_row(
    x: &[f16],
    gamma: Option<&[f16]>,
    beta: Option<&[f16]>,
    eps: f64,
) -> Vec<f64> {
    let n = x.len() as f64;
    let xs: Vec<f64> = x.iter().map(|v| v.to_f64()).collect();
    let sum = xs.iter().sum::<f64>();
    let dev: Vec<f64> = xs.iter().map(|v| (n * v - sum) / n).collect();
    let var = dev.iter().map(|d| d * d).sum::<f64>() / n;
    let rstd = 1.0 / (var + eps).sqrt();
    dev.iter()
        .enumerate()
        .map(|(i, d)| {
            let y = d * rstd;
            match (gamma, beta) {
                (Some(g), Some(b)) => y.mul_add(g[i].to_f64(), b[i].to_f64()),
                _ => y,
            }
        })
        .collect()
}

/// `f16(residual + branch)`: the rounded sum PyTorch's unfused path writes.
pub fn add_round(a: f16, b: f16) -> f16 {
    f16::from_f64(a.to_f64() + b.to_f64())
}

/// Exact-erf GELU in f64: `x * Phi(x)`, through erfc (no tail cancellation).
pub fn gelu_erf(x: f64) -> f64 {
    0.5 * x * libm::erfc(-x / std::f64::consts::SQRT_2)
}

/// Softmax of one row in f64 (NaN row when every entry is -inf, as PyTorch).
pub fn softmax_row(x: &[f64]) -> Vec<f64> {
    let m = x.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = x.iter().map(|v| (v - m).exp()).collect();
    let s: f64 = e.iter().sum();
    e.iter().map(|v| v / s).collect()
}

/// f16 ulp of `x` (floored at the smallest normal's, 2^-24).
pub fn f16_ulp(x: f64) -> f64 {
    let a = x.abs().max(f16::MIN_POSITIVE.to_f64());
    2f64.powf(a.log2().floor() - 10.0)
}

/// One query row of window attention in f64, with the tolerance of
/// wavefuse's contract (`wavefuse::ops::window_attention`) per channel.
pub struct AttnRow {
    /// `sum_j p_j v_j` per channel.
    pub out: Vec<f64>,
    /// Allowed `|got - out|` per channel.
    pub tol: Vec<f64>,
}

/// `softmax(scale * q.k_j + mask_j + bias_j) . v` for one query `q` over
/// the keys `k[j]` and values `v[j]` (every input as the kernel sees it,
/// in f64); `None` where the row is NaN (a NaN or +inf score, or all -inf).
/// The tolerance is the documented bound, per channel: `ulp(out) / 2 +
/// (1 + 2^-10) (2^-11 sum_j p_j |v_j - out| + 2^-25 sum_j |v_j - out| /
/// sum_j e_j) + 2^-16 (M + |out|) + sum_j p_j |v_j| dz_j + M dz_max`, with
/// `M = sum_j p_j |v_j|` and `dz_j = 2^-17 (scale sum_d |q_d k_jd| +
/// |bias_j|) + 2^-11 |mask_j| + 2^-22 (|bias_j| + |z_j|)` (f32 scores: the
/// matrix unit's accumulation of q . k and the bias, the mask's f16 form,
/// then the roundings of the exponent's argument), `dz_max` that of the
/// row's maximum plus `2^-22 |max|` (the exponent's `fma`). The second
/// term is the f16 rounding of the weights, whose rounded sum normalises
/// them; the third the f32 sums on the matrix unit.
pub fn attention_row(
    q: &[f64],
    k: &[Vec<f64>],
    v: &[Vec<f64>],
    scale: f64,
    mask: &[f64],
    bias: &[f64],
) -> Option<AttnRow> {
    let n = k.len();
    let mut z = vec![0.0; n];
    let mut dz = vec![0.0; n];
    for j in 0..n {
        let s: f64 = q.iter().zip(&k[j]).map(|(a, b)| a * b).sum();
        let sa: f64 = q.iter().zip(&k[j]).map(|(a, b)| (a * b).abs()).sum();
        z[j] = s * scale + mask[j] + bias[j];
        dz[j] = 2f64.powi(-17) * (scale * sa + bias[j].abs())
            + 2f64.powi(-11) * mask[j].abs()
            + 2f64.powi(-22) * (bias[j].abs() + z[j].abs());
    }
    let (arg, mx) = z
        .iter()
        .copied()
        .enumerate()
        .fold(
            (0, f64::NEG_INFINITY),
            |(a, m), (j, x)| if x > m { (j, x) } else { (a, m) },
        );
    if z.iter().any(|x| x.is_nan()) || mx == f64::INFINITY || mx == f64::NEG_INFINITY {
        return None;
    }
    let dz_max = dz[arg] + 2f64.powi(-22) * mx.abs();
    let e: Vec<f64> = z.iter().map(|x| (x - mx).exp()).collect();
    let sum: f64 = e.iter().sum();
    let d = v.first().map_or(0, Vec::len);
    let (mut out, mut tol) = (vec![0.0; d], vec![0.0; d]);
    for c in 0..d {
        let o: f64 = (0..n).map(|j| e[j] * v[j][c]).sum::<f64>() / sum;
        let m: f64 = (0..n).map(|j| e[j] * v[j][c].abs()).sum::<f64>() / sum;
        let mz: f64 = (0..n)
            .filter(|&j| e[j] > 0.0) // -inf scores: exactly 0, whatever dz
            .map(|j| e[j] * v[j][c].abs() * dz[j])
            .sum::<f64>()
            / sum;
        // The weights' f16 rounding, relative to the mean they form.
        let dev: f64 = (0..n).map(|j| e[j] * (v[j][c] - o).abs()).sum::<f64>() / sum;
        let dev_all: f64 = (0..n).map(|j| (v[j][c] - o).abs()).sum();
        let rounding =
            (1.0 + 2f64.powi(-10)) * (2f64.powi(-11) * dev + 2f64.powi(-25) * dev_all / sum);
        out[c] = o;
        tol[c] = 0.5 * f16_ulp(o) + rounding + 2f64.powi(-16) * (m + o.abs()) + mz + m * dz_max;
    }
    Some(AttnRow { out, tol })
}
