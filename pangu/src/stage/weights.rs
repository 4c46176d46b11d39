//! The stage's parameters: names in the weight file, loading (norm2's affine
//! folded into the MLP's first Linear), and seeded random weights for tests.
//!
//! File layout (safetensors, every tensor f16; the PyTorch reference writes
//! the same names): `x` `[Z, H, W, C]` (the stage input), and per block
//! `b{i}.`: `norm1.weight`, `norm1.bias` `[C]`; `qkv.weight` `[3C, C]`,
//! `qkv.bias` `[3C]`; `earth_bias` `[(2 ww - 1) wh^2 wz^2, types, heads]`
//! (Pangu's table, indexed through the position index); `proj.weight`
//! `[C, C]`, `proj.bias` `[C]`; `norm2.weight`, `norm2.bias` `[C]`;
//! `fc1.weight` `[4C, C]`, `fc1.bias` `[4C]`; `fc2.weight` `[C, 4C]`,
//! `fc2.bias` `[C]`. Linear weights are PyTorch's `[out, in]`.
use super::config::StageConfig;
use super::ops::Affine;
use super::tables::{Windowing, bias_table_rows, expand_earth_bias};
use candle_core::{DType, Device, Result, Tensor};
use std::collections::HashMap;

/// A block's earth-specific bias as the attention adds it, `[types,
/// heads, T, T]`: kept so, or kept as Pangu's table and expanded at each
/// use, so that one block's expanded bias (31 MB at the released grid and
/// f16) lives only while that block's attention runs, not all sixteen
/// for the network's lifetime.
#[derive(Debug)]
pub enum EarthBias {
    /// Expanded once, `[types, heads, T, T]`.
    Expanded(Tensor),
    /// The table, transposed to `[types * heads, rows]`, and the position
    /// index `[T * T]` (u32) that expands it.
    Table {
        /// `[types * heads, rows]`, contiguous.
        table: Tensor,
        /// `[T * T]` table rows, u32.
        index: Tensor,
        /// Window types.
        types: usize,
        /// Heads.
        heads: usize,
        /// Tokens per window, T.
        tokens: usize,
    },
}

impl EarthBias {
    /// The bias `[types, heads, T, T]`, contiguous: the kept tensor, or a
    /// fresh expansion of the table (one gather).
    pub fn expanded(&self) -> Result<Tensor> {
        match self {
            EarthBias::Expanded(t) => Ok(t.clone()),
            EarthBias::Table {
                table,
                index,
                types,
                heads,
                tokens,
            } => table
                .index_select(index, 1)?
                .reshape((*types, *heads, *tokens, *tokens)),
        }
    }
}

/// One block's parameters as the stage runs them (the stage's dtype, on its
/// device).
#[derive(Debug)]
pub struct BlockWeights {
    /// norm1's affine (kept: see [`crate::stage::StageOps::norm_partition`]).
    pub norm1: Affine,
    /// QKV weight `[3C, C]`.
    pub qkv_w: Tensor,
    /// QKV bias `[3C]`.
    pub qkv_b: Tensor,
    /// Earth-specific bias (see [`EarthBias`]).
    pub earth_bias: EarthBias,
    /// Output projection `[C, C]`.
    pub proj_w: Tensor,
    /// Output projection bias `[C]`.
    pub proj_b: Tensor,
    /// norm2's affine (unfolded: what the wavefuse build's LayerNorm
    /// applies; the candle build folds it into `fc1_w`, `fc1_b`).
    pub norm2: Affine,
    /// MLP first Linear `[4C, C]` with norm2's gamma folded in.
    pub fc1_w: Tensor,
    /// MLP first bias `[4C]` with norm2's beta folded in.
    pub fc1_b: Tensor,
    /// MLP second Linear `[C, 4C]`.
    pub fc2_w: Tensor,
    /// MLP second bias `[C]`.
    pub fc2_b: Tensor,
    /// The MLP's first Linear as trained (norm2 not folded), for the
    /// wavefuse build (see [`Fc1`]).
    pub fc1: Fc1,
}

