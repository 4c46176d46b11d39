//! Window partition (pad + roll + partition) as an index gather, plain and
//! fused with LayerNorm, on Pangu's grids with window (2,6,12), shift (1,3,6).
use super::{Case, Instance, Rng, sampled_rows, ulp_err};
use wavefuse::{
    Device, DeviceBuffer, GatherPlan, add_layer_norm_gather, f16, gather, layer_norm_gather,
};
use wavefuse_shared::window::{Grid3, Shift3, Window3, WindowPlan};
use wavefuse_suite::oracle;

/// What runs on the gathered tokens.
#[derive(Clone, Copy, PartialEq)]
pub enum Fuse {
    /// Plain window partition.
    None,
    /// LayerNorm, then partition.
    Ln,
    /// Residual add (residual updated in place), LayerNorm, partition.
    AddLn,
}

pub struct Gather {
    pub grid: [usize; 3],
    pub channels: usize,
    pub fuse: Fuse,
}

fn plan(grid: [usize; 3]) -> Result<WindowPlan, String> {
    WindowPlan::new(
        Grid3 {
            z: grid[0],
            h: grid[1],
            w: grid[2],
        },
        Window3 { z: 2, h: 6, w: 12 },
        Shift3 { z: 1, h: 3, w: 6 },
    )
    .map_err(|e| format!("{e:?}"))
}

struct GatherSet {
    c: usize,
    fuse: Fuse,
    table: Vec<i32>,
    src_host: Vec<f16>,
    branch_host: Vec<f16>,
    plan: GatherPlan,
    src: DeviceBuffer<f16>,
    branch: DeviceBuffer<f16>,
    out: DeviceBuffer<f16>,
}

impl Case for Gather {
    fn name(&self) -> String {
        match self.fuse {
            Fuse::None => "gather".into(),
            Fuse::Ln => "layer_norm_gather".into(),
            Fuse::AddLn => "add_layer_norm_gather".into(),
        }
    }
    fn shape(&self) -> String {
        format!(
            "{}x{}x{}x{}",
            self.grid[0], self.grid[1], self.grid[2], self.channels
        )
    }
    fn bytes(&self) -> usize {
        let n_in: usize = self.grid.iter().product();
        let n_out = plan(self.grid).map(|p| p.n_tokens_out()).unwrap_or(0);
        // AddLn also reads the branch and writes the residual back.
        let extra = if self.fuse == Fuse::AddLn {
            2 * n_in
        } else {
            0
        };
        2 * self.channels * (n_in + n_out + extra)
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
        let branch_host = if self.fuse == Fuse::AddLn {
            rng.halves(src_host.len(), 1.0, 0.0)
        } else {
            Vec::new()
        };
        Ok(Box::new(GatherSet {
            c: self.channels,
            fuse: self.fuse,
            plan: GatherPlan::new(dev, &table, n_in)?,
            src: dev.upload(&src_host)?,
            branch: dev.upload(&branch_host)?,
            branch_host,
            out: dev.upload(&vec![f16::NAN; table.len() * self.channels])?,
            table,
            src_host,
        }))
    }
}

impl Instance for GatherSet {
    fn launch(&mut self, dev: &Device) -> wavefuse::Result<()> {
        let mut out = self.out.view_mut();
        match self.fuse {
            Fuse::None => gather(dev, &self.plan, &self.src.view(), &mut out, self.c),
            Fuse::Ln => layer_norm_gather(
                dev,
                &self.plan,
                &self.src.view(),
                &mut out,
                self.c,
                None,
                1e-5,
            ),
            Fuse::AddLn => {
                let b = self.branch.view();
                add_layer_norm_gather(
                    dev,
                    &self.plan,
                    &mut self.src.view_mut(),
                    &b,
                    &mut out,
                    self.c,
                    None,
                    1e-5,
                )
            }
        }
    }
    fn check(&mut self, dev: &Device) -> Result<f64, String> {
        let e = |e: wavefuse::Error| e.to_string();
        let mut src_ref = self.src_host.clone();
        if self.fuse == Fuse::AddLn {
            // In place: restore the residual, apply once, check both outputs.
            self.src.copy_from_host(&self.src_host).map_err(e)?;
            self.launch(dev).map_err(e)?;
            for (r, b) in src_ref.iter_mut().zip(&self.branch_host) {
                *r = oracle::add_round(*r, *b);
            }
            let res = self.src.download().map_err(e)?;
            if res
                .iter()
                .zip(&src_ref)
                .any(|(a, b)| a.to_bits() != b.to_bits())
            {
                return Err("residual is not the bit-exact f16 sum".into());
            }
        }
        let out = self.out.download().map_err(e)?;
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
            let s = &src_ref[idx as usize * c..(idx as usize + 1) * c];
            if self.fuse == Fuse::None {
                if got.iter().zip(s).any(|(a, b)| a.to_bits() != b.to_bits()) {
                    return Err(format!("token {t}: not a copy of source {idx}"));
                }
                continue;
            }
            let want = oracle::layer_norm_row(s, None, None, 1e-5);
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                let e = ulp_err(*g, *w);
                if e > 2.0 {
                    return Err(format!("token {t} col {i}: got {g} want {w} ({e:.2} ulp)"));
                }
                worst = worst.max(e);
            }
        }
        Ok(worst)
    }
}
