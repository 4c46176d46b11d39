//! The QKV split (per-head q, k, v; bias added, q scaled) as a candle op.
//!
//! Numerics are wavefuse's ([`wavefuse::qkv_split`]): `k = f16(x + b)`,
//! `v = f16(x + b)`, `q = f16(f16(x + b) * scale)` (the scale in f32).
use crate::runner::{Operand, Path};
use candle_core::{Result, Shape, Tensor};
use wavefuse::f16;

/// Channels per head with a kernel.
pub const HEAD_DIM: usize = 32;

/// `qkv` `[windows * T, 3C]` (per token `[q | k | v]`, heads major) ->
/// one `[3, windows, heads, T, 32]` tensor holding q (scaled), k and v:
/// `CustomOp1` on `qkv`, or `CustomOp2` on `qkv` and its bias `[3C]`.
#[derive(Clone, Copy, Debug)]
pub struct QkvSplit {
    /// Attention heads (`C = heads * 32`).
    pub heads: usize,
    /// Tokens per window (`T`).
    pub tokens_per_window: usize,
    /// Factor on q.
    pub scale: f32,
}

const QKV: &str = "wavefuse-qkv_split";

impl QkvSplit {
    fn fwd<P: Path>(&self, ins: &[Operand<'_, P::S>]) -> Result<(P::S, Shape)> {
        let l = ins[0].l;
        // `3 * heads * HEAD_DIM` columns must be a size at all.
        let Some(c) = self.heads.checked_mul(3 * HEAD_DIM).map(|c3| c3 / 3) else {
            candle_core::bail!("{QKV}: {} heads is more than any tensor holds", self.heads);
        };
        let t = self.tokens_per_window;
        let rows = match *l.dims() {
            [r, c3] if c3 == 3 * c && t > 0 && r % t == 0 && r > 0 => r,
            _ => candle_core::bail!(
                "{QKV}: `qkv` is {:?}, expected [windows * {t}, {}] ({} heads of {HEAD_DIM})",
                l.dims(),
                3 * c,
                self.heads
            ),
        };
        if let Some(b) = ins.get(1)
            && b.l.dims() != [3 * c]
        {
            candle_core::bail!("{QKV}: `bias` is {:?}, expected [{}]", b.l.dims(), 3 * c);
        }
        let n = rows * c;
        let p = wavefuse::QkvSplit {
            heads: self.heads,
            head_dim: HEAD_DIM,
            tokens_per_window: t,
            scale: self.scale,
        };
        let bias = ins.len() == 2;
        let mut o = P::run(QKV, ins, None, &[3 * n], |io| {
            let x = io.input::<f16>(0, 0, None)?;
            let b = if bias {
                Some(io.input::<f16>(1, 0, None)?)
            } else {
                None
            };
            let mut qkv = io.output(0, &[n, n, n])?;
            let [q, k, v] = &mut qkv[..] else {
                return Err(wavefuse::Error::BadParameter {
                    op: QKV,
                    what: "q, k, v",
                    value: String::new(),
                    why: "three output parts expected (adapter bug)",
                });
            };
            wavefuse::qkv_split(io.q, &x, b.as_ref(), q, k, v, &p)
        })?;
        Ok((
            o.remove(0),
            Shape::from((3, rows / t, self.heads, t, HEAD_DIM)),
        ))
    }
}

custom_op!(QkvSplit, QKV, CustomOp1, ["qkv"]);
custom_op!(QkvSplit, QKV, CustomOp2, ["qkv", "bias"]);

/// `(q * scale, k, v)`, each `[windows, heads, T, 32]` (contiguous views of
/// one allocation), from the QKV Linear's output `[windows * T, 3C]` and
/// its optional bias `[3C]`.
pub fn qkv_split(
    qkv: &Tensor,
    bias: Option<&Tensor>,
    heads: usize,
    tokens_per_window: usize,
    scale: f32,
) -> Result<(Tensor, Tensor, Tensor)> {
    let op = QkvSplit {
        heads,
        tokens_per_window,
        scale,
    };
    let o = match bias {
        None => qkv.apply_op1_no_bwd(&op)?,
        Some(b) => qkv.apply_op2_no_bwd(b, &op)?,
    };
    Ok((o.get(0)?, o.get(1)?, o.get(2)?))
}
