//! Token gathers through a plan (a window partition and its reverse, a head
//! merge), alone or fused with LayerNorm and residual add + LayerNorm, as
//! candle ops.
//!
//! A [`Plan`] is wavefuse's validated index table on the wavefuse device
//! behind one candle device: built once per layout, kept, and shared by
//! every op that moves tokens that way (cloning it is cheap).
use crate::layer_norm::{Affine, Stash, affine_views, as_affine, rows_width, same_dims};
use crate::runner::{DevKey, Operand, Path, wf_device, wf_err};
use candle_core::{DType, Device, Layout, Result, Shape, Tensor};
use std::sync::Arc;
use wavefuse::f16;

/// A validated gather table on one device: output token `t` is source
/// token `table[t]`, or zero where `table[t] == -1`.
#[derive(Clone, Debug)]
pub struct Plan {
    plan: Arc<wavefuse::GatherPlan>,
    key: DevKey,
}

impl Plan {
    /// Validates `table` against `n_src` source tokens and uploads it for
    /// `device`.
    pub fn new(table: &[i32], n_src: usize, device: &Device) -> Result<Plan> {
        let key = DevKey::of(device)?;
        let dev = wf_device(key)?;
        let plan =
            wavefuse::GatherPlan::new(&dev, table, n_src).map_err(wf_err("wavefuse-plan"))?;
        Ok(Plan {
            plan: Arc::new(plan),
            key,
        })
    }

    /// Output tokens.
    pub fn len(&self) -> usize {
        self.plan.len()
    }

    /// Always false (an empty table is rejected).
    pub fn is_empty(&self) -> bool {
        self.plan.is_empty()
    }

    /// Source tokens.
    pub fn n_src(&self) -> usize {
        self.plan.n_src()
    }

    /// Every source named exactly once (what the in-place
    /// [`add_layer_norm_gather`] needs).
    pub fn is_partition(&self) -> bool {
        self.plan.is_partition()
    }

    /// The wavefuse plan.
    pub fn inner(&self) -> &wavefuse::GatherPlan {
        &self.plan
    }

    /// Fails unless the plan was built for the device of `t`.
    fn check_device(&self, op: &'static str, name: &'static str, t: &Tensor) -> Result<()> {
        if DevKey::of(t.device())? != self.key {
            candle_core::bail!(
                "{op}: the plan is for {:?}, `{name}` is on {:?}",
                self.key,
                t.device().location()
            );
        }
        Ok(())
    }

    /// `(n_src, width)` of a `[n_src, width]` source, checked against the
    /// plan.
    fn src_width(&self, op: &'static str, name: &'static str, l: &Layout) -> Result<usize> {
        match *l.dims() {
            [n, w] if n == self.n_src() => Ok(w),
            _ => candle_core::bail!(
                "{op}: `{name}` is {:?}, expected [{}, width] (the plan's sources)",
                l.dims(),
                self.n_src()
            ),
        }
    }
}

/// `out[t] = src[plan[t]]` (or zero): `CustomOp1` on `src`
/// `[plan.n_src(), width]`, width any multiple of 8.
#[derive(Clone, Debug)]
pub struct Gather {
    plan: Plan,
}

const GATHER: &str = "wavefuse-gather";

impl Gather {
    /// The op for `plan`.
    pub fn new(plan: &Plan) -> Gather {
        Gather { plan: plan.clone() }
    }

