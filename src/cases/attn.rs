//! Window-attention fusions at Pangu's shapes: 3720 windows x 6 heads
//! (grid 8x181x360, padded 8x186x360) and 960 windows x 12 heads (8x91x180,
//! padded 8x96x180); window (2,6,12) = 144 tokens, head dim 32.
use super::{Case, Checked, Instance, Rng, par_rows, par_update, ulp_err};
use wavefuse::{
    AttnBias, AttnMask, Device, DeviceBuffer, QkvSplit as Params, RegionLabels, RegionMask, Stream,
    WindowAttention as AttnParams, WindowBias, WindowTable, bias_mask_add, bias_mask_softmax, f16,
    qkv_split, window_attention,
};
use wavefuse_shared::window::{Grid3, Shift3, Window3, WindowPlan};
use wavefuse_suite::oracle;

const T: usize = 144;
const HD: usize = 32;

/// The shifted window plan whose windows the attention shapes come from:
/// the window -> earth-bias type and window -> mask slot tables are the
/// planner's (consecutive longitude windows share a type, as in the model).
/// Small (emulator) shapes use a small grid.
fn plan(windows: usize) -> Result<WindowPlan, String> {
    let grid = match windows {
        3720 => Grid3 {
            z: 8,
            h: 181,
            w: 360,
        },
        960 => Grid3 {
            z: 8,
            h: 91,
            w: 180,
        },
        _ => Grid3 {
            z: 4,
            h: 12,
            w: 24 * windows.div_ceil(8),
        },
    };
    let p = WindowPlan::new(
        grid,
        Window3 { z: 2, h: 6, w: 12 },
        Shift3 { z: 1, h: 3, w: 6 },
    )
    .map_err(|e| format!("{e:?}"))?;
    if p.n_windows() < windows {
        return Err(format!(
            "plan has {} windows, need {windows}",
            p.n_windows()
        ));
    }
    Ok(p)
}

fn types(windows: usize) -> usize {
    plan(windows).map(|p| p.n_window_types()).unwrap_or(0)
}

fn slots(windows: usize) -> usize {
    plan(windows).map(|p| p.mask_slots().n_slots).unwrap_or(0)
}

pub struct QkvSplit {
    pub windows: usize,
    pub heads: usize,
}

struct QkvSet {
    p: Params,
    x_host: Vec<f16>,
    x: DeviceBuffer<f16>,
    q: DeviceBuffer<f16>,
    k: DeviceBuffer<f16>,
    v: DeviceBuffer<f16>,
}

impl Case for QkvSplit {
    fn name(&self) -> String {
        "qkv_split".into()
    }
    fn shape(&self) -> String {
        format!("{}x{}", self.windows, self.heads)
    }
    fn bytes(&self) -> usize {
        2 * 2 * self.windows * T * 3 * self.heads * HD
    }
    fn setup(&self, dev: &Device, seed: u64) -> wavefuse::Result<Box<dyn Instance>> {
        let n = self.windows * T * 3 * self.heads * HD;
        let x_host = Rng(seed).uniform_halves(n, 4.0, 0.0);
        let out = n / 3;
        Ok(Box::new(QkvSet {
            p: Params::new(self.heads),
            x: dev.upload(&x_host)?,
            q: dev.upload(&vec![f16::NAN; out])?,
            k: dev.upload(&vec![f16::NAN; out])?,
            v: dev.upload(&vec![f16::NAN; out])?,
            x_host,
        }))
    }
}

