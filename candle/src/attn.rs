//! Attention-score ops: earth-specific bias + shift mask added to the
//! scores, alone or fused with the softmax, as candle ops.
//!
//! [`AttnTables`] hold what depends only on the windowing: the window ->
//! bias-type table, and for a shifted block the window -> mask-slot table
//! with the deduplicated masks (0 / -100, exact in f16) and, when the masks
//! are region masks (the planner's are), their region labels, which the
//! fused window attention reads instead of the tiles. They are built
//! once per windowing on the wavefuse device behind one candle device and
//! shared by every launch. The bias `[types, heads, T, T]` is an operand
//! (a weight, in candle's memory).
use crate::runner::{DevKey, Operand, Path, wf_device, wf_err};
use candle_core::{Device, Layout, Result, Shape, Tensor};
use std::sync::Arc;
use wavefuse::{AttnBias, AttnMask, RegionLabels, RegionMask, WindowBias, WindowTable, f16};
use wavefuse_shared::window::WindowPlan;

#[derive(Debug)]
struct Mask {
    slot: WindowTable,
    masks: wavefuse::DeviceBuffer<f16>,
    /// The masks' region labels; `None` when they are not region masks.
    labels: Option<RegionLabels>,
}

/// The window tables of one windowing on one device.
#[derive(Clone, Debug)]
pub struct AttnTables {
    ty: Arc<WindowTable>,
    mask: Option<Arc<Mask>>,
    tokens: usize,
    key: DevKey,
}

impl AttnTables {
    /// `types[w]` in `0..n_types` for each window; for a shifted block,
    /// `slots[w]` in `0..n_slots` and the masks `[n_slots, T, T]` (f32
    /// values, converted to f16: 0 and -100 are exact). `tokens` is `T`.
    pub fn new(
        types: &[i32],
        n_types: usize,
        mask: Option<(&[i32], usize, &[f32])>,
        tokens: usize,
        device: &Device,
    ) -> Result<AttnTables> {
        const OP: &str = "wavefuse-attn_tables";
        let key = DevKey::of(device)?;
        let dev = wf_device(key)?;
        let e = wf_err(OP);
        let ty = WindowTable::new(&dev, types, n_types).map_err(&e)?;
        let mask = match mask {
            None => None,
            Some((slots, n_slots, values)) => {
                if slots.len() != types.len() {
                    candle_core::bail!(
                        "{OP}: {} slot entries for {} windows",
                        slots.len(),
                        types.len()
                    );
                }
                if n_slots
                    .checked_mul(tokens)
                    .and_then(|n| n.checked_mul(tokens))
                    .is_none_or(|n| n != values.len())
                {
                    candle_core::bail!(
                        "{OP}: {} mask values, expected {n_slots} x {tokens}^2",
                        values.len()
                    );
                }
                let halves: Vec<f16> = values.iter().map(|&v| f16::from_f32(v)).collect();
                Some(Arc::new(Mask {
                    slot: WindowTable::new(&dev, slots, n_slots).map_err(&e)?,
                    masks: dev.upload(&halves).map_err(&e)?,
                    labels: RegionLabels::from_mask(&dev, values, tokens).ok(),
                }))
            }
        };
        Ok(AttnTables {
            ty: Arc::new(ty),
            mask,
            tokens,
            key,
        })
    }

    /// The tables of a window plan: Pangu's window types, and the shift
    /// masks when the plan is shifted.
    pub fn from_plan(plan: &WindowPlan, device: &Device) -> Result<AttnTables> {
        let types = plan.window_type_table();
        let t = plan.tokens_per_window();
        if plan.is_shifted() {
            let s = plan.mask_slots();
            let m = (&s.window_to_slot[..], s.n_slots, &s.slot_masks[..]);
            AttnTables::new(&types, plan.n_window_types(), Some(m), t, device)
        } else {
            AttnTables::new(&types, plan.n_window_types(), None, t, device)
        }
    }

    /// Windows.
    pub fn windows(&self) -> usize {
        self.ty.len()
    }

    /// Bias types.
    pub fn n_types(&self) -> usize {
        self.ty.bound()
    }