    fn fwd<P: Path>(&self, ins: &[Operand<'_, P::S>]) -> Result<(P::S, Shape)> {
        let width = self.plan.src_width(GATHER, "src", ins[0].l)?;
        let n = self.plan.len() * width;
        let mut o = P::run(GATHER, ins, None, &[n], |io| {
            let src = io.input::<f16>(0, 0, None)?;
            let mut out = io.output(0, &[n])?;
            wavefuse::gather(io.q, &self.plan.plan, &src, &mut out[0], width)
        })?;
        Ok((o.remove(0), Shape::from((self.plan.len(), width))))
    }
}

custom_op!(Gather, GATHER, CustomOp1, ["src"]);

/// `src` `[plan.n_src(), width]` gathered through `plan`:
/// `[plan.len(), width]`.
pub fn gather(src: &Tensor, plan: &Plan) -> Result<Tensor> {
    plan.check_device(GATHER, "src", src)?;
    src.apply_op1_no_bwd(&Gather::new(plan))
}

/// `out[t] = f16(src[plan[t]])` (or zero) over rows of four floats, each
/// rounded to nearest even: `CustomOp1` on an `f32` `src` `[plan.n_src(),
/// 4]`, giving `f16` `[plan.len(), 4]`.
#[derive(Clone, Debug)]
pub struct GatherToF16 {
    plan: Plan,
}

const GATHER_TO_F16: &str = "wavefuse-gather_to_f16";

impl GatherToF16 {
    /// The op for `plan`.
    pub fn new(plan: &Plan) -> GatherToF16 {
        GatherToF16 { plan: plan.clone() }
    }

    fn fwd<P: Path>(&self, ins: &[Operand<'_, P::S>]) -> Result<(P::S, Shape)> {
        let mut src = ins[0];
        src.dtype = DType::F32;
        let width = self.plan.src_width(GATHER_TO_F16, "src", src.l)?;
        if width != wavefuse::GATHER_F32_ROW {
            candle_core::bail!(
                "{GATHER_TO_F16}: `src` rows are {width} wide, expected {}",
                wavefuse::GATHER_F32_ROW
            );
        }
        let n = self.plan.len() * width;
        let mut o = P::run(GATHER_TO_F16, &[src], None, &[n], |io| {
            let s = io.input::<f32>(0, 0, None)?;
            let mut out = io.output(0, &[n])?;
            wavefuse::gather_to_f16(io.q, &self.plan.plan, &s, &mut out[0])
        })?;
        Ok((o.remove(0), Shape::from((self.plan.len(), width))))
    }
}

custom_op!(GatherToF16, GATHER_TO_F16, CustomOp1, ["src"]);

/// `f32` `src` `[plan.n_src(), 4]` gathered through `plan` and rounded to
/// `f16` in the same pass: `[plan.len(), 4]`, padding rows zero.
pub fn gather_to_f16(src: &Tensor, plan: &Plan) -> Result<Tensor> {
    plan.check_device(GATHER_TO_F16, "src", src)?;
    src.apply_op1_no_bwd(&GatherToF16::new(plan))
}

/// `out[t] = LayerNorm(src[plan[t]])` (zero where the plan pads; zero also
/// with an affine, as PyTorch's LayerNorm-then-pad): `CustomOp1` on `src`,
/// or `CustomOp2` on `src` and the packed [`Affine`].
#[derive(Clone, Debug)]
pub struct LayerNormGather {
    plan: Plan,
    eps: f32,
}

const LN_GATHER: &str = "wavefuse-layer_norm_gather";

impl LayerNormGather {
    /// The op for `plan` with epsilon `eps`.
    pub fn new(plan: &Plan, eps: f32) -> LayerNormGather {
        LayerNormGather {
            plan: plan.clone(),
            eps,
        }
    }

