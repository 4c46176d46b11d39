//! Input and output fields in the official npy layout: upper air
//! `[5, 13, H, W]`, surface `[4, H, W]`, f32, C order.
use crate::config::{LEVELS, SURFACE_VARS, UPPER_VARS};
use crate::error::{Error, Result};
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
    write_values(path, &f.shape, &f.data)
}

/// The npy (format 1.0) header of a C-order little-endian f32 array of
/// `shape`: magic, version, length, and the dict numpy writes, padded with
/// spaces to a multiple of 64 bytes and ended by a newline.
fn npy_header(shape: &[usize]) -> Vec<u8> {
    let dims = match shape {
        [d] => format!("({d},)"),
        _ => {
            let d: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
            format!("({})", d.join(", "))
        }
    };
    let mut dict = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {dims}, }}");
    // 10 bytes of preamble, the dict, the padding and '\n': a multiple of 64.
    let pad = (64 - (10 + dict.len() + 1) % 64) % 64;
    dict.extend(std::iter::repeat_n(' ', pad));
    dict.push('\n');
    let mut out = Vec::with_capacity(10 + dict.len());
    out.extend_from_slice(b"\x93NUMPY\x01\x00");
    // A shape has at most a few dimensions: the dict is far below 64 KiB.
    let len = u16::try_from(dict.len()).unwrap_or(u16::MAX);
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(dict.as_bytes());
    out
}

/// `data` as little-endian bytes: the values' own memory on a
/// little-endian machine (a 287 MB step is written at the file system's
/// speed, not at a loop's), a per-value conversion elsewhere.
fn write_f32_le(f: &mut impl std::io::Write, data: &[f32]) -> std::io::Result<()> {
    #[cfg(target_endian = "little")]
    {
        // SAFETY: f32 has no padding and any byte is a valid u8; the
        // slice covers exactly `data`'s memory, which outlives it; on a
        // little-endian machine these are the values' little-endian bytes.
        let bytes = unsafe {
            std::slice::from_raw_parts(data.as_ptr().cast::<u8>(), std::mem::size_of_val(data))
        };
        f.write_all(bytes)
    }
    #[cfg(not(target_endian = "little"))]
    {
        let mut bytes = Vec::with_capacity(4 << 16);
        for chunk in data.chunks(1 << 16) {
            bytes.clear();
            for v in chunk {
                bytes.extend_from_slice(&v.to_le_bytes());
            }
            f.write_all(&bytes)?;
        }
        Ok(())
    }
}

/// Writes `data` of `shape` to `path` as f32 npy, streaming the values
/// from `data` (a step's outputs are written straight from the staging
/// buffer they were copied into, with no intermediate copy); the file
/// appears complete or not at all (written beside and renamed). An error,
/// and no file, when `data` does not hold exactly `shape`'s values.
pub fn write_values(path: &Path, shape: &[usize], data: &[f32]) -> Result<()> {
    use std::io::Write;
    let n = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
    if n != Some(data.len()) {
        return Err(Error::Format {
            file: path.display().to_string(),
            why: format!("{} values for shape {shape:?}", data.len()),
        });
    }
    let tmp = path.with_extension("npy.partial");
    let result = (|| -> std::io::Result<()> {
        let mut f = std::io::BufWriter::with_capacity(1 << 20, std::fs::File::create(&tmp)?);
        f.write_all(&npy_header(shape))?;
        write_f32_le(&mut f, data)?;
        f.flush()
    })();
    if let Err(e) = result {
        let _ = std::fs::remove_file(&tmp);
        return Err(Error::io(&tmp)(e));
    }
    std::fs::rename(&tmp, path).map_err(Error::io(path))
}

#[cfg(test)]
mod tests {
    use super::*;
    use npyz::WriterBuilder;

    /// npyz's own writer: the reference the direct writer must match byte
    /// for byte.
    fn npyz_bytes(shape: &[usize], data: &[f32]) -> Vec<u8> {
        let shape: Vec<u64> = shape.iter().map(|&d| d as u64).collect();
        let mut buf = Vec::new();
        let mut w = npyz::WriteOptions::<f32>::new()
            .default_dtype()
            .shape(&shape)
            .writer(&mut buf)
            .begin_nd()
            .unwrap();
        w.extend(data.iter().copied()).unwrap();
        w.finish().unwrap();
        buf
    }

    #[test]
    fn direct_writer_matches_npyz_and_reads_back() {
        let dir = std::env::temp_dir().join(format!("pangu-fields-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut seed = 0x9e37_79b9_u32;
        for shape in [
            vec![5, 13, 3, 96],
            vec![4, 3, 96],
            vec![4, 721, 1440],
            vec![7],
            vec![1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 3],
        ] {
            let n: usize = shape.iter().product();
            let data: Vec<f32> = (0..n)
                .map(|i| {
                    seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                    // Every bit pattern class: signs, subnormals, large values.
                    f32::from_bits(seed) * if i % 3 == 0 { 1.0 } else { 1e-30 }
                })
                .map(|v| if v.is_finite() { v } else { 1.5 })
                .collect();
            let p = dir.join("x.npy");
            write_values(&p, &shape, &data).unwrap();
            let got = std::fs::read(&p).unwrap();
            // The values' bytes are npyz's (its header differs from
            // numpy's only in a trailing comma inside the shape).
            let theirs = npyz_bytes(&shape, &data);
            let (h, t) = (npy_header(&shape).len(), theirs.len() - 4 * n);
            assert!(got[h..] == theirs[t..], "shape {shape:?}: values differ");
            assert_eq!(npy_header(&shape).len() % 64, 0, "{shape:?}");
            if let Some(kind) = [Kind::Upper, Kind::Surface]
                .into_iter()
                .find(|k| k.grid(&shape).is_some())
            {
                let back = read(&p, kind, "test").unwrap();
                assert_eq!(back.shape, shape);
                assert!(
                    back.data
                        .iter()
                        .zip(&data)
                        .all(|(a, b)| a.to_bits() == b.to_bits())
                );
            }
        }
        // numpy 2's `np.save` header for this shape, byte for byte.
        let mut numpy = b"\x93NUMPY\x01\x00v\x00".to_vec();
        numpy.extend_from_slice(
            b"{'descr': '<f4', 'fortran_order': False, 'shape': (5, 13, 3, 96), }",
        );
        numpy.extend_from_slice(&[b' '; 50]);
        numpy.push(b'\n');
        assert_eq!(npy_header(&[5, 13, 3, 96]), numpy);
        // A length that does not match the shape: an error and no file.
        let p = dir.join("bad.npy");
        assert!(write_values(&p, &[4, 3, 96], &[0.0; 10]).is_err());
        assert!(write_values(&p, &[usize::MAX, 2], &[0.0; 10]).is_err());
        assert!(!p.exists() && !p.with_extension("npy.partial").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