/// The MLP's first Linear as trained, for a build whose LayerNorm applies
/// norm2's affine (no folded weights rounded to f16), and a zero bias for
/// the GELU that follows a Linear with its bias in the GEMM's epilogue
/// (`bias_gelu` with a zero bias is the GELU of its input, rounded once).
#[derive(Debug)]
pub struct Fc1 {
    /// `[4C, C]`.
    pub w: Tensor,
    /// `[4C]`.
    pub b: Tensor,
    /// `[4C]` zeros.
    pub zero: Tensor,
}

fn get<'a>(t: &'a HashMap<String, Tensor>, name: &str, dims: &[usize]) -> Result<&'a Tensor> {
    let v = t
        .get(name)
        .ok_or_else(|| candle_core::Error::Msg(format!("weights: `{name}` missing")))?;
    if v.dims() != dims {
        candle_core::bail!("weights: `{name}` is {:?}, expected {dims:?}", v.dims());
    }
    Ok(v)
}

/// `LayerNorm(x) * gamma + beta` followed by `W . + b` equals the plain
/// LayerNorm followed by `(W diag(gamma)) . + (b + W beta)`: folded in f32,
/// rounded once to the stage's dtype (f64 when that is f64).
pub(crate) fn fold_layer_norm(
    gamma: &Tensor,
    beta: &Tensor,
    w: &Tensor,
    b: &Tensor,
) -> Result<(Tensor, Tensor)> {
    let f = |x: &Tensor| x.to_dtype(DType::F64);
    let (gamma, beta, w, b) = (f(gamma)?, f(beta)?, f(w)?, f(b)?);
    let wf = w.broadcast_mul(&gamma.unsqueeze(0)?)?;
    let bf = (b + w.matmul(&beta.unsqueeze(1)?)?.squeeze(1)?)?;
    Ok((wf, bf))
}

impl BlockWeights {
    /// Block `i`'s parameters from `t` (on any device), folded, converted
    /// to `dtype` and moved to `device`.
    pub fn load(
        t: &HashMap<String, Tensor>,
        i: usize,
        cfg: &StageConfig,
        win: &Windowing,
        device: &Device,
        dtype: DType,
    ) -> Result<BlockWeights> {
        let c = cfg.dim;
        let hid = cfg.hidden();
        let n = |s: &str| format!("b{i}.{s}");
        let dev = |x: &Tensor| x.to_dtype(dtype)?.to_device(device);
        let (fc1_w, fc1_b) = fold_layer_norm(
            get(t, &n("norm2.weight"), &[c])?,
            get(t, &n("norm2.bias"), &[c])?,
            get(t, &n("fc1.weight"), &[hid, c])?,
            get(t, &n("fc1.bias"), &[hid])?,
        )?;
        let table = get(
            t,
            &n("earth_bias"),
            &[bias_table_rows(cfg.window), win.n_types(), cfg.heads],
        )?;
        let (fc1_w, fc1_b) = (dev(&fc1_w)?, dev(&fc1_b)?);
        let fc2_w = dev(get(t, &n("fc2.weight"), &[c, hid])?)?;
        let fc2_b = dev(get(t, &n("fc2.bias"), &[c])?)?;
        // The wavefuse build keeps norm2's affine in its LayerNorm kernel
        // (free there) and the first Linear as trained: no folded weights
        // rounded to f16.
        let fc1 = Fc1 {
            w: dev(get(t, &n("fc1.weight"), &[hid, c])?)?,
            b: dev(get(t, &n("fc1.bias"), &[hid])?)?,
            zero: Tensor::zeros(hid, dtype, device)?,
        };
        let norm2 = Affine::new(
            dev(get(t, &n("norm2.weight"), &[c])?)?,
            dev(get(t, &n("norm2.bias"), &[c])?)?,
        )?;
        Ok(BlockWeights {
            norm2,
            norm1: Affine::new(
                dev(get(t, &n("norm1.weight"), &[c])?)?,
                dev(get(t, &n("norm1.bias"), &[c])?)?,
            )?,
            qkv_w: dev(get(t, &n("qkv.weight"), &[3 * c, c])?)?,
            qkv_b: dev(get(t, &n("qkv.bias"), &[3 * c])?)?,
            earth_bias: EarthBias::Expanded(dev(&expand_earth_bias(table, cfg.window)?)?),
            proj_w: dev(get(t, &n("proj.weight"), &[c, c])?)?,
            proj_b: dev(get(t, &n("proj.bias"), &[c])?)?,
            fc1_w,
            fc1_b,
            fc2_w,
            fc2_b,
            fc1,
        })
    }
}

