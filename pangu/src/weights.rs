//! The weight file (`MODEL.md`): the names and shapes the network needs,
//! reading and checking a safetensors file before anything is built, and
//! the seeded weights shared with the PyTorch reference.
use crate::config::{BlockOrder, Depths, Geometry, LEVELS, RELEASED_WIDTH, check_width};
use crate::error::{Error, Result};
use crate::seeded;
use crate::stage::tables::bias_table_rows;
use candle_core::{DType, Device, Tensor};
use std::collections::HashMap;
use std::path::Path;
use wavefuse_shared::window::Window3;

/// Pangu's window.
pub const WINDOW: Window3 = Window3 { z: 2, h: 6, w: 12 };

/// Tokens per window.
pub const TOKENS: usize = 144;

/// How a tensor is made by the seeded generator.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Init {
    /// `center + scale * unit`.
    Uniform {
        /// Centre.
        center: f64,
        /// Half range.
        scale: f64,
    },
    /// The formulaic statistics (`upper_mean` ...).
    Stats,
}

/// One tensor of the weight file.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    /// Its `state_dict` name.
    pub name: String,
    /// Its shape (the earth bias: the compact table).
    pub shape: Vec<usize>,
    /// How the seeded weights make it.
    pub init: Init,
}

/// Window types at a scale of `h` token latitudes: `(8 / 2) * (Hpad / 6)`.
pub fn window_types(h: usize) -> usize {
    4 * h.div_ceil(WINDOW.h)
}

/// Every tensor of the weight file for `g`, `depths` and the first-scale
/// `width`, in `state_dict` order.
pub fn entries(g: &Geometry, depths: Depths, width: usize) -> Vec<Entry> {
    let (c1, c2) = (width, 2 * width);
    let mut v = Vec::new();
    let mut push =
        |name: String, shape: Vec<usize>, init: Init| v.push(Entry { name, shape, init });
    let u = |center: f64, scale: f64| Init::Uniform { center, scale };
    let lin = |fan_in: usize| u(0.0, 1.0 / (fan_in as f64).sqrt());
    let bias = u(0.0, 0.02);
    for (n, s) in [
        ("upper_mean", vec![5, 13]),
        ("upper_std", vec![5, 13]),
        ("surface_mean", vec![4]),
        ("surface_std", vec![4]),
    ] {
        push(n.into(), s, Init::Stats);
    }
    push(
        "surface_constants".into(),
        vec![3, g.lat_padded, g.lon],
        u(0.0, 1.0),
    );
    push(
        "upper_constants".into(),
        vec![13, g.lat, g.lon],
        u(0.0, 1.0),
    );
    push(
        "patch_embed.conv.weight".into(),
        vec![c1, 6, 2, 4, 4],
        lin(192),
    );
    push("patch_embed.conv.bias".into(), vec![c1], bias);
    push(
        "patch_embed.conv_surface.weight".into(),
        vec![c1, 7, 4, 4],
        lin(112),
    );
    push("patch_embed.conv_surface.bias".into(), vec![c1], bias);
    for (l, &(blocks, c)) in depths.layers(width).iter().enumerate() {
        let h = if c == c1 { g.h1 } else { g.h2 };
        let (types, heads) = (window_types(h), c / 32);
        for j in 0..blocks {
            let p = |s: &str| format!("layers.{l}.blocks.{j}.{s}");
            push(p("norm1.weight"), vec![c], u(1.0, 0.2));
            push(p("norm1.bias"), vec![c], u(0.0, 0.1));
            push(p("attn.qkv.weight"), vec![3 * c, c], lin(c));
            push(p("attn.qkv.bias"), vec![3 * c], bias);
            push(
                p("attn.earth_specific_bias"),
                vec![bias_table_rows(WINDOW), types, heads],
                u(0.0, 0.5),
            );
            push(p("attn.proj.weight"), vec![c, c], lin(c));
            push(p("attn.proj.bias"), vec![c], bias);
            push(p("norm2.weight"), vec![c], u(1.0, 0.2));
            push(p("norm2.bias"), vec![c], u(0.0, 0.1));
            push(p("mlp.fc1.weight"), vec![4 * c, c], lin(c));
            push(p("mlp.fc1.bias"), vec![4 * c], bias);
            push(p("mlp.fc2.weight"), vec![c, 4 * c], lin(4 * c));
            push(p("mlp.fc2.bias"), vec![c], bias);
        }
        if l == 0 {
            push("downsample.norm.weight".into(), vec![4 * c1], u(1.0, 0.2));
            push("downsample.norm.bias".into(), vec![4 * c1], u(0.0, 0.1));
            push(
                "downsample.reduction.weight".into(),
                vec![c2, 4 * c1],
                lin(4 * c1),
            );
        }
        if l == 2 {
            push("upsample.linear1.weight".into(), vec![4 * c1, c2], lin(c2));
            push("upsample.norm.weight".into(), vec![c1], u(1.0, 0.2));
            push("upsample.norm.bias".into(), vec![c1], u(0.0, 0.1));
            push("upsample.linear2.weight".into(), vec![c1, c1], lin(c1));
        }
    }
    push(
        "patch_recovery.conv.weight".into(),
        vec![c2, 5, 2, 4, 4],
        lin(c2),
    );
    push("patch_recovery.conv.bias".into(), vec![5], bias);
    push(
        "patch_recovery.conv_surface.weight".into(),
        vec![c2, 4, 4, 4],
        lin(c2),
    );
    push("patch_recovery.conv_surface.bias".into(), vec![4], bias);
    v
}

