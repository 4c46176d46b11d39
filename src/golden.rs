//! Golden mode: run one kernel on tensors read from `.npy` files and write
//! its outputs as `.npy`, so results can be compared with tensors dumped
//! from PyTorch (`numpy.save(path, t.cpu().numpy())`).
//!
//! ```text
//! wavefuse-suite check KERNEL --in NAME=PATH ... [--eps E] [--width W] --out-dir DIR [--backend B]
//! ```
//! Inputs are f16 (`<f2`) arrays; the last axis is the row width.
use npyz::WriterBuilder;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use wavefuse::{Affine, Choice, Device, f16, layer_norm};

pub struct Tensor {
    pub shape: Vec<u64>,
    pub data: Vec<f16>,
}

pub fn read_npy(path: &Path) -> Result<Tensor, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let npy = npyz::NpyFile::new(&bytes[..]).map_err(|e| format!("{}: {e}", path.display()))?;
    let shape = npy.shape().to_vec();
    if npy.order() != npyz::Order::C {
        return Err(format!("{}: Fortran order not supported", path.display()));
    }
    let data = npy
        .into_vec::<f16>()
        .map_err(|e| format!("{}: expected a float16 array: {e}", path.display()))?;
    Ok(Tensor { shape, data })
}

pub fn write_npy(path: &Path, t: &Tensor) -> Result<(), String> {
    let mut buf = Vec::new();
    let mut w = npyz::WriteOptions::<f16>::new()
        .default_dtype()
        .shape(&t.shape)
        .writer(&mut buf)
        .begin_nd()
        .map_err(|e| e.to_string())?;
    w.extend(t.data.iter().copied())
        .map_err(|e| e.to_string())?;
    w.finish().map_err(|e| e.to_string())?;
    std::fs::write(path, buf).map_err(|e| format!("{}: {e}", path.display()))
}

pub fn run(mut args: impl Iterator<Item = String>) -> Result<(), String> {
    let kernel = args.next().ok_or("check needs a kernel name")?;
    let mut inputs: HashMap<String, PathBuf> = HashMap::new();
    let (mut eps, mut out_dir, mut backend) = (1e-5f32, PathBuf::from("."), Choice::Auto);
    while let Some(a) = args.next() {
        let mut val = || args.next().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "--in" => {
                let v = val()?;
                let (k, p) = v.split_once('=').ok_or("--in takes NAME=PATH")?;
                inputs.insert(k.to_string(), p.into());
            }
            "--eps" => eps = val()?.parse().map_err(|e| format!("--eps: {e}"))?,
            "--out-dir" => out_dir = val()?.into(),
            "--backend" => {
                let v = val()?;
                backend = Choice::parse(&v).ok_or(format!("unknown backend {v}"))?;
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    let dev = Device::open(backend).map_err(|e| e.to_string())?;
    let load = |name: &str| -> Result<Tensor, String> {
        read_npy(
            inputs
                .get(name)
                .ok_or(format!("{kernel} needs --in {name}=PATH"))?,
        )
    };
    std::fs::create_dir_all(&out_dir).map_err(|e| e.to_string())?;
    let e = |e: wavefuse::Error| e.to_string();
    match kernel.as_str() {
        "layer_norm" => {
            let x = load("x")?;
            let width = *x.shape.last().ok_or("x must have at least one axis")? as usize;
            let xd = dev.upload(&x.data).map_err(e)?;
            let mut y = dev.alloc::<f16>(x.data.len()).map_err(e)?;
            if inputs.contains_key("gamma") {
                let (g, b) = (load("gamma")?, load("beta")?);
                let (gd, bd) = (
                    dev.upload(&g.data).map_err(e)?,
                    dev.upload(&b.data).map_err(e)?,
                );
                let (gv, bv) = (gd.view(), bd.view());
                layer_norm(
                    &dev,
                    &xd.view(),
                    &mut y.view_mut(),
                    width,
                    Some(Affine {
                        gamma: &gv,
                        beta: &bv,
                    }),
                    eps,
                )
                .map_err(e)?;
            } else {
                layer_norm(&dev, &xd.view(), &mut y.view_mut(), width, None, eps).map_err(e)?;
            }
            let data = y.download().map_err(e)?;
            write_npy(
                &out_dir.join("y.npy"),
                &Tensor {
                    shape: x.shape,
                    data,
                },
            )?;
        }
        other => return Err(format!("check: unknown kernel {other}")),
    }
    eprintln!(
        "check {kernel} on {}: outputs in {}",
        dev.info().name,
        out_dir.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn npy_round_trip_keeps_shape_and_bits() {
        let t = Tensor {
            shape: vec![2, 3],
            data: [1.5, -0.0, 65504.0, f32::NAN, 1e-7, -3.25]
                .map(f16::from_f32)
                .to_vec(),
        };
        let p = std::env::temp_dir().join(format!("wavefuse-npy-{}.npy", std::process::id()));
        write_npy(&p, &t).expect("write");
        let r = read_npy(&p).expect("read");
        let _ = std::fs::remove_file(&p);
        assert_eq!(r.shape, t.shape);
        assert!(
            r.data
                .iter()
                .zip(&t.data)
                .all(|(a, b)| a.to_bits() == b.to_bits())
        );
    }
}
