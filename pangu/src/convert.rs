//! `pangu convert`: the released ONNX files to the model's weight file.
//!
//! Every initializer is mapped by the graph's structure, never by its name
//! or the exporter's numeric ids:
//! 1. each initializer is claimed by the operation that reads it: a
//!    kernel-1 `Conv` (weight and bias), a `MatMul` with an `[in, out]`
//!    weight and the `Add` of its bias, the `Add` of a rank-5 (or 4)
//!    earth-specific bias, or a LayerNorm (one `LayerNormalization` op, or
//!    the decomposed `ReduceMean .. Sqrt, Div, Mul, Add` chain);
//! 2. the four convolutions are told apart by their shapes (upper-air and
//!    surface embedding, `[C, 192, 1]` and `[C, 112, 1]`; recovery,
//!    `[160, 2C, 1]` and `[64, 2C, 1]`); between them, the operations in
//!    a topological order of the graph must read as the network: blocks
//!    of `qkv, earth bias, proj, norm1, fc1, fc2, norm2` at width C, the
//!    downsample (`norm, linear`), blocks at 2C, the upsample (`linear1,
//!    norm, linear2`), blocks at C;
//! 3. the statistics, the 6th upper-air channel and the surface maps are
//!    the float Constant nodes read by `Sub`, `Div` or `Concat` on the way
//!    to an embedding (which one says upper air or surface), and by `Mul`
//!    or `Add` on the way to a graph output.
//!
//! The LayerNorm epsilon and the activation between `fc1` and `fc2` are
//! read from the graph and refused unless they are the model's (1e-5, the
//! exact erf GELU). An initializer or constant that maps to no role, or a
//! role that is missing, is an error naming it; nothing is written then.
//! The output is written beside its path and renamed once it has been read
//! back and checked by the loader.
use crate::config::{Depths, Geometry, check_width};
use crate::error::{Error, Result};
use crate::onnx::{self, Graph, attr, proto};
use crate::stage::config::LN_EPS;
use crate::weights::{self, Meta, TOKENS, Weights, window_types};
use bytes::Bytes;
use std::collections::{HashMap, HashSet, VecDeque};
use std::path::{Path, PathBuf};

/// What `pangu convert` writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutDtype {
    /// Every tensor in f32, as in the file.
    F32,
    /// The learned weights in f16 (rounded to nearest even); the
    /// statistics and the constant fields stay f32 (a mean of 101325 Pa
    /// does not fit f16).
    F16,
}

/// The converter's options.
#[derive(Clone, Debug)]
pub struct Options {
    /// The model's interval in hours: from the flag, else from a file
    /// named `pangu_weather_N.onnx`.
    pub interval_hours: Option<u32>,
    /// The element type of the learned weights.
    pub dtype: OutDtype,
    /// Blocks per layer. Layers 1 and 2 run at the same scale with nothing
    /// between them, so the graph gives only their sum; without this the
    /// sum is split in halves (the released 6 + 6), which must be even.
    pub depths: Option<Depths>,
    /// Show a progress bar.
    pub progress: bool,
}

/// One initializer's place in the converted file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapped {
    /// Its name in the ONNX file.
    pub onnx: String,
    /// The weight file's tensor it becomes.
    pub name: String,
}

/// What a conversion found and wrote.
#[derive(Debug)]
pub struct Report {
    /// The output's metadata.
    pub meta: Meta,
    /// Every initializer and the tensor it became, in the graph's order.
    pub mapped: Vec<Mapped>,
    /// The Constant nodes read, and the tensor each became.
    pub constants: Vec<Mapped>,
    /// The ONNX opset of the default domain.
    pub opset: i64,
    /// The file's LayerNorm form: `LayerNormalization` or `decomposed`.
    pub norm_form: &'static str,
    /// Bytes written.
    pub bytes: u64,
}

/// An operation that reads initializers.
#[derive(Clone, Debug)]
enum Op<'m> {
    Conv {
        node: usize,
        w: &'m str,
        b: &'m str,
    },
    Linear {
        node: usize,
        w: &'m str,
        b: Option<&'m str>,
    },
    Earth {
        node: usize,
        t: &'m str,
    },
    Norm {
        node: usize,
        g: &'m str,
        b: &'m str,
    },
}

impl Op<'_> {
    fn node(&self) -> usize {
        match *self {
            Op::Conv { node, .. }
            | Op::Linear { node, .. }
            | Op::Earth { node, .. }
            | Op::Norm { node, .. } => node,
        }
    }
}

/// How an initializer becomes a tensor of the weight file.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Layout {
    /// The same values, reshaped.
    Same,
    /// A 2-D `[a, b]` (or `[a, b, 1]`) stored transposed: `[b, a]`.
    Transposed,
}

/// A tensor of the output, before encoding.
struct Out<'m> {
    name: String,
    shape: Vec<usize>,
    source: Source<'m>,
    learned: bool,
}

enum Source<'m> {
    Init(&'m proto::TensorProto, Layout),
    Values(Vec<f32>),
}

struct Mapper<'g, 'm> {
    g: &'g Graph<'m>,
    ops: Vec<Op<'m>>,
    /// Initializer -> the op index claiming it.
    claimed: HashMap<&'m str, usize>,
    norm_form: Option<&'static str>,
}

fn init_shape(g: &Graph<'_>, name: &str) -> Result<Vec<usize>> {
    let t = g
        .inits
        .get(name)
        .ok_or_else(|| g.error(format!("`{name}` is not an initializer")))?;
    onnx::dims(t).map_err(|e| g.error(format!("initializer `{name}`: {e}")))
}

/// The scalar value of a Constant node's output or a one-element
/// initializer.
fn scalar(g: &Graph<'_>, value: &str) -> Option<f32> {
    let t = match g.made_by(value) {
        Some(n) if n.op_type == "Constant" => attr(n, "value")?.t.as_ref()?,
        Some(_) => return None,
        None => g.inits.get(value).copied()?,
    };
    let v = onnx::f32_values(t).ok()?;
    (v.len() == 1).then(|| v[0])
}

