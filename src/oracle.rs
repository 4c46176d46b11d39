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
