//! Window partition (pad + roll + partition) as an index gather, plain and
//! fused with LayerNorm, on Pangu's grids with window (2,6,12), shift (1,3,6).
use super::norm::{affine_params, affine_slices, upload_affine};
use super::{Case, Checked, Instance, Rng, par_rows, par_update};
use wavefuse::{
    Affine, Device, DeviceBuffer, GatherPlan, Stream, add_layer_norm_gather, f16, gather,
    layer_norm_gather,
};
use wavefuse_shared::window::{Grid3, Shift3, Window3, WindowPlan};
use wavefuse_suite::check::check_ln_row;
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
    /// With gamma and beta (the LayerNorm of `Ln` and `AddLn`).
    pub affine: bool,
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
    gb_host: Option<(Vec<f16>, Vec<f16>)>,
    gb: Option<(DeviceBuffer<f16>, DeviceBuffer<f16>)>,
    plan: GatherPlan,
    src: DeviceBuffer<f16>,
    branch: DeviceBuffer<f16>,
    out: DeviceBuffer<f16>,
    /// Launches since setup (or the last reset): AddLn updates `src`.
    launches: usize,
}

impl Case for Gather {
    fn name(&self) -> String {
        let name = match self.fuse {
            Fuse::None => "gather",
            Fuse::Ln => "layer_norm_gather",
            Fuse::AddLn => "add_layer_norm_gather",
        };
        if self.affine {
            format!("{name}_affine")
        } else {
            name.into()
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
            + if self.affine {
                2 * 2 * self.channels
            } else {
                0
            }
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
        let src_host = rng.uniform_halves(n_in * self.channels, 2.0, 0.25);
        let branch_host = if self.fuse == Fuse::AddLn {
            rng.uniform_halves(src_host.len(), 1.0, 0.0)
        } else {
            Vec::new()
        };
        let gb_host = self.affine.then(|| affine_params(&mut rng, self.channels));
        Ok(Box::new(GatherSet {
            gb: upload_affine(dev, &gb_host)?,
            gb_host,
            c: self.channels,
            fuse: self.fuse,
            plan: GatherPlan::new(dev, &table, n_in)?,
            src: dev.upload(&src_host)?,
            branch: dev.upload(&branch_host)?,
            branch_host,
            out: dev.upload(&vec![f16::NAN; table.len() * self.channels])?,
            table,
            src_host,
            launches: 0,
        }))
    }
}

impl Instance for GatherSet {
    fn launch(&mut self, dev: &Stream) -> wavefuse::Result<()> {
        self.launches += 1;
        let mut out = self.out.view_mut();
        let views = self.gb.as_ref().map(|(g, b)| (g.view(), b.view()));
        let affine = views.as_ref().map(|(gamma, beta)| Affine { gamma, beta });
        match self.fuse {
            Fuse::None => gather(dev, &self.plan, &self.src.view(), &mut out, self.c),
            Fuse::Ln => layer_norm_gather(
                dev,
                &self.plan,
                &self.src.view(),
                &mut out,
                self.c,
                affine,
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
                    affine,
                    1e-5,
                )
            }
        }
    }
    fn check(&mut self, _dev: &Device) -> Result<Checked, String> {
        let e = |e: wavefuse::Error| e.to_string();
        let mut src_ref = self.src_host.clone();
        let mut outputs = 0;
        if self.fuse == Fuse::AddLn {
            // In place: every launch added the branch once, rounded to f16
            // (exact); the last launch normalised the result.
            let (k, br) = (self.launches, &self.branch_host);
            par_update(&mut src_ref, |i, r| {
                for _ in 0..k {
                    *r = oracle::add_round(*r, br[i]);
                }
            });
            let res = self.src.download().map_err(e)?;
            if let Some(i) = (0..res.len()).find(|&i| res[i].to_bits() != src_ref[i].to_bits()) {
                return Err(format!(
                    "residual[{i}] after {k} launches: {} is not the bit-exact f16 sum {}",
                    res[i], src_ref[i]
                ));
            }
            outputs += res.len();
        }
        let out = self.out.download().map_err(e)?;
        let c = self.c;
        let worst = par_rows(self.table.len(), |t| {
            let got = &out[t * c..(t + 1) * c];
            let idx = self.table[t];
            if idx < 0 {
                if got.iter().any(|v| v.to_bits() != 0) {
                    return Err(format!("token {t}: padding must be +0.0"));
                }
                return Ok(0.0);
            }
            let s = &src_ref[idx as usize * c..(idx as usize + 1) * c];
            if self.fuse == Fuse::None {
                if got.iter().zip(s).any(|(a, b)| a.to_bits() != b.to_bits()) {
                    return Err(format!("token {t}: not a copy of source {idx}"));
                }
                return Ok(0.0);
            }
            let (g, b) = affine_slices(&self.gb_host);
            check_ln_row(got, s, g, b, 1e-5).map_err(|e| format!("token {t}: {e}"))
        })?;
        Ok(Checked {
            max_err_ulp: worst,
            outputs: outputs + out.len(),
        })
    }

    fn reset(&mut self, _dev: &Device) -> wavefuse::Result<()> {
        if self.fuse == Fuse::AddLn {
            self.src.copy_from_host(&self.src_host)?;
        }
        self.launches = 0;
        Ok(())
    }
}