/// The formulaic statistics (`MODEL.md`) in f64: `upper_mean`,
/// `upper_std` `[5 * 13]`, `surface_mean`, `surface_std` `[4]`.
pub fn statistics() -> [(&'static str, Vec<f64>); 4] {
    let mut mean = Vec::with_capacity(65);
    let mut std = Vec::with_capacity(65);
    for v in 0..5 {
        for &p in &LEVELS {
            let p = f64::from(p);
            let l = (1013.25 / p).ln();
            let (m, s) = match v {
                0 => (9.80665 * 7000.0 * l, 1000.0),
                1 => {
                    let m = 0.01 * (p / 1000.0).powi(3);
                    (m, 0.5 * m + 1e-6)
                }
                2 => ((288.0 - 6.5e-3 * 7000.0 * l).max(210.0), 10.0),
                3 => (5.0, 10.0 + 0.01 * (1000.0 - p)),
                _ => (0.0, 8.0),
            };
            mean.push(m);
            std.push(s);
        }
    }
    [
        ("upper_mean", mean),
        ("upper_std", std),
        ("surface_mean", vec![101325.0, 0.0, 0.0, 278.0]),
        ("surface_std", vec![1000.0, 5.0, 4.0, 20.0]),
    ]
}

/// One tensor's seeded values.
pub fn seeded_values(e: &Entry, seed: u64) -> Vec<f32> {
    let n: usize = e.shape.iter().product();
    match e.init {
        Init::Uniform { center, scale } => seeded::uniform(&e.name, seed, n, center, scale),
        Init::Stats => statistics()
            .into_iter()
            .find(|(name, _)| *name == e.name)
            .map(|(_, v)| v.into_iter().map(|x| x as f32).collect())
            .unwrap_or_default(),
    }
}

/// The seeded inputs `(upper [5, 13, H, W], surface [4, H, W])`:
/// `mean + std * unit` per variable and level (`MODEL.md`).
pub fn seeded_inputs(g: &Geometry, seed: u64) -> (Vec<f32>, Vec<f32>) {
    let [(_, um), (_, us), (_, sm), (_, ss)] = statistics();
    let plane = g.lat * g.lon;
    let ku = seeded::key("input_upper", seed);
    let upper = (0..g.upper_len())
        .map(|i| {
            let c = i / plane;
            (um[c] + us[c] * seeded::unit(ku, i as u64)) as f32
        })
        .collect();
    let ks = seeded::key("input_surface", seed);
    let surface = (0..g.surface_len())
        .map(|i| {
            let c = i / plane;
            (sm[c] + ss[c] * seeded::unit(ks, i as u64)) as f32
        })
        .collect();
    (upper, surface)
}

/// The metadata of a weight file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Meta {
    /// The block order (`block_order`; `post` when absent, as the released
    /// weights are).
    pub order: BlockOrder,
    /// The model's lead (`interval_hours`), if recorded.
    pub interval_hours: Option<u32>,
    /// The grid (`lat`, `lon`), if recorded.
    pub grid: Option<(usize, usize)>,
    /// Blocks per layer (`depths`, e.g. `2,6,6,2`; the released model's
    /// when absent).
    pub depths: Depths,
    /// Channels of the first scale (`width`; the released model's 192
    /// when absent).
    pub width: usize,
}

