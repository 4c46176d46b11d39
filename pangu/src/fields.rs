//! Input and output fields in the official npy layout: upper air
//! `[5, 13, H, W]`, surface `[4, H, W]`, f32, C order.
use crate::config::{LEVELS, SURFACE_VARS, UPPER_VARS};
use crate::error::{Error, Result};
use npyz::WriterBuilder;
use std::path::Path;

/// One field set on the host.
#[derive(Clone, Debug, PartialEq)]
pub struct Field {
    /// Shape, `[5, 13, H, W]` or `[4, H, W]`.
    pub shape: Vec<usize>,
    /// Values, row-major.
    pub data: Vec<f32>,
}

/// Which field set (for shapes and messages).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `[5, 13, H, W]`.
    Upper,
    /// `[4, H, W]`.
    Surface,
}

impl Kind {
    fn describe(self) -> &'static str {
        match self {
            Kind::Upper => "[5, 13, lat, lon] (Z, Q, T, U, V on 13 levels)",
            Kind::Surface => "[4, lat, lon] (MSLP, U10, V10, T2M)",
        }
    }

    /// The grid `(lat, lon)` of a shape of this kind, if it is one.
    pub fn grid(self, shape: &[usize]) -> Option<(usize, usize)> {
        match (self, shape) {
            (Kind::Upper, [5, 13, h, w]) | (Kind::Surface, [4, h, w]) => Some((*h, *w)),
            _ => None,
        }
    }

    /// Where flat index `i` lies, by variable, level and grid point.
    fn locate(self, shape: &[usize], i: usize) -> String {
        let (h, w) = self.grid(shape).unwrap_or((1, 1));
        let plane = (h * w).max(1);
        let (c, y, x) = (i / plane, i % plane / w.max(1), i % w.max(1));
        match self {
            Kind::Upper => {
                let var = UPPER_VARS.get(c / 13).copied().unwrap_or("?");
                let lvl = LEVELS.get(c % 13).copied().unwrap_or(0);
                format!("{var} {lvl} hPa, lat index {y}, lon index {x}")
            }
            Kind::Surface => {
                let var = SURFACE_VARS.get(c).copied().unwrap_or("?");
                format!("{var}, lat index {y}, lon index {x}")
            }
        }
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

/// Reads an f32 field set from `path` (the argument `what`) and checks,
/// before anything is computed, its shape, element type, byte order,
/// memory order, that the data is exactly as long as the shape says (no
/// truncation, no trailing bytes) and that every value is finite.
pub fn read(path: &Path, kind: Kind, what: &str) -> Result<Field> {
    let bytes = std::fs::read(path).map_err(Error::io(path))?;
    let declared = declared_shape(&bytes).ok_or_else(|| Error::Format {
        file: path.display().to_string(),
        why: format!("{what}: not an npy file (no readable header)"),
    })?;
    if declared
        .iter()
        .try_fold(1u64, |a, &d| a.checked_mul(d))
        .and_then(|n| n.checked_mul(4))
        .is_none()
    {
        return Err(Error::invalid(
            format!("{what} ({})", path.display()),
            format!("shape {declared:?} has more elements than memory can hold"),
        ));
    }
    let npy = npyz::NpyFile::new(&bytes[..]).map_err(|e| Error::Format {
        file: path.display().to_string(),
        why: format!("{what}: not an npy file: {e}"),
    })?;
    let shape: Vec<usize> = npy.shape().iter().map(|&d| d as usize).collect();
    let what = format!("{what} ({})", path.display());
    if kind.grid(&shape).is_none() {
        return Err(Error::Shape {
            what,
            got: shape,
            want: kind.describe().into(),
        });
    }
    let descr = npy.dtype().descr();
    let descr = descr.trim_matches('\'');
    match descr {
        "<f4" => {}
        ">f4" => {
            return Err(Error::Dtype {
                what,
                got: ">f4 (big-endian float32)".into(),
                want: "<f4 (little-endian float32; numpy: a.astype('<f4'))".into(),
            });
        }
        d => {
            return Err(Error::Dtype {
                what,
                got: d.to_string(),
                want: "<f4 (float32)".into(),
            });
        }
    }
    if npy.order() != npyz::Order::C {
        return Err(Error::invalid(
            what,
            "Fortran order; write it in C order (numpy: np.ascontiguousarray)",
        ));
    }
    let n = shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or_else(|| Error::invalid(&what, format!("shape {shape:?} overflows")))?;
    let data = npy.into_inner();
    let want = n * 4;
    if data.len() != want {
        let why = if data.len() < want {
            format!(
                "truncated: {} bytes of data, the shape {shape:?} needs {want}",
                data.len()
            )
        } else {
            format!(
                "{} trailing bytes after the {want} bytes of data the shape {shape:?} needs",
                data.len() - want
            )
        };
        return Err(Error::invalid(what, why));
    }
    let data = data
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    let f = Field { shape, data };
    check(&f, kind, &what)?;
    Ok(f)
}

/// Checks that every value of `f` is finite.
pub fn check<'a>(f: &'a Field, kind: Kind, what: &str) -> Result<&'a Field> {
    if let Some(i) = f.data.iter().position(|x| !x.is_finite()) {
        return Err(Error::NonFinite {
            what: what.into(),
            value: f.data[i],
            at: kind.locate(&f.shape, i),
        });
    }
    Ok(f)
}

/// Writes `f` to `path` as f32 npy; the file appears complete or not at
/// all (written beside and renamed).
pub fn write(path: &Path, f: &Field) -> Result<()> {
    let shape: Vec<u64> = f.shape.iter().map(|&d| d as u64).collect();
    let mut buf = Vec::with_capacity(f.data.len() * 4 + 128);
    let mut w = npyz::WriteOptions::<f32>::new()
        .default_dtype()
        .shape(&shape)
        .writer(&mut buf)
        .begin_nd()
        .map_err(Error::io(path))?;
    w.extend(f.data.iter().copied()).map_err(Error::io(path))?;
    w.finish().map_err(Error::io(path))?;
    let tmp = path.with_extension("npy.partial");
    std::fs::write(&tmp, &buf).map_err(Error::io(&tmp))?;
    std::fs::rename(&tmp, path).map_err(Error::io(path))
}
