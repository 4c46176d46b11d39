//! LayerNorm, and residual add + LayerNorm (residual updated in place, or
//! written to a fresh tensor), as candle ops.
//!
//! Numerics are wavefuse's ([`wavefuse::layer_norm`],
//! [`wavefuse::add_layer_norm`]): f32 mean and biased variance, affine in
//! f32, one rounding to f16; the residual sum rounded once to f16 and the
//! LayerNorm taken of the rounded sum. Widths 192, 384 and 768.
use crate::runner::{Io, Operand, Path};
use candle_core::{DType, Layout, Result, Shape, Storage, Tensor};
use std::sync::Mutex;
use wavefuse::f16;

/// A LayerNorm's scale and shift packed as one `[2, C]` f16 tensor (row 0
/// gamma, row 1 beta): one operand, so that the in-place ops fit candle's
/// `InplaceOp3`. Build it once per LayerNorm (at load) and reuse it.
#[derive(Clone, Debug)]
pub struct Affine {
    t: Tensor,
}

impl Affine {
    /// Packs `gamma` and `beta` (`[C]` each, any float dtype, one device)
    /// as f16.
    pub fn new(gamma: &Tensor, beta: &Tensor) -> Result<Affine> {
        let (g, b) = (gamma.dims1()?, beta.dims1()?);
        if g != b {
            candle_core::bail!("wavefuse affine: `gamma` has {g} elements, `beta` {b}");
        }
        let t = Tensor::stack(
            &[gamma.to_dtype(DType::F16)?, beta.to_dtype(DType::F16)?],
            0,
        )?;
        Ok(Affine { t })
    }

    /// Channels (`C`).
    pub fn width(&self) -> usize {
        self.t.dims()[1]
    }

    /// The packed `[2, C]` tensor.
    pub fn tensor(&self) -> &Tensor {
        &self.t
    }
}

/// `(rows, width)` of `[..., width]` operand `name` of `op`; with an
/// affine operand, checks it is `[2, width]`.
pub(crate) fn rows_width(
    op: &'static str,
    name: &'static str,
    l: &Layout,
    affine: Option<&Layout>,
) -> Result<(usize, usize)> {
    let Some(&width) = l.dims().last() else {
        candle_core::bail!("{op}: `{name}` is a scalar, expected [..., width]");
    };
    if width == 0 {
        candle_core::bail!("{op}: `{name}` {:?} has width 0", l.dims());
    }
    if let Some(a) = affine
        && a.dims() != [2, width]
    {
        candle_core::bail!(
            "{op}: `affine` is {:?}, expected [2, {width}] (the width of `{name}`)",
            a.dims()
        );
    }
    Ok((l.shape().elem_count() / width, width))
}

/// gamma and beta as views of the packed affine operand `i`, when the op
/// was given one.
pub(crate) fn affine_views<'a>(
    io: &Io<'a>,
    i: usize,
    width: usize,
    given: bool,
) -> wavefuse::Result<Option<AffineViews<'a>>> {
    if !given {
        return Ok(None);
    }
    Ok(Some((
        io.input(i, 0, Some(width))?,
        io.input(i, width, Some(width))?,
    )))
}

/// gamma and beta as two views of the packed affine operand.
pub(crate) type AffineViews<'a> = (wavefuse::View<'a, f16>, wavefuse::View<'a, f16>);

/// [`affine_views`]' result as the wavefuse op's affine argument.
pub(crate) fn as_affine<'x>(ab: &'x Option<AffineViews<'_>>) -> Option<wavefuse::Affine<'x, 'x>> {
    ab.as_ref()
        .map(|(gamma, beta)| wavefuse::Affine { gamma, beta })
}