    /// Tokens per window.
    pub fn tokens(&self) -> usize {
        self.tokens
    }

    /// Whether a shift mask is added.
    pub fn has_mask(&self) -> bool {
        self.mask.is_some()
    }

    /// Heads of `scores` `[windows, heads, T, T]` after checking it and
    /// `bias` `[types, heads, T, T]` against the tables.
    fn heads(&self, op: &'static str, scores: &Layout, bias: &Layout) -> Result<usize> {
        let (w, t) = (self.windows(), self.tokens);
        let heads = match *scores.dims() {
            [sw, h, t1, t2] if sw == w && t1 == t && t2 == t && h > 0 => h,
            _ => candle_core::bail!(
                "{op}: `scores` is {:?}, expected [{w}, heads, {t}, {t}] (the tables' windows)",
                scores.dims()
            ),
        };
        if bias.dims() != [self.n_types(), heads, t, t] {
            candle_core::bail!(
                "{op}: `bias` is {:?}, expected [{}, {heads}, {t}, {t}]",
                bias.dims(),
                self.n_types()
            );
        }
        Ok(heads)
    }

    fn check_device(&self, op: &'static str, t: &Tensor) -> Result<()> {
        if DevKey::of(t.device())? != self.key {
            candle_core::bail!(
                "{op}: the tables are for {:?}, `scores` is on {:?}",
                self.key,
                t.device().location()
            );
        }
        Ok(())
    }

    /// wavefuse's view of the tables with `bias`.
    fn attn<'a>(
        &'a self,
        bias: &'a wavefuse::View<'a, f16>,
        mask: &'a Option<wavefuse::View<'a, f16>>,
    ) -> AttnBias<'a> {
        AttnBias {
            bias,
            ty: &self.ty,
            mask: match (&self.mask, mask) {
                (Some(m), Some(v)) => Some(AttnMask {
                    mask: v,
                    slot: &m.slot,
                }),
                _ => None,
            },
        }
    }

    /// wavefuse's view of the tables with `bias` for the fused window
    /// attention (the mask as region labels).
    fn window_bias<'a>(
        &'a self,
        bias: &'a wavefuse::View<'a, f16>,
    ) -> wavefuse::Result<WindowBias<'a>> {
        let mask = match &self.mask {
            None => None,
            Some(m) => match &m.labels {
                Some(labels) => Some(RegionMask {
                    labels,
                    slot: &m.slot,
                }),
                None => {
                    return Err(wavefuse::Error::BadParameter {
                        op: ATTN,
                        what: "mask",
                        value: "the tables' masks".into(),
                        why: "not region masks (0 within a region, -100 across): the fused \
                              attention reads them as region labels",
                    });
                }
            },
        };
        Ok(WindowBias {
            bias,
            ty: &self.ty,
            mask,
        })
    }

    fn mask_view(&self) -> Option<wavefuse::View<'_, f16>> {
        self.mask.as_ref().map(|m| m.masks.view())
    }
}

/// `scores += bias[type(w)] + mask[slot(w)]` in place, rounded once:
/// `InplaceOp2` on `scores` `[windows, heads, T, T]` with `bias`
/// `[types, heads, T, T]`.
#[derive(Clone, Debug)]
pub struct BiasMaskAdd {
    tables: AttnTables,
}

const ADD: &str = "wavefuse-bias_mask_add";

impl BiasMaskAdd {
    /// The op for `tables`.
    pub fn new(tables: &AttnTables) -> BiasMaskAdd {
        BiasMaskAdd {
            tables: tables.clone(),
        }
    }

