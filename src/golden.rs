//! Golden mode: run one kernel on tensors read from `.npy` files and write
//! its outputs as `.npy`, so results can be compared with tensors dumped
//! from PyTorch (`numpy.save(path, t.cpu().numpy())`).
//!
//! ```text
//! wavefuse-suite check KERNEL --in NAME=PATH ... [--eps E] [--heads H] [--tanh]
//!                             --out-dir DIR [--backend B]
//! ```
//! Floating inputs are float16 (`<f2`), tables int32 (`<i4`); the last axis
//! of a row tensor is its width.
//!
//! | kernel | inputs | outputs |
//! |---|---|---|
//! | `layer_norm` | `x` [, `gamma`, `beta`] | `y` |
//! | `add_layer_norm` | `residual`, `branch` [, `gamma`, `beta`] | `residual_out`, `y` |
//! | `gather` | `src` [N, C], `idx` [T] | `out` [T, C] |
//! | `layer_norm_gather` | `src`, `idx` [, `gamma`, `beta`] | `out` |
//! | `bias_gelu` | `x` [R, C], `bias` [C] (`--tanh`) | `y` |
//! | `qkv_split` | `qkv` [W*144, 3C] (`--heads H`) | `q`, `k`, `v` [W, H, 144, 32] |
//! | `bias_mask_add` | `scores` [W, H, T, T], `bias` [types, H, T, T], `types` [W] [, `mask` [slots, T, T], `slots` [W]] | `scores` |
//! | `bias_mask_softmax` | as `bias_mask_add` | `probs` |
//! | `window_attention` | `qkv` [W*144, 3C] [, `qkv_bias` [3C]], `bias` [types, H, 144, 144], `types` [W] [, `labels` [slots, 144] i32 region labels (mask 0 within a region, -100 across), `slots` [W]] (`--heads H`, scale 32^-0.5) | `out` [W*144, C] |
use npyz::WriterBuilder;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use wavefuse::{
    Affine, AttnBias, AttnMask, Choice, Device, DeviceBuffer, GatherPlan, GeluBias, GeluMode,
    QkvSplit, RegionLabels, RegionMask, WindowAttention, WindowBias, WindowTable,
    add_layer_norm_to, bias_gelu, bias_mask_add, bias_mask_softmax, f16, gather, layer_norm,
    layer_norm_gather, qkv_split, window_attention,
};

pub struct Tensor<T> {
    pub shape: Vec<u64>,
    pub data: Vec<T>,
}

/// An element type golden mode reads: its npy `descr`, little-endian, and
/// its size in bytes.
pub trait NpyElem: Sized {
    /// `<f2` or `<i4`.
    const DESCR: &'static str;
    /// Bytes per element.
    const SIZE: usize;
    /// The element of `SIZE` little-endian bytes.
    fn from_le(b: &[u8]) -> Self;
}

impl NpyElem for f16 {
    const DESCR: &'static str = "<f2";
    const SIZE: usize = 2;
    fn from_le(b: &[u8]) -> f16 {
        f16::from_le_bytes([b[0], b[1]])
    }
}

impl NpyElem for i32 {
    const DESCR: &'static str = "<i4";
    const SIZE: usize = 4;
    fn from_le(b: &[u8]) -> i32 {
        i32::from_le_bytes([b[0], b[1], b[2], b[3]])
    }
}

/// The shape an npy header declares, read before any npy parser sees it:
/// npyz multiplies the dimensions unchecked, so a hostile header such as
/// `(2**32, 2**32, 192)` would overflow there. `None` when the header is
/// not one or a dimension is not a `u64`.
fn declared_shape(bytes: &[u8]) -> Option<Vec<u64>> {
    let (len, start): (usize, usize) = match (bytes.get(..6)?, *bytes.get(6)?) {
        (b"\x93NUMPY", 1) => (
            usize::from(u16::from_le_bytes([*bytes.get(8)?, *bytes.get(9)?])),
            10,
        ),
        (b"\x93NUMPY", 2 | 3) => {
            let b: [u8; 4] = bytes.get(8..12)?.try_into().ok()?;
            (usize::try_from(u32::from_le_bytes(b)).ok()?, 12)
        }
        _ => return None,
    };
    let header = std::str::from_utf8(bytes.get(start..start.checked_add(len)?)?).ok()?;
    let rest = &header[header.find("'shape'")? + "'shape'".len()..];
    let inner = &rest[rest.find('(')? + 1..];
    let inner = &inner[..inner.find(')')?];
    inner
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .map(|d| d.parse::<u64>().ok())
        .collect()
}

