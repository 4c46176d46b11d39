//! The stage with wavefuse's kernels wherever one applies, on candle's
//! stream and candle's memory (the crate's ops); the GEMMs stay cuBLAS:
//! the Linears are [`wavefuse_candle::linear`] (cuBLASLt with the bias in the
//! epilogue, one f16 rounding as PyTorch's `F.linear`), the attention's
//! in the unfused variant candle's.
//!
//! | step | wavefuse kernels |
//! |---|---|
//! | `norm_partition` | `layer_norm_gather` (affine) through the partition plan |
//! | `add_norm_partition` | `add_layer_norm_gather` (affine; residual updated in place) |
//! | `qkv` | [`wavefuse_candle::linear`] (bias in the epilogue) |
//! | `attention` | `window_attention` (scale, earth bias, shift mask, softmax and `p v` in one launch, heads merged; no scores in memory). [`WavefuseOps::unfused`]: `qkv_split` (q scaled); candle's `q k^T`; `bias_mask_softmax` in place over the scores; candle's `p v`; `gather` through the head-merge plan (32-channel tokens `[w, h, t]` -> `[w, t, h]`) |
//! | `unpartition_add_norm` | `gather` through the reverse plan, `add_layer_norm_to` with norm2's affine (the stage input is never written) |
//! | `proj` | [`wavefuse_candle::linear`] |
//! | `mlp` | [`wavefuse_candle::linear`] (the first Linear as trained), `bias_gelu` (erf) with a zero bias, [`wavefuse_candle::linear`] |
//! | `add` | `add_layer_norm` in place (its LayerNorm output unused) |
//!
//! Launches per block: 5 wavefuse kernels and 4 cuBLASLt GEMMs (unfused:
//! 7 wavefuse kernels, 4 cuBLASLt and 2 candle GEMMs), plus the stage's
//! last add. No candle element-wise op runs: candle's broadcast and
//! strided ops upload their layout with every launch.
//!
//! Rounding: every step rounds to f16 where PyTorch's f16 stage does, or
//! fewer times (the attention keeps its scores in f32); no step rounds
//! twice where PyTorch rounds once (`benches/pangu_rounding.py`).
use super::config::{HEAD_DIM, LN_EPS};
use super::ops::{Affine, StageOps};
use super::probe::Probe;
use super::tables::Windowing;
use super::weights::BlockWeights;
use candle_core::{Result, Tensor};
use std::sync::OnceLock;
use wavefuse_candle::{AttnTables, GeluMode, Plan};

/// The wavefuse build's plans and tables for one windowing (built once,
/// kept in the [`Windowing`]).
#[derive(Debug)]
pub struct Tables {
    pub(crate) partition: Plan,
    pub(crate) reverse: Plan,
    pub(crate) attn: AttnTables,
    /// The head-merge plan and its number of heads.
    merge: OnceLock<(usize, Plan)>,
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
        })
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
    /// Row chunks of a post-norm block's MLP half (0 and 1: none).
    mlp_chunks: usize,
}