    fn fwd_inplace<P: Path>(
        &self,
        s: &mut P::S,
        sl: &Layout,
        ins: &[Operand<'_, P::S>],
    ) -> Result<()> {
        let heads = self.tables.heads(ADD, sl, ins[0].l)?;
        let t = self.tables.tokens;
        P::run(ADD, ins, Some((s, sl, "scores")), &[], |io| {
            let bias = io.input::<f16>(0, 0, None)?;
            let mask = self.tables.mask_view();
            let ab = self.tables.attn(&bias, &mask);
            let mut s = io.inout()?;
            wavefuse::bias_mask_add(io.q, &mut s, heads, t, &ab)
        })?;
        Ok(())
    }
}

inplace_op!(BiasMaskAdd, ADD, InplaceOp2, ["bias"]);

/// `scores += bias[type(w)] + mask[slot(w)]` in place (see [`BiasMaskAdd`]).
pub fn bias_mask_add(scores: &Tensor, bias: &Tensor, tables: &AttnTables) -> Result<()> {
    tables.check_device(ADD, scores)?;
    scores.inplace_op2(bias, &BiasMaskAdd::new(tables))
}

/// `softmax(scores + bias[type(w)] + mask[slot(w)])` over the last axis,
/// T = 144: `CustomOp2` on `scores` and `bias` (a fresh output), or
/// `InplaceOp2` on `scores` with `bias` (the probabilities over the
/// scores).
#[derive(Clone, Debug)]
pub struct BiasMaskSoftmax {
    tables: AttnTables,
}

const SOFTMAX: &str = "wavefuse-bias_mask_softmax";

impl BiasMaskSoftmax {
    /// The op for `tables`.
    pub fn new(tables: &AttnTables) -> BiasMaskSoftmax {
        BiasMaskSoftmax {
            tables: tables.clone(),
        }
    }

