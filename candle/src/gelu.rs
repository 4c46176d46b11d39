//! Bias + GELU as a candle op.
//!
//! Numerics are wavefuse's ([`wavefuse::bias_gelu`]): with an f16 bias,
//! `x + b` rounded to f16 before the GELU (PyTorch's f16 `x + b`); with a
//! bf16 bias, kept in f32 (PyTorch promotes f16 + bf16); the GELU in f32,
//! one rounding to f16.
use crate::runner::{Operand, Path};
use candle_core::backend::BackendStorage;
use candle_core::{DType, Result, Shape, Tensor};
use wavefuse::{GeluBias, GeluMode, f16};

/// `y = gelu(x + bias)` over the last axis: `CustomOp2` on `x` `[..., C]`
/// (f16) and `bias` `[C]` (f16 or bf16).
#[derive(Clone, Copy, Debug, Default)]
pub struct BiasGelu {
    /// Exact (erf, default) or tanh GELU.
    pub mode: GeluMode,
}

const GELU: &str = "wavefuse-bias_gelu";

impl BiasGelu {
    fn fwd<P: Path>(&self, ins: &[Operand<'_, P::S>]) -> Result<(P::S, Shape)> {
        let (x, mut b) = (ins[0], ins[1]);
        let Some(&cols) = x.l.dims().last() else {
            candle_core::bail!("{GELU}: `x` is a scalar, expected [..., C]");
        };
        if b.l.dims() != [cols] {
            candle_core::bail!("{GELU}: `bias` is {:?}, expected [{cols}]", b.l.dims());
        }
        b.dtype = match b.s.dtype() {
            DType::BF16 => DType::BF16,
            // Anything else is reported by the operand check as "expected f16".
            _ => DType::F16,
        };
        let n = x.l.shape().elem_count();
        let mode = self.mode;
        let mut o = P::run(GELU, &[x, b], None, &[n], |io| {
            let xv = io.input::<f16>(0, 0, None)?;
            let mut y = io.output(0, &[n])?;
            if b.dtype == DType::BF16 {
                let bv = io.input::<wavefuse::bf16>(1, 0, None)?;
                wavefuse::bias_gelu(io.q, &xv, GeluBias::Bf16(&bv), &mut y[0], cols, mode)
            } else {
                let bv = io.input::<f16>(1, 0, None)?;
                wavefuse::bias_gelu(io.q, &xv, GeluBias::F16(&bv), &mut y[0], cols, mode)
            }
        })?;
        Ok((o.remove(0), x.l.shape().clone()))
    }
}

custom_op!(BiasGelu, GELU, CustomOp2, ["x", "bias"]);

/// `gelu(x + bias)` (see [`BiasGelu`]).
pub fn bias_gelu(x: &Tensor, bias: &Tensor, mode: GeluMode) -> Result<Tensor> {
    x.apply_op2_no_bwd(bias, &BiasGelu { mode })
}
