//! The stage with wavefuse's kernels wherever one applies, on candle's
//! stream and candle's memory (the crate's ops); the GEMMs stay candle's.
//!
//! | step | wavefuse kernels |
//! |---|---|
//! | `norm_partition` | `layer_norm_gather` (affine) through the partition plan |
//! | `add_norm_partition` | `add_layer_norm_gather` (affine; residual updated in place) |
//! | `attention` | `window_attention` (QKV bias, scale, earth bias, shift mask, softmax and `p v` in one launch, heads merged; no scores in memory). [`WavefuseOps::unfused`]: `qkv_split` (bias added, q scaled); candle's `q k^T`; `bias_mask_softmax` in place over the scores; candle's `p v`; `gather` through the head-merge plan (32-channel tokens `[w, h, t]` -> `[w, t, h]`) |
//! | `unpartition_add_norm` | `gather` through the reverse plan, `add_layer_norm_to` with norm2's affine (the stage input is never written) |
//! | `proj` | candle's GEMM, then `bias_mask_add` as a bias add ([`BiasAdd`]) in place |
//! | `mlp` | candle's GEMMs; `bias_gelu` (erf); the second bias inside the second GEMM ([`crate::pangu::weights::MlpAug`]) |
//! | `add` | `add_layer_norm` in place (its LayerNorm output unused) |
//!
//! Launches per block: 6 wavefuse kernels and 4 candle GEMMs (unfused: 8
//! and 6), plus the stage's last add. No candle element-wise op runs: candle's broadcast
//! and strided ops upload their layout with every launch.
use super::config::{HEAD_DIM, LN_EPS};
use super::ops::{Affine, StageOps, matmul_t};
use super::probe::Probe;
use super::tables::Windowing;
use super::weights::BlockWeights;
use crate::{AttnTables, BiasAdd, GeluMode, Plan};
use candle_core::{Result, Tensor};
use std::sync::OnceLock;

/// The wavefuse build's plans and tables for one windowing (built once,
/// kept in the [`Windowing`]).
#[derive(Debug)]
pub struct Tables {
    partition: Plan,
    reverse: Plan,
    attn: AttnTables,
    /// The head-merge plan and its number of heads.
    merge: OnceLock<(usize, Plan)>,
    /// The output projection's bias add, and the id of the bias tensor
    /// it was built from.
    proj_bias: OnceLock<(candle_core::TensorId, BiasAdd)>,
}

impl Tables {
    pub(crate) fn new(win: &Windowing) -> Result<Tables> {
        let p = win.plan();
        let dev = win.device();
        Ok(Tables {
            partition: Plan::new(&p.partition_table(), p.n_tokens_in(), dev)?,
            reverse: Plan::new(&p.reverse_table(), p.n_tokens_out(), dev)?,
            attn: AttnTables::from_plan(p, dev)?,
            merge: OnceLock::new(),
            proj_bias: OnceLock::new(),
        })
    }

    /// The bias add of `bias` over the windowed tokens, built on first use.
    fn proj_bias(&self, win: &Windowing, bias: &Tensor) -> Result<&BiasAdd> {
        if self.proj_bias.get().is_none() {
            let b = BiasAdd::new(bias, win.n_windows() * win.tokens_per_window())?;
            let _ = self.proj_bias.set((bias.id(), b));
        }
        match self.proj_bias.get() {
            Some((id, b)) if *id == bias.id() => Ok(b),
            _ => {
                candle_core::bail!("windowing: its projection bias add was built for another bias")
            }
        }
    }

    /// The head merge of `p v` for `heads` heads: output token `(w, t, h)`
    /// of 32 channels is source token `(w, h, t)` of `[windows, heads, T,
    /// 32]`. Built on first use.
    fn merge(&self, win: &Windowing, heads: usize) -> Result<&Plan> {
        if self.merge.get().is_none() {
            let (windows, t) = (win.n_windows(), win.tokens_per_window());
            let n = windows * t * heads;
            if n > i32::MAX as usize {
                candle_core::bail!("head merge: {n} tokens overflow the index type");
            }
            let mut table = Vec::with_capacity(n);
            for w in 0..windows {
                for ti in 0..t {
                    for h in 0..heads {
                        table.push(((w * heads + h) * t + ti) as i32);
                    }
                }
            }
            let _ = self.merge.set((heads, Plan::new(&table, n, win.device())?));
        }
        match self.merge.get() {
            Some((h, p)) if *h == heads => Ok(p),
            Some((h, _)) => candle_core::bail!("head merge built for {h} heads, asked for {heads}"),
            None => candle_core::bail!("head merge not built"),
        }
    }
}