impl<'g, 'm> Mapper<'g, 'm> {
    fn init(&self, value: &str) -> Option<&'m str> {
        self.g.inits.get_key_value(value).map(|(k, _)| *k)
    }

    fn rank_of(&self, name: &str) -> usize {
        self.g
            .inits
            .get(name)
            .map(|t| t.dims.len())
            .unwrap_or_default()
    }

    /// The only reader of `value`, if exactly one node reads it.
    fn sole_reader(&self, value: &str) -> Option<usize> {
        match self.g.readers(value) {
            [i] => Some(*i),
            _ => None,
        }
    }

    /// The initializer among `n`'s first two inputs that is 1-D, and the
    /// other input.
    fn vec_operand(&self, n: &'m proto::NodeProto) -> Option<(&'m str, &'m str)> {
        let [a, b] = n.input.as_slice() else {
            return None;
        };
        for (x, y) in [(a, b), (b, a)] {
            if let Some(k) = self.init(x)
                && self.rank_of(k) == 1
                && self.init(y).is_none()
            {
                return Some((k, y.as_str()));
            }
        }
        None
    }

    fn claim(&mut self, name: &'m str, op: usize) -> Result<()> {
        if let Some(&other) = self.claimed.get(name) {
            let (a, b) = (self.ops[other].node(), self.ops[op].node());
            return Err(self.g.error(format!(
                "initializer `{name}` is read by both {} and {}",
                self.g.describe(a),
                self.g.describe(b)
            )));
        }
        self.claimed.insert(name, op);
        Ok(())
    }

    fn push(&mut self, op: Op<'m>, names: &[&'m str]) -> Result<()> {
        let k = self.ops.len();
        self.ops.push(op);
        for n in names {
            self.claim(n, k)?;
        }
        Ok(())
    }

    /// Step 1: every operation that reads initializers, in topological
    /// order.
    fn collect(&mut self) -> Result<()> {
        let g = self.g;
        let mut done: HashSet<usize> = HashSet::new();
        for &i in &g.order {
            if done.contains(&i) {
                continue;
            }
            let n = &g.nodes[i];
            match n.op_type.as_str() {
                "Conv" => {
                    let (Some(w), Some(b)) = (
                        n.input.get(1).and_then(|x| self.init(x)),
                        n.input.get(2).and_then(|x| self.init(x)),
                    ) else {
                        continue;
                    };
                    self.check_conv(i)?;
                    self.push(Op::Conv { node: i, w, b }, &[w, b])?;
                }
                "MatMul" => {
                    let Some(w) = n.input.get(1).and_then(|x| self.init(x)) else {
                        continue;
                    };
                    if self.rank_of(w) != 2 || n.input.first().and_then(|x| self.init(x)).is_some()
                    {
                        continue;
                    }
                    let mut b = None;
                    if let Some(a) = n.output.first().and_then(|o| self.sole_reader(o))
                        && g.nodes[a].op_type == "Add"
                        && let Some((bias, _)) = self.vec_operand(&g.nodes[a])
                    {
                        b = Some(bias);
                        done.insert(a);
                    }
                    let mut names = vec![w];
                    names.extend(b);
                    self.push(Op::Linear { node: i, w, b }, &names)?;
                }
                "Add" => {
                    let [x, y] = n.input.as_slice() else {
                        continue;
                    };
                    let t = match (self.init(x), self.init(y)) {
                        (Some(t), None) | (None, Some(t)) => t,
                        _ => continue,
                    };
                    if self.rank_of(t) >= 4 {
                        self.push(Op::Earth { node: i, t }, &[t])?;
                    }
                }
                "LayerNormalization" => {
                    let (Some(gm), Some(bt)) = (
                        n.input.get(1).and_then(|x| self.init(x)),
                        n.input.get(2).and_then(|x| self.init(x)),
                    ) else {
                        continue;
                    };
                    let axis = attr(n, "axis").map_or(-1, |a| a.i);
                    if axis != -1 {
                        return Err(g.error(format!(
                            "{}: axis {axis}; the model normalises over the last axis (-1)",
                            g.describe(i)
                        )));
                    }
                    let eps = attr(n, "epsilon").map_or(1e-5, |a| a.f);
                    self.check_eps(i, eps)?;
                    self.form(i, "LayerNormalization")?;
                    self.push(
                        Op::Norm {
                            node: i,
                            g: gm,
                            b: bt,
                        },
                        &[gm, bt],
                    )?;
                }
                "Mul" => {
                    let Some((gm, x)) = self.vec_operand(n) else {
                        continue;
                    };
                    let Some(eps) = self.decomposed_norm(x) else {
                        continue;
                    };
                    let Some(a) = n.output.first().and_then(|o| self.sole_reader(o)) else {
                        continue;
                    };
                    if g.nodes[a].op_type != "Add" {
                        continue;
                    }
                    let Some((bt, _)) = self.vec_operand(&g.nodes[a]) else {
                        continue;
                    };
                    self.check_eps(i, eps)?;
                    self.form(i, "decomposed")?;
                    done.insert(a);
                    self.push(
                        Op::Norm {
                            node: i,
                            g: gm,
                            b: bt,
                        },
                        &[gm, bt],
                    )?;
                }
                _ => {}
            }
        }
        // Every initializer is claimed, by the one node that reads it.
        for t in &g.init_order {
            let name = t.name.as_str();
            let readers = g.readers(name);
            match (self.claimed.get(name), readers) {
                (_, []) => {
                    return Err(g.error(format!(
                        "initializer `{name}` {:?} is read by no node",
                        t.dims
                    )));
                }
                (None, [r, ..]) => {
                    return Err(g.error(format!(
                        "initializer `{name}` {:?}, read by {}, maps to no part of the network",
                        t.dims,
                        g.describe(*r)
                    )));
                }
                (Some(_), [_, _, ..]) => {
                    return Err(g.error(format!(
                        "initializer `{name}` is read by {} nodes ({} and {}); the network reads each weight once",
                        readers.len(),
                        g.describe(readers[0]),
                        g.describe(readers[1])
                    )));
                }
                (Some(_), [_]) => {}
            }
        }
        Ok(())
    }

    /// The decomposed LayerNorm ending in `Div(x - mean, Sqrt(var + eps))`
    /// that produces `value`: its epsilon.
    fn decomposed_norm(&self, value: &str) -> Option<f32> {
        let g = self.g;
        let div = g.made_by(value).filter(|n| n.op_type == "Div")?;
        let sub = g
            .made_by(div.input.first()?)
            .filter(|n| n.op_type == "Sub")?;
        g.made_by(sub.input.get(1)?)
            .filter(|n| n.op_type == "ReduceMean")?;
        let sqrt = g
            .made_by(div.input.get(1)?)
            .filter(|n| n.op_type == "Sqrt")?;
        let add = g
            .made_by(sqrt.input.first()?)
            .filter(|n| n.op_type == "Add")?;
        let [a, b] = add.input.as_slice() else {
            return None;
        };
        let (var, eps) = match (scalar(g, a), scalar(g, b)) {
            (None, Some(e)) => (a, e),
            (Some(e), None) => (b, e),
            _ => return None,
        };
        g.made_by(var).filter(|n| n.op_type == "ReduceMean")?;
        Some(eps)
    }

    fn check_eps(&self, node: usize, eps: f32) -> Result<()> {
        if (eps - LN_EPS).abs() > LN_EPS * 1e-3 {
            return Err(self.g.error(format!(
                "{}: LayerNorm epsilon {eps:e}; the model's is {LN_EPS:e}",
                self.g.describe(node)
            )));
        }
        Ok(())
    }

    fn form(&mut self, node: usize, form: &'static str) -> Result<()> {
        match self.norm_form {
            Some(f) if f != form => Err(self.g.error(format!(
                "{}: a {form} LayerNorm in a graph whose other LayerNorms are {f}",
                self.g.describe(node)
            ))),
            _ => {
                self.norm_form = Some(form);
                Ok(())
            }
        }
    }

    /// A patch convolution is a kernel-1, stride-1, unpadded,
    /// single-group Conv1d.
    fn check_conv(&self, i: usize) -> Result<()> {
        let n = &self.g.nodes[i];
        let ones = |k: &str| attr(n, k).is_none_or(|a| a.ints.iter().all(|&x| x == 1));
        let zeros = attr(n, "pads").is_none_or(|a| a.ints.iter().all(|&x| x == 0));
        let group = attr(n, "group").is_none_or(|a| a.i == 1);
        if !(ones("kernel_shape") && ones("strides") && ones("dilations") && zeros && group) {
            return Err(self.g.error(format!(
                "{}: the patch convolutions are kernel-1, stride-1, unpadded Conv1d over unfolded patches",
                self.g.describe(i)
            )));
        }
        Ok(())
    }

    /// The ops between the first fc1 `Add` output and fc2's input must be
    /// the exact GELU: `Gelu` (approximate none) or the erf form.
    fn check_gelu(&self, fc1: usize, fc2: usize) -> Result<()> {
        let g = self.g;
        let start = g.nodes[fc1]
            .output
            .first()
            .and_then(|o| self.sole_reader(o))
            .filter(|&a| g.nodes[a].op_type == "Add")
            .and_then(|a| g.nodes[a].output.first())
            .map(String::as_str);
        let mut ops = Vec::new();
        let mut queue: VecDeque<&str> = g.nodes[fc2]
            .input
            .first()
            .map(String::as_str)
            .into_iter()
            .collect();
        let mut seen = HashSet::new();
        while let Some(v) = queue.pop_front() {
            if Some(v) == start || !seen.insert(v) || ops.len() > 16 {
                continue;
            }
            let Some(&p) = g.producer.get(v) else {
                continue;
            };
            let n = &g.nodes[p];
            ops.push(n.op_type.as_str());
            if n.op_type == "Gelu" && attr(n, "approximate").is_some_and(|a| a.s != b"none") {
                ops.push("approximate");
            }
            if n.op_type != "Constant" {
                queue.extend(n.input.iter().map(String::as_str));
            }
        }
        let allowed = ["Div", "Mul", "Erf", "Add", "Constant"];
        let erf = ops.contains(&"Erf") && ops.iter().all(|o| allowed.contains(o));
        let gelu = ops.iter().filter(|&&o| o != "Constant").eq(["Gelu"].iter());
        if start.is_none() || !(erf || gelu) {
            return Err(g.error(format!(
                "{}: the activation before it is {ops:?}; the model uses the exact GELU (erf)",
                g.describe(fc2)
            )));
        }
        Ok(())
    }
}