/// xorshift64* (tests and the CPU example: no rand dependency).
struct Rng(u64);

impl Rng {
    fn next_f32(&mut self) -> f32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let r = self.0.wrapping_mul(0x2545_F491_4F6C_DD1D);
        // 24 random bits -> [0, 1).
        (r >> 40) as f32 / (1u64 << 24) as f32
    }

    /// Uniform in `[-a, a)`, rounded to f16.
    fn tensor(&mut self, dims: &[usize], center: f32, a: f32) -> Result<Tensor> {
        let n: usize = dims.iter().product();
        let v: Vec<half::f16> = (0..n)
            .map(|_| half::f16::from_f32(center + a * (2.0 * self.next_f32() - 1.0)))
            .collect();
        Tensor::from_vec(v, dims, &Device::Cpu)
    }
}

/// Seeded random stage weights and input in the file layout, on the CPU.
/// Linear weights uniform in `+-1/sqrt(in)` (PyTorch's default range),
/// LayerNorm gamma `1 +- 0.5` and beta `+-0.5` (so a wrong fold shows),
/// earth bias `+-bias_range`, input uniform `+-2`.
pub fn random_weights(
    cfg: &StageConfig,
    seed: u64,
    bias_range: f32,
) -> Result<HashMap<String, Tensor>> {
    let mut r = Rng(seed.max(1));
    let (c, hid) = (cfg.dim, cfg.hidden());
    let win = Windowing::new(cfg.grid, cfg.window, cfg.shift, &Device::Cpu, DType::F16)?;
    let mut t = HashMap::new();
    let g = cfg.grid;
    t.insert("x".to_string(), r.tensor(&[g.z, g.h, g.w, c], 0.0, 2.0)?);
    let lin = |r: &mut Rng,
               t: &mut HashMap<String, Tensor>,
               name: String,
               o: usize,
               i: usize|
     -> Result<()> {
        let a = 1.0 / (i as f32).sqrt();
        t.insert(format!("{name}.weight"), r.tensor(&[o, i], 0.0, a)?);
        t.insert(format!("{name}.bias"), r.tensor(&[o], 0.0, a)?);
        Ok(())
    };
    for i in 0..2 {
        for norm in ["norm1", "norm2"] {
            t.insert(format!("b{i}.{norm}.weight"), r.tensor(&[c], 1.0, 0.5)?);
            t.insert(format!("b{i}.{norm}.bias"), r.tensor(&[c], 0.0, 0.5)?);
        }
        lin(&mut r, &mut t, format!("b{i}.qkv"), 3 * c, c)?;
        lin(&mut r, &mut t, format!("b{i}.proj"), c, c)?;
        lin(&mut r, &mut t, format!("b{i}.fc1"), hid, c)?;
        lin(&mut r, &mut t, format!("b{i}.fc2"), c, hid)?;
        t.insert(
            format!("b{i}.earth_bias"),
            r.tensor(
                &[bias_table_rows(cfg.window), win.n_types(), cfg.heads],
                0.0,
                bias_range,
            )?,
        );
    }
    Ok(t)
}