/// Reads an npy file of `T`, refusing before any allocation of its data
/// what a hostile or broken file can claim: a shape whose element count
/// overflows, data shorter or longer than the shape says, another dtype or
/// byte order, Fortran order.
pub fn read_npy<T: NpyElem>(path: &Path) -> Result<Tensor<T>, String> {
    let p = path.display();
    let bytes = std::fs::read(path).map_err(|e| format!("{p}: {e}"))?;
    let declared =
        declared_shape(&bytes).ok_or(format!("{p}: not an npy file (no readable header)"))?;
    let want = declared
        .iter()
        .try_fold(1u64, |a, &d| a.checked_mul(d))
        .and_then(|n| n.checked_mul(T::SIZE as u64))
        .and_then(|b| usize::try_from(b).ok());
    let Some(want) = want else {
        return Err(format!(
            "{p}: shape {declared:?} has more elements than memory can hold"
        ));
    };
    let npy = npyz::NpyFile::new(&bytes[..]).map_err(|e| format!("{p}: not an npy file: {e}"))?;
    let shape = npy.shape().to_vec();
    let descr = npy.dtype().descr();
    let descr = descr.trim_matches('\'');
    if descr != T::DESCR {
        return Err(format!(
            "{p}: dtype {descr}, expected {} (float16 data are <f2, int32 tables <i4)",
            T::DESCR
        ));
    }
    if npy.order() != npyz::Order::C {
        return Err(format!("{p}: Fortran order not supported (write C order)"));
    }
    let data = npy.into_inner();
    if data.len() != want {
        return Err(if data.len() < want {
            format!(
                "{p}: truncated: {} bytes of data, shape {shape:?} needs {want}",
                data.len()
            )
        } else {
            format!(
                "{p}: {} trailing bytes after the {want} bytes shape {shape:?} needs",
                data.len() - want
            )
        });
    }
    let data = data.chunks_exact(T::SIZE).map(T::from_le).collect();
    Ok(Tensor { shape, data })
}

pub fn write_npy(path: &Path, shape: &[u64], data: &[f16]) -> Result<(), String> {
    let mut buf = Vec::new();
    let mut w = npyz::WriteOptions::<f16>::new()
        .default_dtype()
        .shape(shape)
        .writer(&mut buf)
        .begin_nd()
        .map_err(|e| e.to_string())?;
    w.extend(data.iter().copied()).map_err(|e| e.to_string())?;
    w.finish().map_err(|e| e.to_string())?;
    // Written beside and renamed: the file appears complete or not at all.
    let tmp = path.with_extension("npy.partial");
    std::fs::write(&tmp, buf).map_err(|e| format!("{}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, path).map_err(|e| format!("{}: {e}", path.display()))
}

struct Args {
    kernel: String,
    inputs: HashMap<String, PathBuf>,
    eps: f32,
    heads: Option<usize>,
    tanh: bool,
    out_dir: PathBuf,
    backend: Choice,
    /// Outputs, written together once the kernel has run.
    outputs: std::cell::RefCell<Vec<Output>>,
}

/// An output: name, shape, values.
type Output = (String, Vec<u64>, Vec<f16>);

/// Each kernel's input names: required, then optional. `gamma` and `beta`
/// come together, as do a mask and its `slots`.
fn input_names(kernel: &str) -> Option<(&'static [&'static str], &'static [&'static str])> {
    Some(match kernel {
        "layer_norm" => (&["x"], &["gamma", "beta"]),
        "add_layer_norm" => (&["residual", "branch"], &["gamma", "beta"]),
        "gather" => (&["src", "idx"], &[]),
        "layer_norm_gather" => (&["src", "idx"], &["gamma", "beta"]),
        "bias_gelu" => (&["x", "bias"], &[]),
        "qkv_split" => (&["qkv"], &[]),
        "bias_mask_add" | "bias_mask_softmax" => (&["scores", "bias", "types"], &["mask", "slots"]),
        "window_attention" => (&["qkv", "bias", "types"], &["qkv_bias", "labels", "slots"]),
        _ => return None,
    })
}