    fn fwd<P: Path>(&self, ins: &[Operand<'_, P::S>]) -> Result<(P::S, Shape)> {
        let width = self.plan.src_width(LN_GATHER, "src", ins[0].l)?;
        rows_width(LN_GATHER, "src", ins[0].l, ins.get(1).map(|o| o.l))?;
        let affine = ins.len() == 2;
        let n = self.plan.len() * width;
        let mut o = P::run(LN_GATHER, ins, None, &[n], |io| {
            let src = io.input::<f16>(0, 0, None)?;
            let ab = affine_views(io, 1, width, affine)?;
            let a = as_affine(&ab);
            let mut out = io.output(0, &[n])?;
            wavefuse::layer_norm_gather(
                io.q,
                &self.plan.plan,
                &src,
                &mut out[0],
                width,
                a,
                self.eps,
            )
        })?;
        Ok((o.remove(0), Shape::from((self.plan.len(), width))))
    }
}

custom_op!(LayerNormGather, LN_GATHER, CustomOp1, ["src"]);
custom_op!(LayerNormGather, LN_GATHER, CustomOp2, ["src", "affine"]);

/// `LayerNorm(src)` gathered through `plan`, padding tokens zero.
pub fn layer_norm_gather(
    src: &Tensor,
    plan: &Plan,
    affine: Option<&Affine>,
    eps: f32,
) -> Result<Tensor> {
    plan.check_device(LN_GATHER, "src", src)?;
    let op = LayerNormGather::new(plan, eps);
    match affine {
        None => src.apply_op1_no_bwd(&op),
        Some(a) => src.apply_op2_no_bwd(a.tensor(), &op),
    }
}

/// In place: `residual = f16(residual + branch)`, and a fresh
/// `out[t] = LayerNorm(residual[plan[t]])` (zero where the plan pads):
/// `InplaceOp2` on `residual` with `branch`, or `InplaceOp3` with `branch`
/// and the packed [`Affine`]. The plan must be a partition.
#[derive(Debug)]
pub struct AddLayerNormGather {
    plan: Plan,
    eps: f32,
    out: Stash,
}

const ADD_LN_GATHER: &str = "wavefuse-add_layer_norm_gather";

impl AddLayerNormGather {
    /// The op for `plan` with epsilon `eps`.
    pub fn new(plan: &Plan, eps: f32) -> AddLayerNormGather {
        AddLayerNormGather {
            plan: plan.clone(),
            eps,
            out: Stash::default(),
        }
    }

    /// `out` of the last launch.
    pub fn take_out(&self, width: usize) -> Result<Tensor> {
        self.out
            .take(ADD_LN_GATHER, Shape::from((self.plan.len(), width)))
    }

    fn fwd_inplace<P: Path>(
        &self,
        r: &mut P::S,
        rl: &Layout,
        ins: &[Operand<'_, P::S>],
    ) -> Result<()> {
        let width = self.plan.src_width(ADD_LN_GATHER, "residual", rl)?;
        same_dims(ADD_LN_GATHER, ("residual", rl), ("branch", ins[0].l))?;
        rows_width(ADD_LN_GATHER, "residual", rl, ins.get(1).map(|o| o.l))?;
        let affine = ins.len() == 2;
        let n = self.plan.len() * width;
        let mut o = P::run(ADD_LN_GATHER, ins, Some((r, rl, "residual")), &[n], |io| {
            let branch = io.input::<f16>(0, 0, None)?;
            let ab = affine_views(io, 1, width, affine)?;
            let a = as_affine(&ab);
            let mut r = io.inout()?;
            let mut out = io.output(0, &[n])?;
            wavefuse::add_layer_norm_gather(
                io.q,
                &self.plan.plan,
                &mut r,
                &branch,
                &mut out[0],
                width,
                a,
                self.eps,
            )
        })?;
        self.out.put(P::storage(o.remove(0)));
        Ok(())
    }
}

inplace_op!(AddLayerNormGather, ADD_LN_GATHER, InplaceOp2, ["branch"]);
inplace_op!(
    AddLayerNormGather,
    ADD_LN_GATHER,
    InplaceOp3,
    ["branch", "affine"]
);

/// In place: `residual = f16(residual + branch)`; returns
/// `LayerNorm(residual)` gathered through `plan` (a partition), padding
/// tokens zero.
pub fn add_layer_norm_gather(
    residual: &Tensor,
    branch: &Tensor,
    plan: &Plan,
    affine: Option<&Affine>,
    eps: f32,
) -> Result<Tensor> {
    plan.check_device(ADD_LN_GATHER, "residual", residual)?;
    let op = AddLayerNormGather::new(plan, eps);
    match affine {
        None => residual.inplace_op2(branch, &op)?,
        Some(a) => residual.inplace_op3(branch, a.tensor(), &op)?,
    }
    op.take_out(residual.dim(1)?)
}