impl Instance for QkvSet {
    fn launch(&mut self, dev: &Stream) -> wavefuse::Result<()> {
        let (mut q, mut k, mut v) = (self.q.view_mut(), self.k.view_mut(), self.v.view_mut());
        qkv_split(dev, &self.x.view(), None, &mut q, &mut k, &mut v, &self.p)
    }
    fn check(&mut self, _dev: &Device) -> Result<Checked, String> {
        let e = |e: wavefuse::Error| e.to_string();
        let (q, k, v) = (
            self.q.download().map_err(e)?,
            self.k.download().map_err(e)?,
            self.v.download().map_err(e)?,
        );
        let h = self.p.heads;
        let c = h * HD;
        let tokens = self.x_host.len() / (3 * c);
        let worst = par_rows(tokens, |tok| {
            let (w, t) = (tok / T, tok % T);
            let mut worst = 0.0f64;
            for head in 0..h {
                for d in 0..HD {
                    let o = ((w * h + head) * T + t) * HD + d;
                    let src = |part: usize| self.x_host[tok * 3 * c + part * c + head * HD + d];
                    if k[o].to_bits() != src(1).to_bits() || v[o].to_bits() != src(2).to_bits() {
                        return Err(format!(
                            "token {tok} head {head} dim {d}: k/v not a bit copy"
                        ));
                    }
                    let want = src(0).to_f64() * self.p.scale as f64;
                    let err = ulp_err(q[o], want);
                    if err > 0.5 + 1e-9 {
                        return Err(format!(
                            "token {tok} head {head} dim {d}: q {} want {want}",
                            q[o]
                        ));
                    }
                    worst = worst.max(err);
                }
            }
            Ok(worst)
        })?;
        Ok(Checked {
            max_err_ulp: worst,
            outputs: q.len() + k.len() + v.len(),
        })
    }
}

pub struct BiasMask {
    pub windows: usize,
    pub heads: usize,
    pub softmax: bool,
}

struct BiasMaskSet {
    heads: usize,
    softmax: bool,
    s_host: Vec<f16>,
    bias_host: Vec<f16>,
    mask_host: Vec<f16>,
    ty_host: Vec<i32>,
    slot_host: Vec<i32>,
    s: DeviceBuffer<f16>,
    out: DeviceBuffer<f16>,
    bias: DeviceBuffer<f16>,
    mask: DeviceBuffer<f16>,
    ty: WindowTable,
    slot: WindowTable,
    /// Launches since setup (or the last reset): bias_mask_add updates `s`.
    launches: usize,
}

impl Case for BiasMask {
    fn name(&self) -> String {
        if self.softmax {
            "bias_mask_softmax".into()
        } else {
            "bias_mask_add".into()
        }
    }
    fn shape(&self) -> String {
        format!("{}x{}", self.windows, self.heads)
    }
    fn bytes(&self) -> usize {
        let tile = T * T;
        4 * self.windows * self.heads * tile
            + 2 * types(self.windows) * self.heads * tile
            + 2 * slots(self.windows) * tile
    }
    fn setup(&self, dev: &Device, seed: u64) -> wavefuse::Result<Box<dyn Instance>> {
        let mut rng = Rng(seed);
        let (w, h, tile) = (self.windows, self.heads, T * T);
        let p = plan(w).map_err(|why| wavefuse::Error::BadParameter {
            op: "harness",
            what: "windows",
            value: format!("{w}: {why}"),
            why: "window plan failed",
        })?;
        let n_types = p.n_window_types();
        let ms = p.mask_slots();
        let s_host = rng.uniform_halves(w * h * tile, 4.0, 0.0);
        let bias_host = rng.uniform_halves(n_types * h * tile, 2.0, 0.0);
        let mask_host: Vec<f16> = ms.slot_masks.iter().map(|&v| f16::from_f32(v)).collect();
        let mut ty_host = p.window_type_table();
        ty_host.truncate(w);
        let mut slot_host = ms.window_to_slot;
        slot_host.truncate(w);
        Ok(Box::new(BiasMaskSet {
            heads: h,
            softmax: self.softmax,
            s: dev.upload(&s_host)?,
            out: dev.upload(&vec![f16::NAN; s_host.len()])?,
            bias: dev.upload(&bias_host)?,
            mask: dev.upload(&mask_host)?,
            ty: WindowTable::new(dev, &ty_host, n_types)?,
            slot: WindowTable::new(dev, &slot_host, ms.n_slots)?,
            s_host,
            bias_host,
            mask_host,
            ty_host,
            slot_host,
            launches: 0,
        }))
    }
}

impl BiasMaskSet {
    /// (bias, mask) of score element `i`.
    fn terms(&self, i: usize) -> (f16, f16) {
        let (h, tile) = (self.heads, T * T);
        let row = i / T;
        let (w, head, r, j) = (row / (h * T), (row / T) % h, row % T, i % T);
        let (ty, slot) = (self.ty_host[w] as usize, self.slot_host[w] as usize);
        (
            self.bias_host[(ty * h + head) * tile + r * T + j],
            self.mask_host[slot * tile + r * T + j],
        )
    }
}