/// Refuses an unknown kernel, a missing or unknown input name and half of
/// a pair, before any file is read.
fn check_names(a: &Args) -> Result<(), String> {
    let (need, may) =
        input_names(&a.kernel).ok_or(format!("check: unknown kernel {}", a.kernel))?;
    for n in need {
        if !a.has(n) {
            return Err(format!("{} needs --in {n}=PATH", a.kernel));
        }
    }
    let mut given: Vec<&String> = a.inputs.keys().collect();
    given.sort();
    for n in given {
        if !need.contains(&n.as_str()) && !may.contains(&n.as_str()) {
            let all: Vec<&str> = need.iter().chain(may.iter()).copied().collect();
            return Err(format!(
                "{}: unknown input `{n}` (its inputs: {})",
                a.kernel,
                all.join(", ")
            ));
        }
    }
    for (x, y) in [("gamma", "beta"), ("mask", "slots"), ("labels", "slots")] {
        if may.contains(&x) && a.has(x) != a.has(y) {
            let (have, lack) = if a.has(x) { (x, y) } else { (y, x) };
            return Err(format!("{}: --in {have} needs --in {lack}", a.kernel));
        }
    }
    Ok(())
}

impl Args {
    fn f16(&self, name: &str) -> Result<Tensor<f16>, String> {
        read_npy(self.path(name)?)
    }
    fn i32(&self, name: &str) -> Result<Tensor<i32>, String> {
        read_npy(self.path(name)?)
    }
    fn path(&self, name: &str) -> Result<&PathBuf, String> {
        self.inputs
            .get(name)
            .ok_or(format!("{} needs --in {name}=PATH", self.kernel))
    }
    fn has(&self, name: &str) -> bool {
        self.inputs.contains_key(name)
    }
    fn write(&self, name: &str, shape: &[u64], data: &[f16]) -> Result<(), String> {
        self.outputs
            .borrow_mut()
            .push((name.to_string(), shape.to_vec(), data.to_vec()));
        Ok(())
    }
}