/// The structure found: the network's weights by role.
struct Found<'m> {
    width: usize,
    depths: [usize; 4],
    embed: [(&'m str, &'m str); 2],
    recover: [(&'m str, &'m str); 2],
    blocks: Vec<Vec<BlockOps<'m>>>,
    down: (&'m str, &'m str, &'m str),
    up: (&'m str, &'m str, &'m str, &'m str),
}

struct BlockOps<'m> {
    norm1: (&'m str, &'m str),
    qkv: (&'m str, &'m str),
    earth: &'m str,
    proj: (&'m str, &'m str),
    norm2: (&'m str, &'m str),
    fc1: (&'m str, &'m str),
    fc2: (&'m str, &'m str),
}

struct Cursor<'a, 'g, 'm> {
    m: &'a Mapper<'g, 'm>,
    ops: Vec<&'a Op<'m>>,
    at: usize,
}

impl<'m> Cursor<'_, '_, 'm> {
    fn peek(&self) -> Option<&Op<'m>> {
        self.ops.get(self.at).copied()
    }

    fn what(&self, op: Option<&Op<'m>>) -> String {
        let g = self.m.g;
        match op {
            None => "the end of the graph".into(),
            Some(op) => {
                let name = match op {
                    Op::Conv { w, .. } | Op::Linear { w, .. } => *w,
                    Op::Earth { t, .. } => *t,
                    Op::Norm { g, .. } => *g,
                };
                let shape = init_shape(g, name).unwrap_or_default();
                format!("{} reading `{name}` {shape:?}", g.describe(op.node()))
            }
        }
    }

    fn fail(&self, want: &str) -> Error {
        self.m
            .g
            .error(format!("expected {want}, found {}", self.what(self.peek())))
    }

    /// A Linear `[inp, out]` with or without bias.
    fn linear(
        &mut self,
        inp: usize,
        out: usize,
        bias: bool,
        want: &str,
    ) -> Result<(&'m str, Option<&'m str>)> {
        let g = self.m.g;
        if let Some(Op::Linear { w, b, .. }) = self.peek() {
            let (w, b) = (*w, *b);
            let shape = init_shape(g, w)?;
            if shape == [out, inp] && inp != out {
                return Err(g.error(format!(
                    "{want}: MatMul weight `{w}` is {shape:?}, stored [out, in]; the released files store [in, out] = [{inp}, {out}]"
                )));
            }
            if shape == [inp, out] && b.is_some() == bias {
                if let Some(b) = b
                    && init_shape(g, b)? != [out]
                {
                    return Err(g.error(format!(
                        "{want}: bias `{b}` is {:?}, expected [{out}]",
                        init_shape(g, b)?
                    )));
                }
                self.at += 1;
                return Ok((w, b));
            }
        }
        Err(self.fail(&format!(
            "{want} (MatMul [{inp}, {out}]{})",
            if bias { " and bias" } else { ", no bias" }
        )))
    }

    fn linear_b(&mut self, inp: usize, out: usize, want: &str) -> Result<(&'m str, &'m str)> {
        let (w, b) = self.linear(inp, out, true, want)?;
        b.map(|b| (w, b)).ok_or_else(|| self.fail(want))
    }

    fn norm(&mut self, c: usize, want: &str) -> Result<(&'m str, &'m str)> {
        let g = self.m.g;
        if let Some(Op::Norm { g: gm, b, .. }) = self.peek() {
            let (gm, b) = (*gm, *b);
            if init_shape(g, gm)? == [c] && init_shape(g, b)? == [c] {
                self.at += 1;
                return Ok((gm, b));
            }
        }
        Err(self.fail(&format!("{want} (LayerNorm({c}))")))
    }

    /// The next op is a block's qkv at width `c` (or its weight stored
    /// transposed, which [`Cursor::linear`] then names).
    fn starts_block(&self, c: usize) -> bool {
        let g = self.m.g;
        matches!(self.peek(), Some(Op::Linear { w, b: Some(_), .. })
            if init_shape(g, w).is_ok_and(|s| s == [c, 3 * c] || s == [3 * c, c]))
    }

    fn block(&mut self, c: usize, types: usize, name: &str) -> Result<BlockOps<'m>> {
        let g = self.m.g;
        let qkv = self.linear_b(c, 3 * c, &format!("{name} qkv"))?;
        let earth = match self.peek() {
            Some(Op::Earth { t, .. }) => *t,
            _ => return Err(self.fail(&format!("{name}'s earth-specific bias Add"))),
        };
        let heads = c / 32;
        let shape = init_shape(g, earth)?;
        if shape != [1, types, heads, TOKENS, TOKENS] && shape != [types, heads, TOKENS, TOKENS] {
            return Err(g.error(format!(
                "{name}'s earth-specific bias `{earth}` is {shape:?}, expected [1, {types}, {heads}, {TOKENS}, {TOKENS}] ({types} window types, {heads} heads)"
            )));
        }
        self.at += 1;
        let proj = self.linear_b(c, c, &format!("{name} proj"))?;
        let norm1 = self.norm(c, &format!("{name} norm1 (post-norm: after the attention)"))?;
        let fc1_at = self.at;
        let fc1 = self.linear_b(c, 4 * c, &format!("{name} fc1"))?;
        let fc2_at = self.at;
        let fc2 = self.linear_b(4 * c, c, &format!("{name} fc2"))?;
        self.m
            .check_gelu(self.ops[fc1_at].node(), self.ops[fc2_at].node())?;
        let norm2 = self.norm(c, &format!("{name} norm2"))?;
        Ok(BlockOps {
            norm1,
            qkv,
            earth,
            proj,
            norm2,
            fc1,
            fc2,
        })
    }
}