/// candle + wavefuse kernels (see the module docs).
#[derive(Debug, Default)]
pub struct WavefuseOps {
    probe: Probe,
    unfused: bool,
}

impl WavefuseOps {
    /// The wavefuse build's ops (attention by `window_attention`).
    pub fn new() -> WavefuseOps {
        WavefuseOps::default()
    }

    /// The same with the attention unfused: `qkv_split`, candle's `q k^T`,
    /// `bias_mask_softmax` in place, candle's `p v`, and a head-merge
    /// `gather` (what the build ran before `window_attention`; kept for
    /// comparison).
    pub fn unfused() -> WavefuseOps {
        WavefuseOps {
            unfused: true,
            ..WavefuseOps::default()
        }
    }

    /// The step timer ([`Probe::start`] before a forward, [`Probe::finish`]
    /// after).
    pub fn probe(&self) -> &Probe {
        &self.probe
    }
}

impl StageOps for WavefuseOps {
    fn name(&self) -> &'static str {
        "wavefuse"
    }

    fn mark(&self, step: &'static str) -> Result<()> {
        self.probe.mark(step)
    }

    fn norm_partition(&self, x: &Tensor, norm: &Affine, win: &Windowing) -> Result<Tensor> {
        let t = win.wavefuse()?;
        let h = crate::layer_norm_gather(x, &t.partition, Some(&norm.packed), LN_EPS)?;
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
        let t = win.wavefuse()?;
        let h = crate::add_layer_norm_gather(x, d, &t.partition, Some(&norm.packed), LN_EPS)?;
        self.mark("add_norm_partition")?;
        Ok((x.clone(), h))
    }

    fn attention(
        &self,
        qkv: &Tensor,
        qkv_bias: &Tensor,
        earth_bias: &Tensor,
        heads: usize,
        win: &Windowing,
    ) -> Result<Tensor> {
        let tb = win.wavefuse()?;
        let scale = (HEAD_DIM as f64).powf(-0.5) as f32;
        if !self.unfused {
            let o =
                crate::window_attention(qkv, Some(qkv_bias), earth_bias, &tb.attn, heads, scale)?;
            self.mark("window_attention")?;
            return Ok(o);
        }
        let merge = tb.merge(win, heads)?;
        let (rows, c3) = qkv.dims2()?;
        let t = win.tokens_per_window();
        let (q, k, v) = crate::qkv_split(qkv, Some(qkv_bias), heads, t, scale)?;
        self.mark("qkv_split")?;
        let s = q.matmul(&k.t()?)?;
        self.mark("scores_gemm")?;
        crate::bias_mask_softmax_(&s, earth_bias, &tb.attn)?;
        self.mark("softmax")?;
        let o = s.matmul(&v)?;
        self.mark("pv_gemm")?;
        let o = crate::gather(&o.reshape((rows * heads, HEAD_DIM))?, merge)?;
        self.mark("head_merge")?;
        o.reshape((rows, c3 / 3))
    }

    fn unpartition_add_norm(
        &self,
        x: &Tensor,
        branch: &Tensor,
        norm2: &Affine,
        win: &Windowing,
    ) -> Result<(Tensor, Tensor)> {
        let t = win.wavefuse()?;
        let g = crate::gather(branch, &t.reverse)?;
        let r = crate::add_layer_norm_to(x, &g, Some(&norm2.packed), LN_EPS)?;
        self.mark("unpartition_add_norm")?;
        Ok(r)
    }

    fn proj(&self, o: &Tensor, w: &BlockWeights, win: &Windowing) -> Result<Tensor> {
        let a = matmul_t(o, &w.proj_w)?;
        self.mark("proj_gemm")?;
        win.wavefuse()?.proj_bias(win, &w.proj_b)?.add_(&a)?;
        self.mark("proj_bias")?;
        Ok(a)
    }

    fn mlp(&self, h: &Tensor, w: &BlockWeights) -> Result<Tensor> {
        let m = &w.mlp_aug;
        let a = matmul_t(h, &m.fc1_w)?;
        self.mark("fc1_gemm")?;
        let a = crate::bias_gelu(&a, &m.fc1_b, GeluMode::Erf)?;
        self.mark("bias_gelu")?;
        // The second bias is in the GEMM (the augmented channel).
        let y = matmul_t(&a, &m.fc2_w)?;
        self.mark("fc2_gemm")?;
        Ok(y)
    }

    fn add(&self, x: &Tensor, d: &Tensor) -> Result<Tensor> {
        // add_layer_norm in place; its LayerNorm output is not needed, but
        // the kernel still beats candle's add.
        crate::add_layer_norm(x, d, None, LN_EPS)?;
        self.mark("add")?;
        Ok(x.clone())
    }
}