/// Fails unless `a` and `b` have the same dims.
pub(crate) fn same_dims(
    op: &'static str,
    (an, a): (&'static str, &Layout),
    (bn, b): (&'static str, &Layout),
) -> Result<()> {
    if a.dims() != b.dims() {
        candle_core::bail!("{op}: `{bn}` is {:?}, `{an}` is {:?}", b.dims(), a.dims());
    }
    Ok(())
}

/// `y = LayerNorm(x)` over the last axis: `CustomOp1` on `x`, or
/// `CustomOp2` on `x` and the packed [`Affine`].
#[derive(Clone, Copy, Debug)]
pub struct LayerNorm {
    /// Epsilon added to the variance.
    pub eps: f32,
}

const LN: &str = "wavefuse-layer_norm";

impl LayerNorm {
    fn fwd<P: Path>(&self, ins: &[Operand<'_, P::S>]) -> Result<(P::S, Shape)> {
        let l = ins[0].l;
        let (_, width) = rows_width(LN, "x", l, ins.get(1).map(|o| o.l))?;
        let affine = ins.len() == 2;
        let n = l.shape().elem_count();
        let mut o = P::run(LN, ins, None, &[n], |io| {
            let x = io.input::<f16>(0, 0, None)?;
            let ab = affine_views(io, 1, width, affine)?;
            let a = as_affine(&ab);
            let mut y = io.output(0, &[n])?;
            wavefuse::layer_norm(io.q, &x, &mut y[0], width, a, self.eps)
        })?;
        Ok((o.remove(0), l.shape().clone()))
    }
}

custom_op!(LayerNorm, LN, CustomOp1, ["x"]);
custom_op!(LayerNorm, LN, CustomOp2, ["x", "affine"]);

/// `LayerNorm(x)` over the last axis, with the optional packed affine.
pub fn layer_norm(x: &Tensor, affine: Option<&Affine>, eps: f32) -> Result<Tensor> {
    let op = LayerNorm { eps };
    match affine {
        None => x.apply_op1_no_bwd(&op),
        Some(a) => x.apply_op2_no_bwd(&a.t, &op),
    }
}

/// The second output of an in-place op, kept until the op returns
/// (candle's in-place ops can only write their destination).
#[derive(Debug, Default)]
pub(crate) struct Stash(Mutex<Option<Storage>>);

impl Stash {
    pub(crate) fn put(&self, s: Storage) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(s);
    }

    /// The stashed output as a contiguous tensor of `shape`.
    pub(crate) fn take(&self, op: &'static str, shape: Shape) -> Result<Tensor> {
        let s = self
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .ok_or_else(|| candle_core::Error::Msg(format!("{op}: no output produced")))?;
        Ok(Tensor::from_storage(
            s,
            shape,
            candle_core::op::BackpropOp::none(),
            false,
        ))
    }
}

/// In place: `residual = f16(residual + branch)`, and a fresh
/// `y = LayerNorm(residual)`: `InplaceOp2` on `residual` with `branch`, or
/// `InplaceOp3` with `branch` and the packed [`Affine`]. [`add_layer_norm`]
/// returns `y`.
#[derive(Debug)]
pub struct AddLayerNorm {
    eps: f32,
    y: Stash,
}

const ADD_LN: &str = "wavefuse-add_layer_norm";

impl AddLayerNorm {
    /// The op with LayerNorm epsilon `eps`.
    pub fn new(eps: f32) -> AddLayerNorm {
        AddLayerNorm {
            eps,
            y: Stash::default(),
        }
    }

    /// `y` of the last launch, as a tensor of `shape` (the residual's).
    pub fn take_y(&self, shape: Shape) -> Result<Tensor> {
        self.y.take(ADD_LN, shape)
    }

    fn fwd_inplace<P: Path>(
        &self,
        r: &mut P::S,
        rl: &Layout,
        ins: &[Operand<'_, P::S>],
    ) -> Result<()> {
        same_dims(ADD_LN, ("residual", rl), ("branch", ins[0].l))?;
        let (_, width) = rows_width(ADD_LN, "residual", rl, ins.get(1).map(|o| o.l))?;
        let affine = ins.len() == 2;
        let n = rl.shape().elem_count();
        let mut o = P::run(ADD_LN, ins, Some((r, rl, "residual")), &[n], |io| {
            let branch = io.input::<f16>(0, 0, None)?;
            let ab = affine_views(io, 1, width, affine)?;
            let a = as_affine(&ab);
            let mut r = io.inout()?;
            let mut y = io.output(0, &[n])?;
            wavefuse::add_layer_norm(io.q, &mut r, &branch, &mut y[0], width, a, self.eps)
        })?;
        self.y.put(P::storage(o.remove(0)));
        Ok(())
    }
}

inplace_op!(AddLayerNorm, ADD_LN, InplaceOp2, ["branch"]);
inplace_op!(AddLayerNorm, ADD_LN, InplaceOp3, ["branch", "affine"]);

/// In place: `residual = f16(residual + branch)`; returns
/// `LayerNorm(residual)` (of the rounded sum), same shape.
pub fn add_layer_norm(
    residual: &Tensor,
    branch: &Tensor,
    affine: Option<&Affine>,
    eps: f32,
) -> Result<Tensor> {
    let op = AddLayerNorm::new(eps);
    match affine {
        None => residual.inplace_op2(branch, &op)?,
        Some(a) => residual.inplace_op3(branch, &a.t, &op)?,
    }
    op.take_y(residual.shape().clone())
}

/// Out of place: `s = f16(residual + branch)` and `y = LayerNorm(s)` in one
/// launch, `residual` untouched; the output is `[2, ...]` (`s`, then `y`).
/// For a residual that is not the caller's to update (a model input).
#[derive(Clone, Copy, Debug)]
pub struct AddLayerNormTo {
    /// Epsilon added to the variance.
    pub eps: f32,
}

const ADD_LN_TO: &str = "wavefuse-add_layer_norm_to";

impl AddLayerNormTo {
    fn fwd<P: Path>(&self, ins: &[Operand<'_, P::S>]) -> Result<(P::S, Shape)> {
        let l = ins[0].l;
        same_dims(ADD_LN_TO, ("residual", l), ("branch", ins[1].l))?;
        let (_, width) = rows_width(ADD_LN_TO, "residual", l, ins.get(2).map(|o| o.l))?;
        let affine = ins.len() == 3;
        let n = l.shape().elem_count();
        let mut o = P::run(ADD_LN_TO, ins, None, &[2 * n], |io| {
            let r = io.input::<f16>(0, 0, None)?;
            let b = io.input::<f16>(1, 0, None)?;
            let ab = affine_views(io, 2, width, affine)?;
            let a = as_affine(&ab);
            let mut o = io.output(0, &[n, n])?;
            let (s, y) = o.split_at_mut(1);
            wavefuse::add_layer_norm_to(io.q, &r, &b, &mut s[0], &mut y[0], width, a, self.eps)
        })?;
        let mut dims = vec![2];
        dims.extend_from_slice(l.dims());
        Ok((o.remove(0), Shape::from(dims)))
    }
}

custom_op!(AddLayerNormTo, ADD_LN_TO, CustomOp2, ["residual", "branch"]);
custom_op!(
    AddLayerNormTo,
    ADD_LN_TO,
    CustomOp3,
    ["residual", "branch", "affine"]
);

/// Out of place: `(residual + branch, LayerNorm(residual + branch))` (see
/// [`AddLayerNormTo`]).
pub fn add_layer_norm_to(
    residual: &Tensor,
    branch: &Tensor,
    affine: Option<&Affine>,
    eps: f32,
) -> Result<(Tensor, Tensor)> {
    let op = AddLayerNormTo { eps };
    let o = match affine {
        None => residual.apply_op2_no_bwd(branch, &op)?,
        Some(a) => residual.apply_op3_no_bwd(branch, &a.t, &op)?,
    };
    Ok((o.get(0)?, o.get(1)?))
}
