//! LayerNorm and residual-add + LayerNorm cases.
use super::{Case, Checked, Instance, Rng, par_rows};
use wavefuse::{Affine, Device, DeviceBuffer, Stream, add_layer_norm_to, f16, layer_norm};
use wavefuse_suite::check::check_ln_row;
use wavefuse_suite::oracle;

pub struct LayerNorm {
    pub rows: usize,
    pub width: usize,
    pub affine: bool,
}

struct LayerNormSet {
    width: usize,
    x_host: Vec<f16>,
    gb_host: Option<(Vec<f16>, Vec<f16>)>,
    x: DeviceBuffer<f16>,
    y: DeviceBuffer<f16>,
    gb: Option<(DeviceBuffer<f16>, DeviceBuffer<f16>)>,
}

impl Case for LayerNorm {
    fn name(&self) -> String {
        if self.affine {
            "layer_norm_affine".into()
        } else {
            "layer_norm".into()
        }
    }
    fn shape(&self) -> String {
        format!("[{},{}]", self.rows, self.width)
    }
    fn bytes(&self) -> usize {
        2 * 2 * self.rows * self.width + if self.affine { 2 * 2 * self.width } else { 0 }
    }
    fn setup(&self, dev: &Device, seed: u64) -> wavefuse::Result<Box<dyn Instance>> {
        let mut rng = Rng(seed);
        let x_host = rng.uniform_halves(self.rows * self.width, 2.0, 0.25);
        let gb_host = self.affine.then(|| affine_params(&mut rng, self.width));
        let gb = upload_affine(dev, &gb_host)?;
        Ok(Box::new(LayerNormSet {
            width: self.width,
            x: dev.upload(&x_host)?,
            y: dev.upload(&vec![f16::NAN; x_host.len()])?,
            x_host,
            gb_host,
            gb,
        }))
    }
}

impl Instance for LayerNormSet {
    fn launch(&mut self, dev: &Stream) -> wavefuse::Result<()> {
        let x = self.x.view();
        let mut y = self.y.view_mut();
        match &self.gb {
            Some((g, b)) => {
                let (gv, bv) = (g.view(), b.view());
                layer_norm(
                    dev,
                    &x,
                    &mut y,
                    self.width,
                    Some(Affine {
                        gamma: &gv,
                        beta: &bv,
                    }),
                    1e-5,
                )
            }
            None => layer_norm(dev, &x, &mut y, self.width, None, 1e-5),
        }
    }
    fn check(&mut self, _dev: &Device) -> Result<Checked, String> {
        let y = self.y.download().map_err(|e| e.to_string())?;
        let w = self.width;
        let (g, b) = affine_slices(&self.gb_host);
        let worst = par_rows(self.x_host.len() / w, |r| {
            let s = r * w..(r + 1) * w;
            check_ln_row(&y[s.clone()], &self.x_host[s], g, b, 1e-5)
                .map_err(|e| format!("row {r}: {e}"))
        })?;
        Ok(Checked {
            max_err_ulp: worst,
            outputs: y.len(),
        })
    }
}

/// `residual_out = f16(residual + branch)`, `y = LN(residual_out)` (the
/// out-of-place form, so every timed launch sees the same inputs).
pub struct AddLayerNorm {
    pub rows: usize,
    pub width: usize,
    pub affine: bool,
}

struct AddLayerNormSet {
    width: usize,
    r_host: Vec<f16>,
    b_host: Vec<f16>,
    gb_host: Option<(Vec<f16>, Vec<f16>)>,
    r: DeviceBuffer<f16>,
    b: DeviceBuffer<f16>,
    r_out: DeviceBuffer<f16>,
    y: DeviceBuffer<f16>,
    gb: Option<(DeviceBuffer<f16>, DeviceBuffer<f16>)>,
}