impl Meta {
    /// The file's metadata map.
    pub fn to_map(&self) -> HashMap<String, String> {
        let mut m = HashMap::new();
        m.insert("format".into(), "pangu-weather".into());
        m.insert("block_order".into(), self.order.name().into());
        m.insert("depths".into(), self.depths.name());
        m.insert("width".into(), self.width.to_string());
        if let Some(h) = self.interval_hours {
            m.insert("interval_hours".into(), h.to_string());
        }
        if let Some((lat, lon)) = self.grid {
            m.insert("lat".into(), lat.to_string());
            m.insert("lon".into(), lon.to_string());
        }
        m
    }
}

/// A weight file read into host memory and checked against the network.
#[derive(Debug)]
pub struct Weights {
    /// Where it came from (for messages).
    pub file: String,
    /// The tensors, f32 on the CPU.
    pub tensors: HashMap<String, Tensor>,
    /// The metadata.
    pub meta: Meta,
}

/// Writes `tensors` (name, element type, shape, little-endian bytes) as a
/// safetensors file at `path` with `meta`, as it is (no rename); a file
/// left half-written by an error is removed.
pub fn serialize<B: AsRef<[u8]>>(
    path: &Path,
    tensors: &[(String, safetensors::Dtype, Vec<usize>, B)],
    meta: &Meta,
) -> Result<()> {
    let bad = |why: String| Error::Format {
        file: path.display().to_string(),
        why,
    };
    let mut views = Vec::with_capacity(tensors.len());
    for (name, dtype, shape, b) in tensors {
        let view = safetensors::tensor::TensorView::new(*dtype, shape.clone(), b.as_ref())
            .map_err(|e| bad(format!("{name}: {e}")))?;
        views.push((name.clone(), view));
    }
    safetensors::serialize_to_file(views, Some(meta.to_map()), path).map_err(|e| {
        let _ = std::fs::remove_file(path);
        bad(e.to_string())
    })
}

/// Writes `tensors` (name, shape, f32 values) as a safetensors file with
/// `meta`; the file appears complete or not at all (written beside and
/// renamed).
pub fn write_file(
    path: &Path,
    tensors: &[(String, Vec<usize>, Vec<f32>)],
    meta: &Meta,
) -> Result<()> {
    let encoded: Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)> = tensors
        .iter()
        .map(|(name, shape, v)| {
            let b = v.iter().flat_map(|x| x.to_le_bytes()).collect();
            (name.clone(), safetensors::Dtype::F32, shape.clone(), b)
        })
        .collect();
    let tmp = path.with_extension("safetensors.partial");
    serialize(&tmp, &encoded, meta)?;
    std::fs::rename(&tmp, path).map_err(Error::io(path))
}

/// The seeded weight file's tensors for `g` and the architecture of
/// `meta` (depths and width).
pub fn seeded_tensors(g: &Geometry, meta: &Meta, seed: u64) -> Vec<(String, Vec<usize>, Vec<f32>)> {
    entries(g, meta.depths, meta.width)
        .into_iter()
        .map(|e| {
            let v = seeded_values(&e, seed);
            (e.name, e.shape, v)
        })
        .collect()
}