    fn fwd<P: Path>(&self, ins: &[Operand<'_, P::S>]) -> Result<(P::S, Shape)> {
        let heads = self.tables.heads(SOFTMAX, ins[0].l, ins[1].l)?;
        let t = self.tables.tokens;
        let n = ins[0].l.shape().elem_count();
        let mut o = P::run(SOFTMAX, ins, None, &[n], |io| {
            let s = io.input::<f16>(0, 0, None)?;
            let bias = io.input::<f16>(1, 0, None)?;
            let mask = self.tables.mask_view();
            let ab = self.tables.attn(&bias, &mask);
            let mut p = io.output(0, &[n])?;
            wavefuse::bias_mask_softmax(io.q, &s, &mut p[0], heads, t, &ab)
        })?;
        Ok((o.remove(0), ins[0].l.shape().clone()))
    }

    fn fwd_inplace<P: Path>(
        &self,
        s: &mut P::S,
        sl: &Layout,
        ins: &[Operand<'_, P::S>],
    ) -> Result<()> {
        let heads = self.tables.heads(SOFTMAX, sl, ins[0].l)?;
        let t = self.tables.tokens;
        P::run(SOFTMAX, ins, Some((s, sl, "scores")), &[], |io| {
            let bias = io.input::<f16>(0, 0, None)?;
            let mask = self.tables.mask_view();
            let ab = self.tables.attn(&bias, &mask);
            let mut s = io.inout()?;
            wavefuse::bias_mask_softmax_inplace(io.q, &mut s, heads, t, &ab)
        })?;
        Ok(())
    }
}

custom_op!(BiasMaskSoftmax, SOFTMAX, CustomOp2, ["scores", "bias"]);
inplace_op!(BiasMaskSoftmax, SOFTMAX, InplaceOp2, ["bias"]);

/// The attention probabilities as a fresh tensor (see [`BiasMaskSoftmax`]).
pub fn bias_mask_softmax(scores: &Tensor, bias: &Tensor, tables: &AttnTables) -> Result<Tensor> {
    tables.check_device(SOFTMAX, scores)?;
    scores.apply_op2_no_bwd(bias, &BiasMaskSoftmax::new(tables))
}

/// The attention probabilities written over `scores` (see
/// [`BiasMaskSoftmax`]).
pub fn bias_mask_softmax_(scores: &Tensor, bias: &Tensor, tables: &AttnTables) -> Result<()> {
    tables.check_device(SOFTMAX, scores)?;
    scores.inplace_op2(bias, &BiasMaskSoftmax::new(tables))
}

/// Fused window attention from the QKV Linear's output
/// ([`wavefuse::window_attention`]): `qkv` `[windows * T, 3C]` (per token
/// `[q | k | v]`, heads major; T = 144, 32 channels per head) ->
/// `[windows * T, C]`, heads merged, `softmax(scale q k^T + mask + bias) v`
/// with no scores in memory. `CustomOp2` on `qkv` and the earth bias
/// `[types, heads, T, T]`, or `CustomOp3` on `qkv`, its bias `[3C]` (added
/// and rounded to f16 first) and the earth bias.
#[derive(Clone, Debug)]
pub struct WindowAttention {
    tables: AttnTables,
    heads: usize,
    scale: f32,
}

const ATTN: &str = "wavefuse-window_attention";

impl WindowAttention {
    /// The op for `tables`, `heads` heads of 32 channels, factor `scale`
    /// on `q k^T`.
    pub fn new(tables: &AttnTables, heads: usize, scale: f32) -> WindowAttention {
        WindowAttention {
            tables: tables.clone(),
            heads,
            scale,
        }
    }

    fn fwd<P: Path>(&self, ins: &[Operand<'_, P::S>]) -> Result<(P::S, Shape)> {
        let (w, t, heads) = (self.tables.windows(), self.tables.tokens, self.heads);
        // `3 * heads * HEAD_DIM` columns must be a size at all (`w * t` is
        // the tables' own, built from a real plan).
        let Some(c) = heads.checked_mul(3 * crate::HEAD_DIM).map(|c3| c3 / 3) else {
            candle_core::bail!("{ATTN}: {heads} heads is more than any tensor holds");
        };
        let l = ins[0].l;
        if l.dims() != [w * t, 3 * c] {
            candle_core::bail!(
                "{ATTN}: `qkv` is {:?}, expected [{}, {}] ({w} windows of {t}, {heads} heads of {})",
                l.dims(),
                w * t,
                3 * c,
                crate::HEAD_DIM
            );
        }
        let with_bias = ins.len() == 3;
        if with_bias && ins[1].l.dims() != [3 * c] {
            candle_core::bail!(
                "{ATTN}: `qkv_bias` is {:?}, expected [{}]",
                ins[1].l.dims(),
                3 * c
            );
        }
        let bl = ins[ins.len() - 1].l;
        if bl.dims() != [self.tables.n_types(), heads, t, t] {
            candle_core::bail!(
                "{ATTN}: `bias` is {:?}, expected [{}, {heads}, {t}, {t}]",
                bl.dims(),
                self.tables.n_types()
            );
        }
        let p = wavefuse::WindowAttention {
            heads,
            head_dim: crate::HEAD_DIM,
            tokens_per_window: t,
            scale: self.scale,
        };
        let n = w * t * c;
        let mut o = P::run(ATTN, ins, None, &[n], |io| {
            let qkv = io.input::<f16>(0, 0, None)?;
            let qb = if with_bias {
                Some(io.input::<f16>(1, 0, None)?)
            } else {
                None
            };
            let bias = io.input::<f16>(ins.len() - 1, 0, None)?;
            let ab = self.tables.window_bias(&bias)?;
            let mut out = io.output(0, &[n])?;
            wavefuse::window_attention(io.q, &qkv, qb.as_ref(), &ab, &mut out[0], &p)
        })?;
        Ok((o.remove(0), Shape::from((w * t, c))))
    }
}

custom_op!(WindowAttention, ATTN, CustomOp2, ["qkv", "bias"]);
custom_op!(
    WindowAttention,
    ATTN,
    CustomOp3,
    ["qkv", "qkv_bias", "bias"]
);

/// Fused window attention (see [`WindowAttention`]).
pub fn window_attention(
    qkv: &Tensor,
    qkv_bias: Option<&Tensor>,
    earth_bias: &Tensor,
    tables: &AttnTables,
    heads: usize,
    scale: f32,
) -> Result<Tensor> {
    tables.check_device(ATTN, qkv)?;
    let op = WindowAttention::new(tables, heads, scale);
    match qkv_bias {
        None => qkv.apply_op2_no_bwd(earth_bias, &op),
        Some(b) => qkv.apply_op3_no_bwd(b, earth_bias, &op),
    }
}