impl Instance for BiasMaskSet {
    fn launch(&mut self, dev: &Stream) -> wavefuse::Result<()> {
        self.launches += 1;
        let (bias, mask) = (self.bias.view(), self.mask.view());
        let ab = AttnBias {
            bias: &bias,
            ty: &self.ty,
            mask: Some(AttnMask {
                mask: &mask,
                slot: &self.slot,
            }),
        };
        if self.softmax {
            bias_mask_softmax(
                dev,
                &self.s.view(),
                &mut self.out.view_mut(),
                self.heads,
                T,
                &ab,
            )
        } else {
            bias_mask_add(dev, &mut self.s.view_mut(), self.heads, T, &ab)
        }
    }
    fn check(&mut self, _dev: &Device) -> Result<Checked, String> {
        let e = |e: wavefuse::Error| e.to_string();
        // The scores the last launch read: bias_mask_add updates them in
        // place, each launch by the contract's `f16((f32(S) + f32(mask)) +
        // f32(bias))` (IEEE f32, the same bits on every backend), replayed
        // here for the launches before the last.
        let mut s_in = self.s_host.clone();
        if !self.softmax {
            let k = self.launches.saturating_sub(1);
            par_update(&mut s_in, |i, v| {
                let (b, m) = self.terms(i);
                for _ in 0..k {
                    *v = f16::from_f32((v.to_f32() + m.to_f32()) + b.to_f32());
                }
            });
        }
        let got = if self.softmax {
            self.out.download()
        } else {
            self.s.download()
        }
        .map_err(e)?;
        let worst = par_rows(self.s_host.len() / T, |row| {
            let sum: Vec<f64> = (row * T..(row + 1) * T)
                .map(|i| {
                    let (b, m) = self.terms(i);
                    s_in[i].to_f64() + b.to_f64() + m.to_f64()
                })
                .collect();
            let want = if self.softmax {
                oracle::softmax_row(&sum)
            } else {
                sum
            };
            let mut worst = 0.0f64;
            for (j, wv) in want.iter().enumerate() {
                let g = got[row * T + j];
                let err = ulp_err(g, *wv);
                if err > 1.0 {
                    return Err(format!(
                        "row {row} col {j}: got {g} want {wv} ({err:.2} ulp)"
                    ));
                }
                worst = worst.max(err);
            }
            Ok(worst)
        })?;
        Ok(Checked {
            max_err_ulp: worst,
            outputs: got.len(),
        })
    }

    fn reset(&mut self, _dev: &Device) -> wavefuse::Result<()> {
        if !self.softmax {
            self.s.copy_from_host(&self.s_host)?;
        }
        self.launches = 0;
        Ok(())
    }
}

/// The fused window attention from the QKV Linear output (shifted-window
/// block: earth bias and mask from the planner's tables).
pub struct WindowAttention {
    pub windows: usize,
    pub heads: usize,
}

struct AttnSet {
    p: AttnParams,
    qkv_host: Vec<f16>,
    bias_host: Vec<f16>,
    mask_host: Vec<f16>,
    ty_host: Vec<i32>,
    slot_host: Vec<i32>,
    qkv: DeviceBuffer<f16>,
    out: DeviceBuffer<f16>,
    bias: DeviceBuffer<f16>,
    labels: RegionLabels,
    ty: WindowTable,
    slot: WindowTable,
}