/// The patch recovery's biases come one per output variable (the
/// transposed convolution of the pseudocode, `[5]` and `[4]`) or one per
/// patch position (the released files' kernel-1 convolution over patches,
/// `[160]` = 5 x 2 x 4 x 4 and `[64]` = 4 x 4 x 4, in the order of the
/// recovery's output features). The per-position length, for those two.
fn recovery_bias_per_position(name: &str) -> Option<usize> {
    match name {
        "patch_recovery.conv.bias" => Some(160),
        "patch_recovery.conv_surface.bias" => Some(64),
        _ => None,
    }
}

/// The shapes accepted for the earth bias of `types` types and `heads`
/// heads: the compact table, or the expanded per-type bias (with or
/// without the released graph's leading 1).
fn bias_shapes(types: usize, heads: usize) -> [Vec<usize>; 3] {
    [
        vec![bias_table_rows(WINDOW), types, heads],
        vec![types, heads, TOKENS, TOKENS],
        vec![1, types, heads, TOKENS, TOKENS],
    ]
}

fn parse_meta(file: &str, m: Option<&HashMap<String, String>>) -> Result<Meta> {
    let bad = |why: String| Error::Format {
        file: file.into(),
        why,
    };
    let Some(m) = m else {
        return Ok(Meta {
            order: BlockOrder::Post,
            interval_hours: None,
            grid: None,
            depths: Depths::RELEASED,
            width: RELEASED_WIDTH,
        });
    };
    if let Some(f) = m.get("format")
        && f != "pangu-weather"
    {
        return Err(bad(format!(
            "metadata format `{f}`, expected pangu-weather"
        )));
    }
    let order = match m.get("block_order") {
        Some(s) => BlockOrder::parse(s).map_err(|e| bad(e.to_string()))?,
        None => BlockOrder::Post,
    };
    let num = |k: &str| -> Result<Option<usize>> {
        m.get(k)
            .map(|s| {
                s.parse::<usize>()
                    .map_err(|_| bad(format!("metadata {k} = `{s}`")))
            })
            .transpose()
    };
    let interval_hours = num("interval_hours")?.map(|h| h as u32);
    let grid = match (num("lat")?, num("lon")?) {
        (Some(a), Some(b)) => Some((a, b)),
        _ => None,
    };
    let depths = match m.get("depths") {
        Some(s) => Depths::parse(s).map_err(|e| bad(format!("metadata: {e}")))?,
        None => Depths::RELEASED,
    };
    let width = match num("width")? {
        Some(w) => check_width(w).map_err(|e| bad(format!("metadata: {e}")))?,
        None => RELEASED_WIDTH,
    };
    Ok(Meta {
        order,
        interval_hours,
        grid,
        depths,
        width,
    })
}