/// Rows per chunk when `rows` are cut into `chunks`: a multiple of 128, so
/// that every chunk starts on a 256-byte boundary at any width (the
/// kernels' and cuBLASLt's alignment), and `rows` itself for 0 or 1 chunk.
fn chunk_rows(rows: usize, chunks: usize) -> usize {
    if chunks <= 1 {
        return rows.max(1);
    }
    rows.div_ceil(chunks).div_ceil(128).max(1) * 128
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

    /// The same with a post-norm block's MLP half run over `chunks` row
    /// chunks: the `[rows, 4C]` hidden tensor, the largest of the block,
    /// then lives for one chunk's rows at a time (every op of that half is
    /// row-local, so the output's bits do not depend on `chunks`).
    pub fn with_mlp_chunks(mut self, chunks: usize) -> WavefuseOps {
        self.mlp_chunks = chunks;
        self
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
        let h = wavefuse_candle::layer_norm_gather(x, &t.partition, Some(&norm.packed), LN_EPS)?;
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
        let h =
            wavefuse_candle::add_layer_norm_gather(x, d, &t.partition, Some(&norm.packed), LN_EPS)?;
        self.mark("add_norm_partition")?;
        Ok((x.clone(), h))
    }

    fn qkv<'w>(&self, h: &Tensor, w: &'w BlockWeights) -> Result<(Tensor, Option<&'w Tensor>)> {
        Ok((wavefuse_candle::linear(h, &w.qkv_w, &w.qkv_b)?, None))
    }

    fn attention(
        &self,
        qkv: &Tensor,
        qkv_bias: Option<&Tensor>,
        earth_bias: &Tensor,
        heads: usize,
        win: &Windowing,
    ) -> Result<Tensor> {
        let tb = win.wavefuse()?;
        let scale = (HEAD_DIM as f64).powf(-0.5) as f32;
        if !self.unfused {
            let o = wavefuse_candle::window_attention(
                qkv, qkv_bias, earth_bias, &tb.attn, heads, scale,
            )?;
            self.mark("window_attention")?;
            return Ok(o);
        }
        let merge = tb.merge(win, heads)?;
        let (rows, c3) = qkv.dims2()?;
        let t = win.tokens_per_window();
        let (q, k, v) = wavefuse_candle::qkv_split(qkv, qkv_bias, heads, t, scale)?;
        self.mark("qkv_split")?;
        let s = q.matmul(&k.t()?)?;
        self.mark("scores_gemm")?;
        wavefuse_candle::bias_mask_softmax_(&s, earth_bias, &tb.attn)?;
        self.mark("softmax")?;
        let o = s.matmul(&v)?;
        self.mark("pv_gemm")?;
        let o = wavefuse_candle::gather(&o.reshape((rows * heads, HEAD_DIM))?, merge)?;
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
        let g = wavefuse_candle::gather(branch, &t.reverse)?;
        let r = wavefuse_candle::add_layer_norm_to(x, &g, Some(&norm2.packed), LN_EPS)?;
        self.mark("unpartition_add_norm")?;
        Ok(r)
    }

    fn proj(&self, o: &Tensor, w: &BlockWeights, _win: &Windowing) -> Result<Tensor> {
        let a = wavefuse_candle::linear(o, &w.proj_w, &w.proj_b)?;
        self.mark("proj_gemm")?;
        Ok(a)
    }

    fn mlp(&self, h: &Tensor, w: &BlockWeights) -> Result<Tensor> {
        // The first Linear's output is freed as soon as the GELU has read it.
        let a = {
            let a = wavefuse_candle::linear(h, &w.fc1.w, &w.fc1.b)?;
            self.mark("fc1_gemm")?;
            // The bias is in: a zero bias leaves `gelu(a)`, rounded once.
            wavefuse_candle::bias_gelu(&a, &w.fc1.zero, GeluMode::Erf)?
        };
        self.mark("gelu")?;
        let y = wavefuse_candle::linear(&a, &w.fc2_w, &w.fc2_b)?;
        self.mark("fc2_gemm")?;
        Ok(y)
    }

    fn add(&self, x: &Tensor, d: &Tensor) -> Result<Tensor> {
        // add_layer_norm in place; its LayerNorm output is not needed, but
        // the kernel still beats candle's add.
        wavefuse_candle::add_layer_norm(x, d, None, LN_EPS)?;
        self.mark("add")?;
        Ok(x.clone())
    }

    fn partition(&self, x: &Tensor, win: &Windowing) -> Result<Tensor> {
        let t = win.wavefuse()?;
        let h = wavefuse_candle::gather(x, &t.partition)?;
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
        let t = win.wavefuse()?;
        let r =
            wavefuse_candle::layer_norm_gather(branch, &t.reverse, Some(&norm1.packed), LN_EPS)?;
        self.mark("unpartition_norm")?;
        // `r` is fresh: the sum goes into it (f16 addition commutes, so
        // the bits are those of `x + r`), and `x` is left as it was.
        self.add(&r, x)
    }

    fn mlp_norm_add(&self, x: &Tensor, w: &BlockWeights) -> Result<Tensor> {
        let rows = x.dim(0)?;
        let step = chunk_rows(rows, self.mlp_chunks);
        if step >= rows {
            let m = self.mlp(x, w)?;
            let r = wavefuse_candle::layer_norm(&m, Some(&w.norm2.packed), LN_EPS)?;
            self.mark("norm")?;
            // `r` is fresh: the sum goes into it (f16 addition commutes).
            return self.add(&r, x);
        }
        let mut start = 0;
        while start < rows {
            let n = step.min(rows - start);
            // A view of x's rows: the chunk's MLP reads them, then its sum
            // is written back over them (one stream orders the two; no
            // other chunk reads these rows).
            let xc = x.narrow(0, start, n)?;
            let r = {
                let m = self.mlp(&xc, w)?;
                wavefuse_candle::layer_norm(&m, Some(&w.norm2.packed), LN_EPS)?
            };
            self.mark("norm")?;
            self.add(&xc, &r)?;
            start += n;
        }
        Ok(x.clone())
    }
}