impl<'m> Mapper<'_, 'm> {
    /// Step 2: the network's structure over the ops.
    fn structure(&self, geom: &Geometry, depths: Option<Depths>) -> Result<Found<'m>> {
        let g = self.g;
        let mut conv = [None, None, None, None];
        let mut trunk = Vec::new();
        for op in &self.ops {
            let Op::Conv { w, b, node } = op else {
                trunk.push(op);
                continue;
            };
            let s = init_shape(g, w)?;
            let k = match s.as_slice() {
                [_, 192, 1] => 0,
                [_, 112, 1] => 1,
                [160, _, 1] => 2,
                [64, _, 1] => 3,
                _ => {
                    return Err(g.error(format!(
                        "{} weight `{w}` is {s:?}: not a patch embedding ([C, 192, 1], [C, 112, 1]) or recovery ([160, 2C, 1], [64, 2C, 1])",
                        g.describe(*node)
                    )));
                }
            };
            if conv[k].is_some() {
                return Err(g.error(format!(
                    "{} weight `{w}` {s:?}: a second convolution of this shape",
                    g.describe(*node)
                )));
            }
            conv[k] = Some((*node, *w, *b, s));
        }
        let names = [
            "upper-air embedding",
            "surface embedding",
            "upper-air recovery",
            "surface recovery",
        ];
        let mut convs = Vec::new();
        for (k, c) in conv.into_iter().enumerate() {
            convs.push(
                c.ok_or_else(|| g.error(format!("the graph has no {} convolution", names[k])))?,
            );
        }
        let c = convs[0].3[0];
        check_width(c)
            .map_err(|e| g.error(format!("upper-air embedding `{}`: {e}", convs[0].1)))?;
        let want = [
            vec![c, 192, 1],
            vec![c, 112, 1],
            vec![160, 2 * c, 1],
            vec![64, 2 * c, 1],
        ];
        for (k, cv) in convs.iter().enumerate() {
            if cv.3 != want[k] {
                return Err(g.error(format!(
                    "{} `{}` is {:?}, expected {:?} (width {c} from the upper-air embedding)",
                    names[k], cv.1, cv.3, want[k]
                )));
            }
            let bias = init_shape(g, cv.2)?;
            if bias != [want[k][0]] {
                return Err(g.error(format!(
                    "{} bias `{}` is {bias:?}, expected [{}]",
                    names[k], cv.2, want[k][0]
                )));
            }
        }
        // The trunk lies between the embeddings and the recoveries.
        let first = trunk
            .first()
            .map(|op| g.rank[op.node()])
            .unwrap_or(usize::MAX);
        let last = trunk.last().map(|op| g.rank[op.node()]).unwrap_or(0);
        for (k, cv) in convs.iter().enumerate() {
            let r = g.rank[cv.0];
            if (k < 2 && r > first) || (k >= 2 && r < last) {
                return Err(g.error(format!(
                    "{} ({}) is not {} the transformer layers",
                    names[k],
                    g.describe(cv.0),
                    if k < 2 { "before" } else { "after" }
                )));
            }
        }
        let types1 = window_types(geom.h1);
        let types2 = window_types(geom.h2);
        let mut cur = Cursor {
            m: self,
            ops: trunk,
            at: 0,
        };
        let mut blocks: Vec<Vec<BlockOps<'m>>> = vec![Vec::new(), Vec::new(), Vec::new()];
        while cur.starts_block(c) {
            let j = blocks[0].len();
            blocks[0].push(cur.block(c, types1, &format!("layer 0 block {j}"))?);
        }
        if blocks[0].is_empty() {
            return Err(cur.fail(&format!(
                "layer 0's first block: qkv (MatMul [{c}, {}])",
                3 * c
            )));
        }
        let dn = cur.norm(
            4 * c,
            "the downsample's LayerNorm (or another layer 0 block)",
        )?;
        let (dl, _) = cur.linear(4 * c, 2 * c, false, "the downsample's linear")?;
        while cur.starts_block(2 * c) {
            let j = blocks[1].len();
            blocks[1].push(cur.block(2 * c, types2, &format!("second-scale block {j}"))?);
        }
        let (u1, _) = cur.linear(
            2 * c,
            4 * c,
            false,
            "a second-scale block or the upsample's linear1",
        )?;
        let un = cur.norm(c, "the upsample's LayerNorm")?;
        let (u2, _) = cur.linear(c, c, false, "the upsample's linear2")?;
        while cur.starts_block(c) {
            let j = blocks[2].len();
            blocks[2].push(cur.block(c, types1, &format!("layer 3 block {j}"))?);
        }
        if cur.peek().is_some() {
            return Err(cur.fail("the end of layer 3 (a block's qkv) or the patch recovery"));
        }
        let (n0, n12, n3) = (blocks[0].len(), blocks[1].len(), blocks[2].len());
        if n3 == 0 {
            return Err(g.error("layer 3 has no blocks".into()));
        }
        let depths = match depths {
            Some(d) => {
                let [a, b, cc, e] = d.0;
                if a != n0 || b + cc != n12 || e != n3 {
                    return Err(Error::invalid(
                        "depths",
                        format!(
                            "{}: the graph has {n0} blocks in layer 0, {n12} in layers 1 and 2 together, {n3} in layer 3",
                            d.name()
                        ),
                    ));
                }
                d.0
            }
            None => {
                if n12 % 2 != 0 {
                    return Err(Error::invalid(
                        "depths",
                        format!(
                            "layers 1 and 2 have {n12} blocks together, which do not split in halves: give --depths"
                        ),
                    ));
                }
                [n0, n12 / 2, n12 / 2, n3]
            }
        };
        let mut it = blocks.into_iter();
        let (b0, b12, b3) = (
            it.next().unwrap_or_default(),
            it.next().unwrap_or_default(),
            it.next().unwrap_or_default(),
        );
        let mut b12 = b12;
        let b2 = b12.split_off(depths[1]);
        Ok(Found {
            width: c,
            depths,
            embed: [(convs[0].1, convs[0].2), (convs[1].1, convs[1].2)],
            recover: [(convs[2].1, convs[2].2), (convs[3].1, convs[3].2)],
            blocks: vec![b0, b12, b2, b3],
            down: (dn.0, dn.1, dl),
            up: (u1, un.0, un.1, u2),
        })
    }

    /// Forward from `value` to the first Conv, MatMul or graph output on
    /// each path: the convolutions and outputs reached, and whether a
    /// MatMul was.
    fn reach(&self, value: &'m str) -> (Vec<usize>, Vec<&'m str>, bool) {
        let g = self.g;
        let outs: HashSet<&str> = g.outputs.iter().map(|v| v.name.as_str()).collect();
        let mut convs = Vec::new();
        let mut outputs = Vec::new();
        let mut matmul = false;
        let mut seen = HashSet::new();
        let mut queue = VecDeque::from([value]);
        while let Some(v) = queue.pop_front() {
            if !seen.insert(v) {
                continue;
            }
            if outs.contains(v) {
                outputs.push(v);
            }
            for &r in g.readers(v) {
                let n = &g.nodes[r];
                match n.op_type.as_str() {
                    "Conv" => convs.push(r),
                    "MatMul" | "Gemm" => matmul = true,
                    _ => queue.extend(n.output.iter().map(String::as_str)),
                }
            }
        }
        convs.sort_unstable();
        convs.dedup();
        (convs, outputs, matmul)
    }
}