fn parse(mut it: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut a = Args {
        kernel: it.next().ok_or("check needs a kernel name")?,
        inputs: HashMap::new(),
        eps: 1e-5,
        heads: None,
        tanh: false,
        out_dir: PathBuf::from("."),
        backend: Choice::Auto,
        outputs: Default::default(),
    };
    while let Some(s) = it.next() {
        let mut val = || it.next().ok_or(format!("{s} needs a value"));
        match s.as_str() {
            "--in" => {
                let v = val()?;
                let (k, p) = v.split_once('=').ok_or("--in takes NAME=PATH")?;
                if a.inputs.insert(k.to_string(), p.into()).is_some() {
                    return Err(format!("--in {k} given twice"));
                }
            }
            "--eps" => a.eps = val()?.parse().map_err(|e| format!("--eps: {e}"))?,
            "--heads" => a.heads = Some(val()?.parse().map_err(|e| format!("--heads: {e}"))?),
            "--tanh" => a.tanh = true,
            "--out-dir" => a.out_dir = val()?.into(),
            "--backend" => {
                let v = val()?;
                a.backend = Choice::parse(&v).ok_or(format!("unknown backend {v}"))?;
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(a)
}

fn width(t: &Tensor<f16>, what: &str) -> Result<usize, String> {
    t.shape
        .last()
        .map(|&w| w as usize)
        .ok_or(format!("{what} must have at least one axis"))
}

/// gamma and beta on the device.
type GammaBeta = (DeviceBuffer<f16>, DeviceBuffer<f16>);

/// Optional gamma/beta uploaded.
fn affine(a: &Args, dev: &Device) -> Result<Option<GammaBeta>, String> {
    if !a.has("gamma") {
        return Ok(None);
    }
    let e = |e: wavefuse::Error| e.to_string();
    let (g, b) = (a.f16("gamma")?, a.f16("beta")?);
    Ok(Some((
        dev.upload(&g.data).map_err(e)?,
        dev.upload(&b.data).map_err(e)?,
    )))
}

pub fn run(args: impl Iterator<Item = String>) -> Result<(), String> {
    let a = parse(args)?;
    check_names(&a)?;
    let dev = Device::open(a.backend).map_err(|e| e.to_string())?;
    let e = |e: wavefuse::Error| e.to_string();
    let gb = affine(&a, &dev)?;
    let views = gb.as_ref().map(|(g, b)| (g.view(), b.view()));
    let aff = views.as_ref().map(|(gamma, beta)| Affine { gamma, beta });
    match a.kernel.as_str() {
        "layer_norm" => {
            let x = a.f16("x")?;
            let xd = dev.upload(&x.data).map_err(e)?;
            let mut y = dev.alloc::<f16>(x.data.len()).map_err(e)?;
            layer_norm(
                &dev,
                &xd.view(),
                &mut y.view_mut(),
                width(&x, "x")?,
                aff,
                a.eps,
            )
            .map_err(e)?;
            a.write("y", &x.shape, &y.download().map_err(e)?)?;
        }
        "add_layer_norm" => {
            let (r, b) = (a.f16("residual")?, a.f16("branch")?);
            let (rd, bd) = (
                dev.upload(&r.data).map_err(e)?,
                dev.upload(&b.data).map_err(e)?,
            );
            let mut ro = dev.alloc::<f16>(r.data.len()).map_err(e)?;
            let mut y = dev.alloc::<f16>(r.data.len()).map_err(e)?;
            let w = width(&r, "residual")?;
            add_layer_norm_to(
                &dev,
                &rd.view(),
                &bd.view(),
                &mut ro.view_mut(),
                &mut y.view_mut(),
                w,
                aff,
                a.eps,
            )
            .map_err(e)?;
            a.write("residual_out", &r.shape, &ro.download().map_err(e)?)?;
            a.write("y", &r.shape, &y.download().map_err(e)?)?;
        }
        "gather" | "layer_norm_gather" => {
            let (src, idx) = (a.f16("src")?, a.i32("idx")?);
            let c = width(&src, "src")?;
            let n_src = src.data.len() / c.max(1);
            let plan = GatherPlan::new(&dev, &idx.data, n_src).map_err(e)?;
            let sd = dev.upload(&src.data).map_err(e)?;
            let mut out = dev.alloc::<f16>(idx.data.len() * c).map_err(e)?;
            if a.kernel == "gather" {
                gather(&dev, &plan, &sd.view(), &mut out.view_mut(), c).map_err(e)?;
            } else {
                layer_norm_gather(&dev, &plan, &sd.view(), &mut out.view_mut(), c, aff, a.eps)
                    .map_err(e)?;
            }
            a.write(
                "out",
                &[idx.data.len() as u64, c as u64],
                &out.download().map_err(e)?,
            )?;
        }
        "bias_gelu" => {
            let (x, b) = (a.f16("x")?, a.f16("bias")?);
            let (xd, bd) = (
                dev.upload(&x.data).map_err(e)?,
                dev.upload(&b.data).map_err(e)?,
            );
            let mut y = dev.alloc::<f16>(x.data.len()).map_err(e)?;
            let mode = if a.tanh {
                GeluMode::Tanh
            } else {
                GeluMode::Erf
            };
            let bv = bd.view();
            bias_gelu(
                &dev,
                &xd.view(),
                GeluBias::F16(&bv),
                &mut y.view_mut(),
                width(&x, "x")?,
                mode,
            )
            .map_err(e)?;
            a.write("y", &x.shape, &y.download().map_err(e)?)?;
        }
        "qkv_split" => {
            let x = a.f16("qkv")?;
            let heads = a.heads.ok_or("qkv_split needs --heads H")?;
            let p = QkvSplit::new(heads);
            let xd = dev.upload(&x.data).map_err(e)?;
            let n = x.data.len() / 3;
            let (mut q, mut k, mut v) = (
                dev.alloc::<f16>(n).map_err(e)?,
                dev.alloc::<f16>(n).map_err(e)?,
                dev.alloc::<f16>(n).map_err(e)?,
            );
            qkv_split(
                &dev,
                &xd.view(),
                None,
                &mut q.view_mut(),
                &mut k.view_mut(),
                &mut v.view_mut(),
                &p,
            )
            .map_err(e)?;
            let windows = (n / (heads * p.tokens_per_window * p.head_dim).max(1)) as u64;
            let shape = [
                windows,
                heads as u64,
                p.tokens_per_window as u64,
                p.head_dim as u64,
            ];
            a.write("q", &shape, &q.download().map_err(e)?)?;
            a.write("k", &shape, &k.download().map_err(e)?)?;
            a.write("v", &shape, &v.download().map_err(e)?)?;
        }
        "bias_mask_add" | "bias_mask_softmax" => {
            let (s, bias, types) = (a.f16("scores")?, a.f16("bias")?, a.i32("types")?);
            if s.shape.len() != 4 || bias.shape.len() != 4 {
                return Err("scores and bias must be 4-D: [windows|types, heads, T, T]".into());
            }
            let (heads, t) = (s.shape[1] as usize, s.shape[3] as usize);
            let ty = WindowTable::new(&dev, &types.data, bias.shape[0] as usize).map_err(e)?;
            let bd = dev.upload(&bias.data).map_err(e)?;
            let mask = if a.has("mask") {
                let (m, sl) = (a.f16("mask")?, a.i32("slots")?);
                let n_slots = m.shape.first().copied().unwrap_or(0) as usize;
                Some((
                    dev.upload(&m.data).map_err(e)?,
                    WindowTable::new(&dev, &sl.data, n_slots).map_err(e)?,
                ))
            } else {
                None
            };
            let mv = mask.as_ref().map(|(m, _)| m.view());
            let bv = bd.view();
            let ab = AttnBias {
                bias: &bv,
                ty: &ty,
                mask: match (&mv, &mask) {
                    (Some(m), Some((_, slot))) => Some(AttnMask { mask: m, slot }),
                    _ => None,
                },
            };
            let mut sd = dev.upload(&s.data).map_err(e)?;
            if a.kernel == "bias_mask_add" {
                bias_mask_add(&dev, &mut sd.view_mut(), heads, t, &ab).map_err(e)?;
                a.write("scores", &s.shape, &sd.download().map_err(e)?)?;
            } else {
                let mut p = dev.alloc::<f16>(s.data.len()).map_err(e)?;
                bias_mask_softmax(&dev, &sd.view(), &mut p.view_mut(), heads, t, &ab).map_err(e)?;
                a.write("probs", &s.shape, &p.download().map_err(e)?)?;
            }
        }
        "window_attention" => {
            let (x, bias, types) = (a.f16("qkv")?, a.f16("bias")?, a.i32("types")?);
            let heads = a.heads.ok_or("window_attention needs --heads H")?;
            let p = WindowAttention::new(heads);
            if bias.shape.len() != 4 {
                return Err("bias must be 4-D: [types, heads, 144, 144]".into());
            }
            let ty = WindowTable::new(&dev, &types.data, bias.shape[0] as usize).map_err(e)?;
            let (xd, bd) = (
                dev.upload(&x.data).map_err(e)?,
                dev.upload(&bias.data).map_err(e)?,
            );
            let qb = if a.has("qkv_bias") {
                Some(dev.upload(&a.f16("qkv_bias")?.data).map_err(e)?)
            } else {
                None
            };
            let mask = if a.has("labels") {
                let (l, sl) = (a.i32("labels")?, a.i32("slots")?);
                if l.shape.len() != 2 {
                    return Err("labels must be 2-D: [slots, 144]".into());
                }
                Some((
                    RegionLabels::new(&dev, &l.data, l.shape[1] as usize).map_err(e)?,
                    WindowTable::new(&dev, &sl.data, l.shape[0] as usize).map_err(e)?,
                ))
            } else {
                None
            };
            let (bv, qbv) = (bd.view(), qb.as_ref().map(|b| b.view()));
            let ab = WindowBias {
                bias: &bv,
                ty: &ty,
                mask: mask
                    .as_ref()
                    .map(|(labels, slot)| RegionMask { labels, slot }),
            };
            let mut out = dev.alloc::<f16>(x.data.len() / 3).map_err(e)?;
            window_attention(&dev, &xd.view(), qbv.as_ref(), &ab, &mut out.view_mut(), &p)
                .map_err(e)?;
            let c = (heads * p.head_dim) as u64;
            let tokens = out.len() as u64 / c.max(1);
            a.write("out", &[tokens, c], &out.download().map_err(e)?)?;
        }
        other => return Err(format!("check: unknown kernel {other}")),
    }
    // Every input was read and checked and the kernel ran: now the outputs.
    std::fs::create_dir_all(&a.out_dir).map_err(|e| format!("{}: {e}", a.out_dir.display()))?;
    for (name, shape, data) in a.outputs.borrow().iter() {
        write_npy(&a.out_dir.join(format!("{name}.npy")), shape, data)?;
    }
    eprintln!(
        "check {} on {}: outputs in {}",
        a.kernel,
        dev.info().name,
        a.out_dir.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn npy_round_trip_keeps_shape_and_bits() {
        let data = [1.5, -0.0, 65504.0, f32::NAN, 1e-7, -3.25]
            .map(f16::from_f32)
            .to_vec();
        let p = std::env::temp_dir().join(format!("wavefuse-npy-{}.npy", std::process::id()));
        write_npy(&p, &[2, 3], &data).expect("write");
        let r: Tensor<f16> = read_npy(&p).expect("read");
        let _ = std::fs::remove_file(&p);
        assert_eq!(r.shape, vec![2, 3]);
        assert!(
            r.data
                .iter()
                .zip(&data)
                .all(|(a, b)| a.to_bits() == b.to_bits())
        );
    }
}
