//! The stage with candle's own ops, written as PyTorch would: pad, roll,
//! reshape/permute window partition, broadcast adds, candle-nn's LayerNorm
//! and softmax (f32 inside, f16 out).
use super::config::{HEAD_DIM, LN_EPS};
use super::ops::{Affine, StageOps, matmul_t};
use super::probe::Probe;
use super::tables::Windowing;
use super::weights::BlockWeights;
use candle_core::{D, DType, Result, Tensor};

/// candle's own ops.
#[derive(Debug)]
pub struct CandleOps {
    ones: Tensor,
    zeros: Tensor,
    probe: Probe,
}

impl CandleOps {
    /// The ops for tokens of `dim` channels of `dtype` on `device`.
    pub fn new(dim: usize, dtype: DType, device: &candle_core::Device) -> Result<CandleOps> {
        Ok(CandleOps {
            ones: Tensor::ones(dim, dtype, device)?,
            zeros: Tensor::zeros(dim, dtype, device)?,
            probe: Probe::default(),
        })
    }

    /// The step timer ([`Probe::start`] before a forward, [`Probe::finish`]
    /// after).
    pub fn probe(&self) -> &Probe {
        &self.probe
    }

    /// LayerNorm without affine: candle-nn's fused kernel with gamma 1 and
    /// beta 0 (so the result is the plain normalisation).
    fn layer_norm(&self, x: &Tensor) -> Result<Tensor> {
        candle_nn::ops::layer_norm(x, &self.ones, &self.zeros, LN_EPS)
    }
}

/// `LayerNorm(x) * gamma + beta` over the last axis: candle-nn's fused
/// kernel (f32 statistics), spelled out in f64 for an f64 tensor (the
/// fused kernel has none).
pub fn affine_layer_norm(x: &Tensor, a: &Affine) -> Result<Tensor> {
    if x.dtype() != DType::F64 {
        return candle_nn::ops::layer_norm(x, &a.gamma, &a.beta, LN_EPS);
    }
    let mean = x.mean_keepdim(D::Minus1)?;
    let xc = x.broadcast_sub(&mean)?;
    let var = xc.sqr()?.mean_keepdim(D::Minus1)?;
    xc.broadcast_div(&(var + f64::from(LN_EPS))?.sqrt()?)?
        .broadcast_mul(&a.gamma)?
        .broadcast_add(&a.beta)
}

/// `x` `[N, C]` in grid order -> `[windows * T, C]`: zero-pad at the end of
/// each axis, roll by `-shift`, partition.
pub fn partition(x: &Tensor, win: &Windowing) -> Result<Tensor> {
    let plan = win.plan();
    let (g, p, w, s) = (plan.grid(), plan.padded_grid(), plan.window(), plan.shift());
    let c = x.dim(D::Minus1)?;
    let x = x
        .reshape((g.z, g.h, g.w, c))?
        .pad_with_zeros(0, 0, p.z - g.z)?
        .pad_with_zeros(1, 0, p.h - g.h)?
        .pad_with_zeros(2, 0, p.w - g.w)?
        .roll(-(s.z as i32), 0)?
        .roll(-(s.h as i32), 1)?
        .roll(-(s.w as i32), 2)?;
    // [nz, wz, nh, wh, nw, ww * C]: ww and C stay adjacent, so six axes
    // suffice for the permute.
    x.reshape((p.z / w.z, w.z, p.h / w.h, w.h, p.w / w.w, w.w * c))?
        .permute((0, 2, 4, 1, 3, 5))?
        .contiguous()?
        .reshape((win.n_windows() * win.tokens_per_window(), c))
}

/// The inverse of [`partition`]: `[windows * T, C]` -> un-partition, roll by
/// `+shift`, crop -> `[N, C]` in grid order.
pub fn unpartition(y: &Tensor, win: &Windowing) -> Result<Tensor> {
    let plan = win.plan();
    let (g, p, w, s) = (plan.grid(), plan.padded_grid(), plan.window(), plan.shift());
    let c = y.dim(D::Minus1)?;
    let y = y
        .reshape((p.z / w.z, p.h / w.h, p.w / w.w, w.z, w.h, w.w * c))?
        .permute((0, 3, 1, 4, 2, 5))?
        .reshape((p.z, p.h, p.w, c))?
        .roll(s.z as i32, 0)?
        .roll(s.h as i32, 1)?
        .roll(s.w as i32, 2)?
        .narrow(0, 0, g.z)?
        .narrow(1, 0, g.h)?
        .narrow(2, 0, g.w)?;
    y.reshape((g.z * g.h * g.w, c))
}