/// The roles of the constants.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Const {
    UpperMeanIn,
    UpperStdIn,
    SurfaceMeanIn,
    SurfaceStdIn,
    UpperConstants,
    SurfaceConstants,
    UpperMeanOut,
    UpperStdOut,
    SurfaceMeanOut,
    SurfaceStdOut,
}

impl Const {
    const ALL: [Const; 10] = [
        Const::UpperMeanIn,
        Const::UpperStdIn,
        Const::SurfaceMeanIn,
        Const::SurfaceStdIn,
        Const::UpperConstants,
        Const::SurfaceConstants,
        Const::UpperMeanOut,
        Const::UpperStdOut,
        Const::SurfaceMeanOut,
        Const::SurfaceStdOut,
    ];

    fn describe(self) -> &'static str {
        match self {
            Const::UpperMeanIn => "upper-air mean (Sub before the embedding)",
            Const::UpperStdIn => "upper-air std (Div before the embedding)",
            Const::SurfaceMeanIn => "surface mean (Sub before the embedding)",
            Const::SurfaceStdIn => "surface std (Div before the embedding)",
            Const::UpperConstants => "6th upper-air channel (Concat before the embedding)",
            Const::SurfaceConstants => "surface maps (Concat before the embedding)",
            Const::UpperMeanOut => "upper-air mean (Add before the output)",
            Const::UpperStdOut => "upper-air std (Mul before the output)",
            Const::SurfaceMeanOut => "surface mean (Add before the output)",
            Const::SurfaceStdOut => "surface std (Mul before the output)",
        }
    }

    fn shape(self, geom: &Geometry) -> Vec<usize> {
        match self {
            Const::UpperMeanIn | Const::UpperStdIn => vec![13, 1, 1, 5],
            Const::SurfaceMeanIn | Const::SurfaceStdIn => vec![4], // or 4 with unit axes
            Const::UpperConstants => vec![1, 1, 1, 13, geom.lat, geom.lon],
            Const::SurfaceConstants => vec![1, 3, geom.lat_padded, geom.lon],
            Const::UpperMeanOut | Const::UpperStdOut => vec![5, 1, 13, 1, 1],
            Const::SurfaceMeanOut | Const::SurfaceStdOut => vec![4, 1, 1, 1],
        }
    }
}

struct Constants {
    found: HashMap<Const, (String, Vec<f32>)>,
}