impl Case for WindowAttention {
    fn name(&self) -> String {
        "window_attention".into()
    }
    fn shape(&self) -> String {
        format!("{}x{}", self.windows, self.heads)
    }
    fn bytes(&self) -> usize {
        // q, k, v read and the output written once, the bias tables and
        // the mask's region labels (i32) read once (benches/peers.py counts
        // the same).
        8 * self.windows * T * self.heads * HD
            + 2 * types(self.windows) * self.heads * T * T
            + 4 * slots(self.windows) * T
    }
    fn setup(&self, dev: &Device, seed: u64) -> wavefuse::Result<Box<dyn Instance>> {
        let mut rng = Rng(seed);
        let (w, h) = (self.windows, self.heads);
        let p = plan(w).map_err(|why| wavefuse::Error::BadParameter {
            op: "harness",
            what: "windows",
            value: format!("{w}: {why}"),
            why: "window plan failed",
        })?;
        let n_types = p.n_window_types();
        let ms = p.mask_slots();
        let qkv_host = rng.halves(w * T * 3 * h * HD, 1.7, 0.0);
        let bias_host = rng.halves(n_types * h * T * T, 1.0, 0.0);
        let mask_host: Vec<f16> = ms.slot_masks.iter().map(|&v| f16::from_f32(v)).collect();
        let mut ty_host = p.window_type_table();
        ty_host.truncate(w);
        let mut slot_host = ms.window_to_slot;
        slot_host.truncate(w);
        Ok(Box::new(AttnSet {
            p: AttnParams::new(h),
            qkv: dev.upload(&qkv_host)?,
            out: dev.upload(&vec![f16::NAN; w * T * h * HD])?,
            bias: dev.upload(&bias_host)?,
            // The kernel reads the planner's labels; the check reads the
            // planner's mask tiles.
            labels: RegionLabels::new(dev, &ms.slot_labels, T)?,
            ty: WindowTable::new(dev, &ty_host, n_types)?,
            slot: WindowTable::new(dev, &slot_host, ms.n_slots)?,
            qkv_host,
            bias_host,
            mask_host,
            ty_host,
            slot_host,
        }))
    }
}

impl Instance for AttnSet {
    fn launch(&mut self, dev: &Stream) -> wavefuse::Result<()> {
        let bias = self.bias.view();
        let ab = WindowBias {
            bias: &bias,
            ty: &self.ty,
            mask: Some(RegionMask {
                labels: &self.labels,
                slot: &self.slot,
            }),
        };
        window_attention(
            dev,
            &self.qkv.view(),
            None,
            &ab,
            &mut self.out.view_mut(),
            &self.p,
        )
    }
    /// Every query row of every window and head against
    /// `oracle::attention_row`; the error in units of the contract's bound
    /// (<= 1 passes).
    fn check(&mut self, _dev: &Device) -> Result<Checked, String> {
        let got = self.out.download().map_err(|e| e.to_string())?;
        let h = self.p.heads;
        let ch = h * HD;
        let windows = got.len() / (ch * T);
        let worst = par_rows(windows * h, |tile| {
            let (w, head) = (tile / h, tile % h);
            let part = |p: usize| -> Vec<Vec<f64>> {
                (0..T)
                    .map(|t| {
                        (0..HD)
                            .map(|d| {
                                self.qkv_host[(w * T + t) * 3 * ch + p * ch + head * HD + d]
                                    .to_f64()
                            })
                            .collect()
                    })
                    .collect()
            };
            let (q, k, v): (Vec<Vec<f64>>, _, _) = (part(0), part(1), part(2));
            let (ty, slot) = (self.ty_host[w] as usize, self.slot_host[w] as usize);
            let mut worst = 0.0f64;
            for (i, qi) in q.iter().enumerate() {
                let tok = w * T + i;
                let bias: Vec<f64> = (0..T)
                    .map(|j| self.bias_host[((ty * h + head) * T + i) * T + j].to_f64())
                    .collect();
                let mask: Vec<f64> = (0..T)
                    .map(|j| self.mask_host[(slot * T + i) * T + j].to_f64())
                    .collect();
                let want = oracle::attention_row(qi, &k, &v, self.p.scale as f64, &mask, &bias)
                    .ok_or_else(|| format!("token {tok} head {head}: the oracle's row is NaN"))?;
                for d in 0..HD {
                    let g = got[tok * ch + head * HD + d];
                    let err = (g.to_f64() - want.out[d]).abs() / want.tol[d];
                    if err.is_nan() || err > 1.0 {
                        return Err(format!(
                            "token {tok} head {head} ch {d}: got {g} want {:e} ({err:.2} of the bound)",
                            want.out[d]
                        ));
                    }
                    worst = worst.max(err);
                }
            }
            Ok(worst)
        })?;
        Ok(Checked {
            max_err_ulp: worst,
            outputs: got.len(),
        })
    }
}