impl Case for AddLayerNorm {
    fn name(&self) -> String {
        if self.affine {
            "add_layer_norm_affine".into()
        } else {
            "add_layer_norm".into()
        }
    }
    fn shape(&self) -> String {
        format!("[{},{}]", self.rows, self.width)
    }
    fn bytes(&self) -> usize {
        4 * 2 * self.rows * self.width + if self.affine { 2 * 2 * self.width } else { 0 }
    }
    fn setup(&self, dev: &Device, seed: u64) -> wavefuse::Result<Box<dyn Instance>> {
        let mut rng = Rng(seed);
        let n = self.rows * self.width;
        let r_host = rng.uniform_halves(n, 4.0, 0.5);
        let b_host = rng.uniform_halves(n, 1.0, 0.0);
        let gb_host = self.affine.then(|| affine_params(&mut rng, self.width));
        Ok(Box::new(AddLayerNormSet {
            width: self.width,
            r: dev.upload(&r_host)?,
            b: dev.upload(&b_host)?,
            r_out: dev.upload(&vec![f16::NAN; n])?,
            y: dev.upload(&vec![f16::NAN; n])?,
            gb: upload_affine(dev, &gb_host)?,
            r_host,
            b_host,
            gb_host,
        }))
    }
}

impl Instance for AddLayerNormSet {
    fn launch(&mut self, dev: &Stream) -> wavefuse::Result<()> {
        let views = self.gb.as_ref().map(|(g, b)| (g.view(), b.view()));
        add_layer_norm_to(
            dev,
            &self.r.view(),
            &self.b.view(),
            &mut self.r_out.view_mut(),
            &mut self.y.view_mut(),
            self.width,
            views.as_ref().map(|(gamma, beta)| Affine { gamma, beta }),
            1e-5,
        )
    }
    fn check(&mut self, _dev: &Device) -> Result<Checked, String> {
        let e = |e: wavefuse::Error| e.to_string();
        let (ro, y) = (
            self.r_out.download().map_err(e)?,
            self.y.download().map_err(e)?,
        );
        let w = self.width;
        let worst = par_rows(self.r_host.len() / w, |r| {
            let sum: Vec<f16> = (r * w..(r + 1) * w)
                .map(|i| oracle::add_round(self.r_host[i], self.b_host[i]))
                .collect();
            if sum
                .iter()
                .zip(&ro[r * w..(r + 1) * w])
                .any(|(a, b)| a.to_bits() != b.to_bits())
            {
                return Err(format!(
                    "row {r}: residual_out is not the bit-exact f16 sum"
                ));
            }
            let (g, b) = affine_slices(&self.gb_host);
            check_ln_row(&y[r * w..(r + 1) * w], &sum, g, b, 1e-5)
                .map_err(|e| format!("row {r}: {e}"))
        })?;
        Ok(Checked {
            max_err_ulp: worst,
            outputs: ro.len() + y.len(),
        })
    }
}

/// Gamma around 1 and beta around 0, each spread by 0.5: many outputs
/// where `o gamma + beta` cancels, which the affine refinement redoes.
pub fn affine_params(rng: &mut Rng, width: usize) -> (Vec<f16>, Vec<f16>) {
    (
        rng.uniform_halves(width, 0.5, 1.0),
        rng.uniform_halves(width, 0.5, 0.0),
    )
}

/// The device copies of [`affine_params`]' vectors, when there are any.
pub fn upload_affine(
    dev: &Device,
    gb: &Option<(Vec<f16>, Vec<f16>)>,
) -> wavefuse::Result<Option<(DeviceBuffer<f16>, DeviceBuffer<f16>)>> {
    Ok(match gb {
        Some((g, b)) => Some((dev.upload(g)?, dev.upload(b)?)),
        None => None,
    })
}

/// Gamma and beta as the row check takes them.
pub fn affine_slices(gb: &Option<(Vec<f16>, Vec<f16>)>) -> (Option<&[f16]>, Option<&[f16]>) {
    match gb {
        Some((g, b)) => (Some(g.as_slice()), Some(b.as_slice())),
        None => (None, None),
    }
}