impl<'m> Mapper<'_, 'm> {
    /// Step 3: the Constant nodes holding the statistics and fields.
    fn constants(
        &self,
        geom: &Geometry,
        embed_upper: usize,
        embed_surface: usize,
        upper_out: &str,
    ) -> Result<Constants> {
        let g = self.g;
        let mut found: HashMap<Const, (String, Vec<f32>)> = HashMap::new();
        for &i in &g.order {
            let n = &g.nodes[i];
            if n.op_type != "Constant" {
                continue;
            }
            let Some(t) = attr(n, "value").and_then(|a| a.t.as_ref()) else {
                continue;
            };
            let Ok(d) = onnx::dims(t) else { continue };
            if t.data_type != onnx::FLOAT || d.iter().product::<usize>() <= 1 {
                continue;
            }
            let Some(out) = n.output.first() else {
                continue;
            };
            let readers: Vec<&str> = g
                .readers(out)
                .iter()
                .map(|&r| g.nodes[r].op_type.as_str())
                .collect();
            let (convs, outputs, matmul) = self.reach(out.as_str());
            let role = match (
                readers.as_slice(),
                convs.as_slice(),
                outputs.as_slice(),
                matmul,
            ) {
                (["Sub"], [c], [], false) if *c == embed_upper => Some(Const::UpperMeanIn),
                (["Div"], [c], [], false) if *c == embed_upper => Some(Const::UpperStdIn),
                (["Sub"], [c], [], false) if *c == embed_surface => Some(Const::SurfaceMeanIn),
                (["Div"], [c], [], false) if *c == embed_surface => Some(Const::SurfaceStdIn),
                (["Concat"], [c], [], false) if *c == embed_upper => Some(Const::UpperConstants),
                (["Concat"], [c], [], false) if *c == embed_surface => {
                    Some(Const::SurfaceConstants)
                }
                (["Add"], [], [o], false) => Some(if *o == upper_out {
                    Const::UpperMeanOut
                } else {
                    Const::SurfaceMeanOut
                }),
                (["Mul"], [], [o], false) => Some(if *o == upper_out {
                    Const::UpperStdOut
                } else {
                    Const::SurfaceStdOut
                }),
                _ => None,
            };
            let Some(role) = role else { continue };
            let want = role.shape(geom);
            // The surface statistics are four values in variable order
            // whatever unit axes surround them ([4], [4, 1, 1], ...).
            let surface_stat = matches!(
                role,
                Const::SurfaceMeanIn
                    | Const::SurfaceStdIn
                    | Const::SurfaceMeanOut
                    | Const::SurfaceStdOut
            ) && d.iter().filter(|&&x| x != 1).eq([4].iter());
            if d != want && !surface_stat {
                return Err(g.error(format!(
                    "Constant `{}` (the {}) is {d:?}, expected {want:?}",
                    n.name,
                    role.describe()
                )));
            }
            if let Some((other, _)) = found.get(&role) {
                return Err(g.error(format!(
                    "Constants `{other}` and `{}` both read as the {}",
                    n.name,
                    role.describe()
                )));
            }
            let v =
                onnx::f32_values(t).map_err(|e| g.error(format!("Constant `{}`: {e}", n.name)))?;
            if let Some(k) = v.iter().position(|x| !x.is_finite()) {
                return Err(g.error(format!(
                    "Constant `{}` (the {}): non-finite value {} at flat index {k}",
                    n.name,
                    role.describe(),
                    v[k]
                )));
            }
            found.insert(role, (n.name.clone(), v));
        }
        for role in Const::ALL {
            if !found.contains_key(&role) {
                return Err(g.error(format!(
                    "no Constant node holds the {} with shape {:?}",
                    role.describe(),
                    role.shape(geom)
                )));
            }
        }
        Ok(Constants { found })
    }
}

impl Constants {
    fn get(&self, c: Const) -> &(String, Vec<f32>) {
        // Present: `constants` checked every role.
        &self.found[&c]
    }

    /// The statistics in the weight file's layout, `[5, 13]` in file level
    /// order and `[4]`, after checking that the normalisation's (levels
    /// reversed, channel last) and the de-normalisation's agree.
    fn statistics(&self, g: &Graph<'_>) -> Result<[Vec<f32>; 4]> {
        use Const::*;
        let mut out: [Vec<f32>; 4] = Default::default();
        for (k, (i, o, upper)) in [
            (UpperMeanIn, UpperMeanOut, true),
            (UpperStdIn, UpperStdOut, true),
            (SurfaceMeanIn, SurfaceMeanOut, false),
            (SurfaceStdIn, SurfaceStdOut, false),
        ]
        .into_iter()
        .enumerate()
        {
            let (ni, vi) = self.get(i);
            let (no, vo) = self.get(o);
            // The de-normalisation's are in file order (upper air
            // `[5, 1, 13, 1, 1]`, 1000 hPa first); the upper-air
            // normalisation's are `[13, 1, 1, 5]`, 50 hPa first.
            for (j, &b) in vo.iter().enumerate() {
                let (var, level) = if upper { (j / 13, j % 13) } else { (j, 0) };
                let a = if upper {
                    vi[(12 - level) * 5 + var]
                } else {
                    vi[j]
                };
                if (a - b).abs() > 1e-6 * a.abs().max(b.abs()) {
                    return Err(g.error(format!(
                        "the normalisation's `{ni}` and the de-normalisation's `{no}` differ at variable {var}{}: {a} and {b}",
                        if upper { format!(", level {level}") } else { String::new() }
                    )));
                }
            }
            out[k] = vo.clone();
        }
        for (k, name) in [(1, "upper-air"), (3, "surface")] {
            if let Some(j) = out[k].iter().position(|&s| s <= 0.0) {
                return Err(g.error(format!(
                    "the {name} std at flat index {j} is {}, not positive",
                    out[k][j]
                )));
            }
        }
        Ok(out)
    }
}

/// The interval in a file name `pangu_weather_N.onnx`.
pub fn interval_from_name(path: &Path) -> Option<u32> {
    let stem = path.file_stem()?.to_str()?;
    stem.strip_prefix("pangu_weather_")?.parse().ok()
}

/// The fields' grid from the graph's inputs `[5, 13, H, W]` and
/// `[4, H, W]`.
fn grid(g: &Graph<'_>) -> Result<Geometry> {
    let shapes: Vec<Option<Vec<usize>>> = g.inputs.iter().map(|v| onnx::value_shape(v)).collect();
    match shapes.as_slice() {
        [Some(u), Some(s)]
            if u.len() == 4
                && u[..2] == [5, 13]
                && s.len() == 3
                && s[0] == 4
                && s[1..] == u[2..] =>
        {
            Geometry::new(u[2], u[3])
        }
        _ => Err(g.error(format!(
            "graph inputs {:?} with shapes {shapes:?}: expected [5, 13, H, W] and [4, H, W]",
            g.inputs.iter().map(|v| v.name.as_str()).collect::<Vec<_>>()
        ))),
    }
}

