//! Bias + exact GELU at the MLP widths (ratio 4).
use super::{Case, Checked, Instance, Rng, par_rows, ulp_err};
use wavefuse::{Device, DeviceBuffer, GeluBias, GeluMode, Stream, bias_gelu, f16};
use wavefuse_suite::oracle;

pub struct BiasGelu {
    pub rows: usize,
    pub cols: usize,
}

struct BiasGeluSet {
    cols: usize,
    x_host: Vec<f16>,
    b_host: Vec<f16>,
    x: DeviceBuffer<f16>,
    b: DeviceBuffer<f16>,
    y: DeviceBuffer<f16>,
}

impl Case for BiasGelu {
    fn name(&self) -> String {
        "bias_gelu".into()
    }
    fn shape(&self) -> String {
        format!("[{},{}]", self.rows, self.cols)
    }
    fn bytes(&self) -> usize {
        4 * self.rows * self.cols + 2 * self.cols
    }
    fn setup(&self, dev: &Device, seed: u64) -> wavefuse::Result<Box<dyn Instance>> {
        let mut rng = Rng(seed);
        let x_host = rng.uniform_halves(self.rows * self.cols, 3.0, 0.0);
        let b_host = rng.uniform_halves(self.cols, 0.5, 0.0);
        Ok(Box::new(BiasGeluSet {
            cols: self.cols,
            x: dev.upload(&x_host)?,
            b: dev.upload(&b_host)?,
            y: dev.upload(&vec![f16::NAN; x_host.len()])?,
            x_host,
            b_host,
        }))
    }
}

impl Instance for BiasGeluSet {
    fn launch(&mut self, dev: &Stream) -> wavefuse::Result<()> {
        let b = self.b.view();
        bias_gelu(
            dev,
            &self.x.view(),
            GeluBias::F16(&b),
            &mut self.y.view_mut(),
            self.cols,
            GeluMode::Erf,
        )
    }
    fn check(&mut self, _dev: &Device) -> Result<Checked, String> {
        let y = self.y.download().map_err(|e| e.to_string())?;
        let c = self.cols;
        let worst = par_rows(self.x_host.len() / c, |r| {
            let mut worst = 0.0f64;
            for i in 0..c {
                // torch: x + b is an f16 op (rounded), gelu in f32 from it.
                let s = oracle::add_round(self.x_host[r * c + i], self.b_host[i]).to_f64();
                let (got, want) = (y[r * c + i], oracle::gelu_erf(s));
                let e = ulp_err(got, want);
                if e > 1.0 {
                    return Err(format!(
                        "row {r} col {i}: gelu({s}) got {got} want {want} ({e:.2} ulp)"
                    ));
                }
                worst = worst.max(e);
            }
            Ok(worst)
        })?;
        Ok(Checked {
            max_err_ulp: worst,
            outputs: y.len(),
        })
    }
}
