//! Window partition (pad + roll + partition) as an index gather, plain and
//! fused with LayerNorm, on Pangu's grids with window (2,6,12), shift (1,3,6).
use super::{Case, Instance, Rng, sampled_rows, ulp_err};
use wavefuse::{Device, DeviceBuffer, GatherPlan, f16, gather, layer_norm_gather};
use wavefuse_shared::window::{Grid3, Shift3, Window3, WindowPlan};
use wavefuse_suite::oracle;

pub struct Gather {
    pub grid: [usize; 3],
    pub channels: usize,
    pub ln: bool,
}

fn plan(grid: [usize; 3]) -> Result<WindowPlan, String> {
    WindowPlan::new(
        Grid3 { z: grid[0], h: grid[1], w: grid[2] },
        Window3 { z: 2, h: 6, w: 12 },
        Shift3 { z: 1, h: 3, w: 6 },
    )
    .map_err(|e| format!("{e:?}"))
}

struct GatherSet {
    c: usize,
    ln: bool,
    table: Vec<i32>,
    src_host: Vec<f16>,
    plan: GatherPlan,
    src: DeviceBuffer<f16>,
    out: DeviceBuffer<f16>,
}

impl Case for Gather {
    fn name(&self) -> String {
        if self.ln { "layer_norm_gather".into() } else { "gather".into() }
    }
    fn shape(&self) -> String {
        format!("{}x{}x{}x{}", self.grid[0], self.grid[1], self.grid[2], self.channels)
    }
    fn bytes(&self) -> usize {
        let n_in: usize = self.grid.iter().product();
        let n_out = plan(self.grid).map(|p| p.n_tokens_out()).unwrap_or(0);
        2 * self.channels * (n_in + n_out)
    }
    fn setup(&self, dev: &Device, seed: u64) -> wavefuse::Result<Box<dyn Instance>> {
        let p = plan(self.grid).map_err(|why| wavefuse::Error::BadParameter {
            op: "harness",
            what: "grid",
            value: format!("{:?}: {why}", self.grid),
            why: "window plan failed",
        })?;
        let n_in: usize = self.grid.iter().product();
        let table = p.partition_table();
        let mut rng = Rng(seed);
        let src_host = rng.halves(n_in * self.channels, 2.0, 0.25);
        Ok(Box::new(GatherSet {
            c: self.channels,
            ln: self.ln,
            plan: GatherPlan::new(dev, &table, n_in)?,
            src: dev.upload(&src_host)?,
            out: dev.upload(&vec![f16::NAN; table.len() * self.channels])?,
            table,
            src_host,
        }))
    }
}

impl Instance for GatherSet {
    fn launch(&mut self, dev: &Device) -> wavefuse::Result<()> {
        let (src, mut out) = (self.src.view(), self.out.view_mut());
        if self.ln {
            layer_norm_gather(dev, &self.plan, &src, &mut out, self.c, None, 1e-5)
        } else {
            gather(dev, &self.plan, &src, &mut out, self.c)
        }
    }
    fn check(&mut self, _dev: &Device) -> Result<f64, String> {
        let out = self.out.download().map_err(|e| e.to_string())?;
        let c = self.c;
        let mut worst = 0.0f64;
        for t in sampled_rows(self.table.len()) {
            let got = &out[t * c..(t + 1) * c];
            let idx = self.table[t];
            if idx < 0 {
                if got.iter().any(|v| v.to_bits() != 0) {
                    return Err(format!("token {t}: padding must be +0.0"));
                }
                continue;
            }
            let s = &self.src_host[idx as usize * c..(idx as usize + 1) * c];
            if !self.ln {
                if got.iter().zip(s).any(|(a, b)| a.to_bits() != b.to_bits()) {
                    return Err(format!("token {t}: not a copy of source {idx}"));
                }
                continue;
            }
            let want = oracle::layer_norm_row(s, None, None, 1e-5);
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                let e = ulp_err(*g, *w);
                if !(e <= 2.0) {
                    return Err(format!("token {t} col {i}: got {g} want {w} ({e:.2} ulp)"));
                }
                worst = worst.max(e);
            }
        }
        Ok(worst)
    }
}