/// Converts the ONNX model at `onnx_path` to a weight file at `out`.
/// Nothing is written unless every initializer and constant maps and the
/// written file reads back through [`Weights::read`].
pub fn convert(onnx_path: &Path, out: &Path, opts: &Options) -> Result<Report> {
    let file = onnx_path.display().to_string();
    let named = interval_from_name(onnx_path);
    let interval = match (opts.interval_hours, named) {
        (Some(a), Some(b)) if a != b => {
            return Err(Error::invalid(
                "interval",
                format!("--interval {a}h, but the file name says {b}h"),
            ));
        }
        (Some(a), _) | (None, Some(a)) => a,
        (None, None) => {
            return Err(Error::invalid(
                "interval",
                format!("{file}: give --interval (the file is not named pangu_weather_N.onnx)"),
            ));
        }
    };
    if std::fs::canonicalize(onnx_path)
        .ok()
        .is_some_and(|a| std::fs::canonicalize(out).ok() == Some(a))
    {
        return Err(Error::invalid(
            "out",
            "the output would overwrite the input",
        ));
    }
    let bar = progress(opts.progress);
    bar.set_message(format!("reading {file}"));
    let model = onnx::read(onnx_path)?;
    let opset = model
        .opset_import
        .iter()
        .find(|o| o.domain.is_empty() || o.domain == "ai.onnx")
        .map_or(0, |o| o.version);
    let gp = model.graph.as_ref().ok_or_else(|| Error::Format {
        file: file.clone(),
        why: "no graph".into(),
    })?;
    bar.set_message("indexing the graph");
    let g = Graph::new(&file, gp)?;
    let geom = grid(&g)?;
    let mut m = Mapper {
        g: &g,
        ops: Vec::new(),
        claimed: HashMap::new(),
        norm_form: None,
    };
    bar.set_message("mapping the initializers");
    m.collect()?;
    let found = m.structure(&geom, opts.depths)?;
    let conv_node = |w: &str| {
        m.ops
            .iter()
            .find(|op| matches!(op, Op::Conv { w: x, .. } if *x == w))
            .map(Op::node)
    };
    let (Some(eu), Some(es)) = (conv_node(found.embed[0].0), conv_node(found.embed[1].0)) else {
        return Err(g.error("the embedding convolutions are lost".into()));
    };
    let upper_out = match g.outputs.first() {
        Some(v) if g.outputs.len() == 2 => v.name.clone(),
        _ => return Err(g.error("expected two graph outputs, the upper air first".into())),
    };
    let consts = m.constants(&geom, eu, es, &upper_out)?;
    let stats = consts.statistics(&g)?;
    let (outs, mapped) = plan(&g, &geom, &found, &consts, stats)?;
    let constants = [
        (Const::UpperMeanIn, "upper_mean"),
        (Const::UpperStdIn, "upper_std"),
        (Const::SurfaceMeanIn, "surface_mean"),
        (Const::SurfaceStdIn, "surface_std"),
        (Const::UpperMeanOut, "upper_mean"),
        (Const::UpperStdOut, "upper_std"),
        (Const::SurfaceMeanOut, "surface_mean"),
        (Const::SurfaceStdOut, "surface_std"),
        (Const::UpperConstants, "upper_constants"),
        (Const::SurfaceConstants, "surface_constants"),
    ]
    .into_iter()
    .map(|(c, name)| Mapped {
        onnx: consts.get(c).0.clone(),
        name: name.into(),
    })
    .collect();
    let meta = Meta {
        order: crate::config::BlockOrder::Post,
        interval_hours: Some(interval),
        grid: Some((geom.lat, geom.lon)),
        depths: Depths(found.depths),
        width: found.width,
    };
    // Encode, then write beside and rename after the loader has read it.
    bar.set_length(outs.len() as u64);
    bar.set_position(0);
    let mut encoded: Vec<(String, safetensors::Dtype, Vec<usize>, Bytes)> =
        Vec::with_capacity(outs.len());
    for o in outs {
        bar.set_message(o.name.clone());
        encoded.push(encode(&g, o, opts.dtype)?);
        bar.inc(1);
    }
    let norm_form = m.norm_form.unwrap_or("none");
    drop(m);
    let tmp = partial_path(out);
    let written = weights::serialize(&tmp, &encoded, &meta);
    drop(encoded);
    drop(g);
    drop(model);
    let checked = written.and_then(|()| {
        bar.set_message("reading the output back");
        Weights::read(&tmp, &geom).map(|_| ())
    });
    if let Err(e) = checked {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    std::fs::rename(&tmp, out).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        Error::io(out)(e)
    })?;
    bar.finish_and_clear();
    let bytes = std::fs::metadata(out).map(|m| m.len()).unwrap_or(0);
    Ok(Report {
        meta,
        mapped,
        constants,
        opset,
        norm_form,
        bytes,
    })
}

fn partial_path(out: &Path) -> PathBuf {
    let mut s = out.as_os_str().to_owned();
    s.push(".partial");
    PathBuf::from(s)
}

fn progress(show: bool) -> indicatif::ProgressBar {
    if !show {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(0);
    if let Ok(style) = indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} tensors {msg}")
    {
        bar.set_style(style);
    }
    bar
}

