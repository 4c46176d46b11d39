//! f64 reference implementations. Deliberately plain: no shared code with
//! the kernels, no cleverness. Used by the kernel suite and the harness.
use half::f16;

/// LayerNorm of one row in f64; `None` affine = identity.
pub fn layer_norm_row(
    x: &[f16],
    gamma: Option<&[f16]>,
    beta: Option<&[f16]>,
    eps: f64,
) -> Vec<f64> {
    let n = x.len() as f64;
    let xs: Vec<f64> = x.iter().map(|v| v.to_f64()).collect();
    let mean = xs.iter().sum::<f64>() / n;
    let var = xs.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n;
    let rstd = 1.0 / (var + eps).sqrt();
    xs.iter()
        .enumerate()
        .map(|(i, v)| {
            let y = (v - mean) * rstd;
            match (gamma, beta) {
                (Some(g), Some(b)) => y * g[i].to_f64() + b[i].to_f64(),
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