impl StageOps for CandleOps {
    fn name(&self) -> &'static str {
        "candle"
    }

    fn mark(&self, step: &'static str) -> Result<()> {
        self.probe.mark(step)
    }

    fn norm_partition(&self, x: &Tensor, norm: &Affine, win: &Windowing) -> Result<Tensor> {
        let h = candle_nn::ops::layer_norm(x, &norm.gamma, &norm.beta, LN_EPS)?;
        let h = partition(&h, win)?;
        self.mark("norm_partition")?;
        Ok(h)
    }

    fn add_norm_partition(
        &self,
        x: &Tensor,
        d: &Tensor,
        norm: &Affine,
        win: &Windowing,
    ) -> Result<(Tensor, Tensor)> {
        let x = (x + d)?;
        let h = candle_nn::ops::layer_norm(&x, &norm.gamma, &norm.beta, LN_EPS)?;
        let h = partition(&h, win)?;
        self.mark("add_norm_partition")?;
        Ok((x, h))
    }

    fn attention(
        &self,
        qkv: &Tensor,
        qkv_bias: Option<&Tensor>,
        earth_bias: &Tensor,
        heads: usize,
        win: &Windowing,
    ) -> Result<Tensor> {
        let (rows, c3) = qkv.dims2()?;
        let t = win.tokens_per_window();
        let windows = rows / t;
        let qkv = match qkv_bias {
            Some(b) => qkv.broadcast_add(b)?,
            None => qkv.clone(),
        };
        let qkv = qkv
            .reshape((windows, t, 3, heads, HEAD_DIM))?
            .permute((2, 0, 3, 1, 4))?;
        // candle's affine multiplies in f16 with the scale rounded to f16.
        let q = (qkv.get(0)? * (HEAD_DIM as f64).powf(-0.5))?;
        let k = qkv.get(1)?.contiguous()?;
        let v = qkv.get(2)?.contiguous()?;
        self.mark("qkv_split")?;
        let s = q.matmul(&k.t()?)?;
        self.mark("scores_gemm")?;
        let types = win.n_types();
        // Windows are (z, h, w)-major and the type is (z, h): group the
        // longitude windows of each type, as the pseudocode does.
        let s = s
            .reshape((types, windows / types, heads, t, t))?
            .broadcast_add(&earth_bias.unsqueeze(1)?)?
            .reshape((windows, heads, t, t))?;
        let s = match win.mask() {
            Some(mask) => s.broadcast_add(mask)?,
            None => s,
        };
        let p = candle_nn::ops::softmax_last_dim(&s)?;
        self.mark("softmax")?;
        let o = p.matmul(&v)?;
        self.mark("pv_gemm")?;
        // [windows, heads, T, hd] -> [windows, T, heads, hd] -> tokens.
        let o = o.transpose(1, 2)?.reshape((rows, c3 / 3))?;
        self.mark("head_merge")?;
        Ok(o)
    }

    fn unpartition_add_norm(
        &self,
        x: &Tensor,
        branch: &Tensor,
        _norm2: &Affine,
        win: &Windowing,
    ) -> Result<(Tensor, Tensor)> {
        let x = (x + unpartition(branch, win)?)?;
        let h = self.layer_norm(&x)?;
        self.mark("unpartition_add_norm")?;
        Ok((x, h))
    }

    fn proj(&self, o: &Tensor, w: &BlockWeights, _win: &Windowing) -> Result<Tensor> {
        let a = matmul_t(o, &w.proj_w)?;
        self.mark("proj_gemm")?;
        let a = a.broadcast_add(&w.proj_b)?;
        self.mark("proj_bias")?;
        Ok(a)
    }

    fn mlp(&self, h: &Tensor, w: &BlockWeights) -> Result<Tensor> {
        let a = matmul_t(h, &w.fc1_w)?;
        self.mark("fc1_gemm")?;
        let a = a.broadcast_add(&w.fc1_b)?.gelu_erf()?;
        self.mark("bias_gelu")?;
        let m = matmul_t(&a, &w.fc2_w)?;
        self.mark("fc2_gemm")?;
        let m = m.broadcast_add(&w.fc2_b)?;
        self.mark("fc2_bias")?;
        Ok(m)
    }

    fn add(&self, x: &Tensor, d: &Tensor) -> Result<Tensor> {
        let y = (x + d)?;
        self.mark("add")?;
        Ok(y)
    }

    fn partition(&self, x: &Tensor, win: &Windowing) -> Result<Tensor> {
        let h = partition(x, win)?;
        self.mark("partition")?;
        Ok(h)
    }

    fn unpartition_norm_add(
        &self,
        x: &Tensor,
        branch: &Tensor,
        norm1: &Affine,
        win: &Windowing,
    ) -> Result<Tensor> {
        let r = affine_layer_norm(&unpartition(branch, win)?, norm1)?;
        self.mark("unpartition_norm")?;
        self.add(x, &r)
    }

    fn mlp_norm_add(&self, x: &Tensor, w: &BlockWeights) -> Result<Tensor> {
        let a = matmul_t(x, &w.fc1.w)?;
        self.mark("fc1_gemm")?;
        let a = a.broadcast_add(&w.fc1.b)?.gelu_erf()?;
        self.mark("bias_gelu")?;
        let m = matmul_t(&a, &w.fc2_w)?;
        self.mark("fc2_gemm")?;
        let m = m.broadcast_add(&w.fc2_b)?;
        self.mark("fc2_bias")?;
        let r = affine_layer_norm(&m, &w.norm2)?;
        self.mark("norm")?;
        self.add(x, &r)
    }
}