/// The output tensors in the weight file's order, and the mapping of every
/// initializer.
fn plan<'m>(
    g: &Graph<'m>,
    geom: &Geometry,
    f: &Found<'m>,
    consts: &Constants,
    stats: [Vec<f32>; 4],
) -> Result<(Vec<Out<'m>>, Vec<Mapped>)> {
    let c = f.width;
    let mut outs = Vec::new();
    let mut mapped = Vec::new();
    let [um, us, sm, ss] = stats;
    for (name, shape, v) in [
        ("upper_mean", vec![5, 13], um),
        ("upper_std", vec![5, 13], us),
        ("surface_mean", vec![4], sm),
        ("surface_std", vec![4], ss),
    ] {
        outs.push(Out {
            name: name.into(),
            shape,
            source: Source::Values(v),
            learned: false,
        });
    }
    outs.push(Out {
        name: "surface_constants".into(),
        shape: vec![3, geom.lat_padded, geom.lon],
        source: Source::Values(consts.get(Const::SurfaceConstants).1.clone()),
        learned: false,
    });
    let up = consts.get(Const::UpperConstants).1.clone();
    outs.push(Out {
        name: "upper_constants".into(),
        shape: vec![13, geom.lat, geom.lon],
        source: Source::Values(up),
        learned: false,
    });
    let mut add = |name: String, onnx: &'m str, shape: Vec<usize>, layout: Layout| -> Result<()> {
        let t = g
            .inits
            .get(onnx)
            .copied()
            .ok_or_else(|| g.error(format!("`{onnx}` is not an initializer")))?;
        mapped.push(Mapped {
            onnx: onnx.into(),
            name: name.clone(),
        });
        outs.push(Out {
            name,
            shape,
            source: Source::Init(t, layout),
            learned: true,
        });
        Ok(())
    };
    add(
        "patch_embed.conv.weight".into(),
        f.embed[0].0,
        vec![c, 6, 2, 4, 4],
        Layout::Same,
    )?;
    add(
        "patch_embed.conv.bias".into(),
        f.embed[0].1,
        vec![c],
        Layout::Same,
    )?;
    add(
        "patch_embed.conv_surface.weight".into(),
        f.embed[1].0,
        vec![c, 7, 4, 4],
        Layout::Same,
    )?;
    add(
        "patch_embed.conv_surface.bias".into(),
        f.embed[1].1,
        vec![c],
        Layout::Same,
    )?;
    for (l, layer) in f.blocks.iter().enumerate() {
        let w = if l == 1 || l == 2 { 2 * c } else { c };
        for (j, b) in layer.iter().enumerate() {
            let p = |s: &str| format!("layers.{l}.blocks.{j}.{s}");
            add(p("norm1.weight"), b.norm1.0, vec![w], Layout::Same)?;
            add(p("norm1.bias"), b.norm1.1, vec![w], Layout::Same)?;
            add(
                p("attn.qkv.weight"),
                b.qkv.0,
                vec![3 * w, w],
                Layout::Transposed,
            )?;
            add(p("attn.qkv.bias"), b.qkv.1, vec![3 * w], Layout::Same)?;
            let es = init_shape(g, b.earth)?;
            let es = if es.len() == 4 {
                [vec![1], es].concat()
            } else {
                es
            };
            add(p("attn.earth_specific_bias"), b.earth, es, Layout::Same)?;
            add(
                p("attn.proj.weight"),
                b.proj.0,
                vec![w, w],
                Layout::Transposed,
            )?;
            add(p("attn.proj.bias"), b.proj.1, vec![w], Layout::Same)?;
            add(p("norm2.weight"), b.norm2.0, vec![w], Layout::Same)?;
            add(p("norm2.bias"), b.norm2.1, vec![w], Layout::Same)?;
            add(
                p("mlp.fc1.weight"),
                b.fc1.0,
                vec![4 * w, w],
                Layout::Transposed,
            )?;
            add(p("mlp.fc1.bias"), b.fc1.1, vec![4 * w], Layout::Same)?;
            add(
                p("mlp.fc2.weight"),
                b.fc2.0,
                vec![w, 4 * w],
                Layout::Transposed,
            )?;
            add(p("mlp.fc2.bias"), b.fc2.1, vec![w], Layout::Same)?;
        }
        if l == 0 {
            add(
                "downsample.norm.weight".into(),
                f.down.0,
                vec![4 * c],
                Layout::Same,
            )?;
            add(
                "downsample.norm.bias".into(),
                f.down.1,
                vec![4 * c],
                Layout::Same,
            )?;
            add(
                "downsample.reduction.weight".into(),
                f.down.2,
                vec![2 * c, 4 * c],
                Layout::Transposed,
            )?;
        }
        if l == 2 {
            add(
                "upsample.linear1.weight".into(),
                f.up.0,
                vec![4 * c, 2 * c],
                Layout::Transposed,
            )?;
            add("upsample.norm.weight".into(), f.up.1, vec![c], Layout::Same)?;
            add("upsample.norm.bias".into(), f.up.2, vec![c], Layout::Same)?;
            add(
                "upsample.linear2.weight".into(),
                f.up.3,
                vec![c, c],
                Layout::Transposed,
            )?;
        }
    }
    // The recovery's Conv1d weight [160, 2C, 1] is the transposed
    // convolution's [2C, 5, 2, 4, 4] transposed; its bias is per patch
    // position.
    add(
        "patch_recovery.conv.weight".into(),
        f.recover[0].0,
        vec![2 * c, 5, 2, 4, 4],
        Layout::Transposed,
    )?;
    add(
        "patch_recovery.conv.bias".into(),
        f.recover[0].1,
        vec![160],
        Layout::Same,
    )?;
    add(
        "patch_recovery.conv_surface.weight".into(),
        f.recover[1].0,
        vec![2 * c, 4, 4, 4],
        Layout::Transposed,
    )?;
    add(
        "patch_recovery.conv_surface.bias".into(),
        f.recover[1].1,
        vec![64],
        Layout::Same,
    )?;
    Ok((outs, mapped))
}

/// One output tensor's bytes.
fn encode(
    g: &Graph<'_>,
    o: Out<'_>,
    dtype: OutDtype,
) -> Result<(String, safetensors::Dtype, Vec<usize>, Bytes)> {
    let what = |e: String| g.error(format!("{}: {e}", o.name));
    let (bytes, src) = match o.source {
        Source::Values(v) => (
            Bytes::from(v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>()),
            Layout::Same,
        ),
        Source::Init(t, layout) => (
            onnx::f32_bytes(t).map_err(|e| g.error(format!("initializer `{}`: {e}", t.name)))?,
            layout,
        ),
    };
    let n: usize = o.shape.iter().product();
    if bytes.len() != 4 * n {
        return Err(what(format!(
            "{} values for shape {:?}",
            bytes.len() / 4,
            o.shape
        )));
    }
    let f = |c: &[u8]| f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
    let values = |b: &Bytes| -> Vec<f32> { b.chunks_exact(4).map(f).collect() };
    let transposed = |b: &Bytes| -> Vec<f32> {
        // Stored [rows = n / cols, cols] with cols = the output's first
        // dimension: output[i][r] = stored[r][i].
        let cols = o.shape[0];
        let rows = n / cols.max(1);
        let v = values(b);
        let mut t = vec![0f32; n];
        for r in 0..rows {
            for i in 0..cols {
                t[i * rows + r] = v[r * cols + i];
            }
        }
        t
    };
    let out = match (src, dtype, o.learned) {
        (Layout::Same, OutDtype::F32, _) | (Layout::Same, OutDtype::F16, false) => {
            (safetensors::Dtype::F32, bytes)
        }
        (Layout::Transposed, OutDtype::F32, _) | (Layout::Transposed, OutDtype::F16, false) => (
            safetensors::Dtype::F32,
            Bytes::from(
                transposed(&bytes)
                    .iter()
                    .flat_map(|x| x.to_le_bytes())
                    .collect::<Vec<u8>>(),
            ),
        ),
        (layout, OutDtype::F16, true) => {
            let v = if layout == Layout::Same {
                values(&bytes)
            } else {
                transposed(&bytes)
            };
            (
                safetensors::Dtype::F16,
                Bytes::from(
                    v.iter()
                        .flat_map(|&x| half::f16::from_f32(x).to_le_bytes())
                        .collect::<Vec<u8>>(),
                ),
            )
        }
    };
    Ok((o.name, out.0, o.shape, out.1))
}