impl Weights {
    /// Reads `path` and checks every tensor against the network on `g`:
    /// names, shapes, element types (f32, f16 or bf16) and finite values.
    /// Nothing is built before every check has passed.
    pub fn read(path: &Path, g: &Geometry) -> Result<Weights> {
        let file = path.display().to_string();
        let bytes = std::fs::read(path).map_err(Error::io(path))?;
        let st = safetensors::SafeTensors::deserialize(&bytes).map_err(|e| Error::Format {
            file: file.clone(),
            why: format!("not a safetensors file: {e}"),
        })?;
        let (_, md) =
            safetensors::SafeTensors::read_metadata(&bytes).map_err(|e| Error::Format {
                file: file.clone(),
                why: e.to_string(),
            })?;
        let meta = parse_meta(&file, md.metadata().as_ref())?;
        if let Some((lat, lon)) = meta.grid
            && (lat, lon) != (g.lat, g.lon)
        {
            return Err(Error::Format {
                file,
                why: format!(
                    "made for a {lat} x {lon} grid, the input fields are {} x {}",
                    g.lat, g.lon
                ),
            });
        }
        let want = entries(g, meta.depths, meta.width);
        let known: HashMap<&str, &Entry> = want.iter().map(|e| (e.name.as_str(), e)).collect();
        let mut unknown = Vec::new();
        for (name, view) in st.tensors() {
            if !known.contains_key(name.as_str()) {
                unknown.push((name, view.shape().to_vec()));
            }
        }
        unknown.sort();
        let mut tensors = HashMap::new();
        for e in &want {
            let Ok(view) = st.tensor(&e.name) else {
                let hint = if unknown.is_empty() {
                    String::new()
                } else {
                    let names: Vec<&str> =
                        unknown.iter().take(4).map(|(n, _)| n.as_str()).collect();
                    format!(" (the file has unknown tensors: {})", names.join(", "))
                };
                return Err(Error::MissingTensor {
                    file,
                    name: e.name.clone(),
                    hint,
                });
            };
            let shape = view.shape().to_vec();
            let per_position = recovery_bias_per_position(&e.name);
            let ok = if e.name.ends_with("earth_specific_bias") {
                let (types, heads) = (e.shape[1], e.shape[2]);
                bias_shapes(types, heads).contains(&shape)
            } else if let Some(n) = per_position {
                shape == e.shape || shape == [n]
            } else {
                shape == e.shape
            };
            if !ok {
                let want = if e.name.ends_with("earth_specific_bias") {
                    let [a, b, c] = bias_shapes(e.shape[1], e.shape[2]);
                    format!("{a:?}, {b:?} or {c:?}")
                } else if let Some(n) = per_position {
                    format!("{:?} (per variable) or [{n}] (per patch position)", e.shape)
                } else {
                    format!("{:?}", e.shape)
                };
                return Err(Error::Shape {
                    what: format!("{file}: `{}`", e.name),
                    got: shape,
                    want,
                });
            }
            let dtype = match view.dtype() {
                safetensors::Dtype::F32 => DType::F32,
                safetensors::Dtype::F16 => DType::F16,
                safetensors::Dtype::BF16 => DType::BF16,
                d => {
                    return Err(Error::Dtype {
                        what: format!("{file}: `{}`", e.name),
                        got: format!("{d:?}"),
                        want: "F32, F16 or BF16".into(),
                    });
                }
            };
            let t = Tensor::from_raw_buffer(view.data(), dtype, &shape, &Device::Cpu)?
                .to_dtype(DType::F32)?;
            check_finite(&format!("{file}: `{}`", e.name), &t)?;
            tensors.insert(e.name.clone(), t);
        }
        if let Some((name, shape)) = unknown.into_iter().next() {
            return Err(Error::UnknownTensor { file, name, shape });
        }
        Ok(Weights {
            file,
            tensors,
            meta,
        })
    }

    /// The tensor `name` (present: [`Weights::read`] checked it).
    pub fn get(&self, name: &str) -> Result<&Tensor> {
        self.tensors.get(name).ok_or_else(|| Error::MissingTensor {
            file: self.file.clone(),
            name: name.into(),
            hint: String::new(),
        })
    }
}

/// Fails on the first NaN or Inf of the f32 tensor `t`, naming `what` and
/// the flat index.
pub fn check_finite(what: &str, t: &Tensor) -> Result<()> {
    let v = t.flatten_all()?.to_vec1::<f32>()?;
    match v.iter().position(|x| !x.is_finite()) {
        None => Ok(()),
        Some(i) => Err(Error::NonFinite {
            what: what.into(),
            value: v[i],
            at: format!("flat index {i} of {:?}", t.dims()),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn official_grid_parameter_count() {
        let g = Geometry::new(721, 1440).unwrap();
        assert_eq!((g.h1, g.w1, g.h2, g.w2), (181, 360, 91, 180));
        let e = entries(&g, Depths::RELEASED, RELEASED_WIDTH);
        let bias: Vec<&Entry> = e
            .iter()
            .filter(|e| e.name.ends_with("earth_specific_bias"))
            .collect();
        assert_eq!(bias.len(), 16);
        assert_eq!(bias[0].shape, vec![3312, 124, 6]);
        assert_eq!(bias[2].shape, vec![3312, 64, 12]);
        let params: usize = e
            .iter()
            .filter(|e| {
                !e.name.contains("constants")
                    && !e.name.contains("_mean")
                    && !e.name.contains("_std")
            })
            .map(|e| e.shape.iter().product::<usize>())
            .sum();
        // About 64 M parameters with the compact earth bias.
        assert!((60_000_000..70_000_000).contains(&params), "{params}");
    }
}
