//! The two steps every part of the network shares, in either build: a
//! Linear and an affine LayerNorm.
use crate::error::Result;
use crate::model::Build;
use crate::stage::affine_layer_norm;
use crate::stage::config::LN_EPS;
use crate::stage::ops::{Affine, matmul_t};
use candle_core::Tensor;

/// A Linear `x W^T (+ b)`, `W` `[out, in]`.
#[derive(Debug)]
pub struct Lin {
    /// `[out, in]`.
    pub w: Tensor,
    /// `[out]`, or none.
    pub b: Option<Tensor>,
}

impl Lin {
    /// A Linear without bias.
    pub fn no_bias(w: Tensor) -> Lin {
        Lin { w, b: None }
    }

    /// `x W^T (+ b)` in `build`: candle's GEMM and a broadcast add, or
    /// [`wavefuse_candle::linear`] (one rounding, the bias in the
    /// epilogue) and [`wavefuse_candle::linear_no_bias`].
    pub fn forward(&self, build: Build, x: &Tensor) -> Result<Tensor> {
        Ok(match (build, &self.b) {
            (Build::Candle, None) => matmul_t(x, &self.w)?,
            (Build::Candle, Some(b)) => matmul_t(x, &self.w)?.broadcast_add(b)?,
            (Build::Wavefuse, None) => wavefuse_candle::linear_no_bias(x, &self.w)?,
            (Build::Wavefuse, Some(b)) => wavefuse_candle::linear(x, &self.w, b)?,
        })
    }
}

/// `LayerNorm(x) * gamma + beta` over the last axis in `build`.
pub fn layer_norm(build: Build, x: &Tensor, a: &Affine) -> Result<Tensor> {
    Ok(match build {
        Build::Candle => affine_layer_norm(x, a)?,
        Build::Wavefuse => wavefuse_candle::layer_norm(x, Some(&a.packed), LN_EPS)?,
    })
}
