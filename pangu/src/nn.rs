//! The two steps every part of the network shares, in either build: a
//! Linear and an affine LayerNorm.
use crate::error::Result;
use crate::model::Build;
use crate::stage::affine_layer_norm;
use crate::stage::config::LN_EPS;
use crate::stage::ops::{Affine, matmul_t};
use candle_core::{DType, Device, Tensor};

/// A Linear `x W^T + b`, `W` `[out, in]` (`b` zeros where the layer has
/// none: the wavefuse build's GEMM takes its bias in the epilogue).
#[derive(Debug)]
pub struct Lin {
    /// `[out, in]`.
    pub w: Tensor,
    /// `[out]`.
    pub b: Tensor,
}

impl Lin {
    /// A Linear without bias.
    pub fn no_bias(w: Tensor, dtype: DType, device: &Device) -> Result<Lin> {
        let out = w.dim(0)?;
        Ok(Lin {
            w,
            b: Tensor::zeros(out, dtype, device)?,
        })
    }

    /// `x W^T + b` in `build`: candle's GEMM and a broadcast add, or
    /// [`wavefuse_candle::linear`] (one rounding, the bias in the
    /// epilogue).
    pub fn forward(&self, build: Build, x: &Tensor) -> Result<Tensor> {
        Ok(match build {
            Build::Candle => matmul_t(x, &self.w)?.broadcast_add(&self.b)?,
            Build::Wavefuse => wavefuse_candle::linear(x, &self.w, &self.b)?,
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
