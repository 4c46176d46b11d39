//! Benchmark cases: one per kernel and shape. Each knows its byte count,
//! how to build one input set, launch on it and check what it wrote.
use wavefuse::{Affine, Device, DeviceBuffer, f16, layer_norm};
use wavefuse_suite::oracle;

/// A kernel at one shape.
pub trait Case {
    fn name(&self) -> String;
    fn shape(&self) -> String;
    /// Bytes the kernel must read plus bytes it must write.
    fn bytes(&self) -> usize;
    fn setup(&self, dev: &Device, seed: u64) -> wavefuse::Result<Box<dyn Instance>>;
}

/// One input set on the device.
pub trait Instance {
    fn launch(&mut self, dev: &Device) -> wavefuse::Result<()>;
    /// Max error in f16 ulps against the f64 oracle, or why it is wrong.
    fn check(&self) -> Result<f64, String>;
}

/// splitmix64 for input data.
pub struct Rng(pub u64);
impl Rng {
    pub fn next(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
    }
    pub fn halves(&mut self, n: usize, scale: f64, offset: f64) -> Vec<f16> {
        (0..n).map(|_| f16::from_f64(offset + scale * (2.0 * self.next() - 1.0))).collect()
    }
}

/// f16 ulps between `got` and `want`, ulp floored at the smallest normal.
pub fn ulp_err(got: f16, want: f64) -> f64 {
    let a = want.abs().max(f16::MIN_POSITIVE.to_f64());
    (got.to_f64() - want).abs() / 2f64.powf(a.log2().floor() - 10.0)
}

pub fn all(full: bool) -> Vec<Box<dyn Case>> {
    let mut v: Vec<Box<dyn Case>> = Vec::new();
    let ln: &[(usize, usize)] = if full {
        &[(131040, 192), (32760, 384), (521280, 192), (131040, 384)]
    } else {
        &[(4096, 192), (1024, 384)]
    };
    for &(rows, width) in ln {
        v.push(Box::new(LayerNorm { rows, width, affine: false }));
    }
    v.push(Box::new(LayerNorm { rows: ln[0].0, width: ln[0].1, affine: true }));
    v
}

struct LayerNorm {
    rows: usize,
    width: usize,
    affine: bool,
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
        if self.affine { "layer_norm_affine".into() } else { "layer_norm".into() }
    }
    fn shape(&self) -> String {
        format!("[{},{}]", self.rows, self.width)
    }
    fn bytes(&self) -> usize {
        2 * 2 * self.rows * self.width + if self.affine { 2 * 2 * self.width } else { 0 }
    }
    fn setup(&self, dev: &Device, seed: u64) -> wavefuse::Result<Box<dyn Instance>> {
        let mut rng = Rng(seed);
        let x_host = rng.halves(self.rows * self.width, 2.0, 0.25);
        let gb_host = self
            .affine
            .then(|| (rng.halves(self.width, 0.5, 1.0), rng.halves(self.width, 0.5, 0.0)));
        let gb = match &gb_host {
            Some((g, b)) => Some((dev.upload(g)?, dev.upload(b)?)),
            None => None,
        };
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
    fn launch(&mut self, dev: &Device) -> wavefuse::Result<()> {
        let x = self.x.view();
        let mut y = self.y.view_mut();
        match &self.gb {
            Some((g, b)) => {
                let (gv, bv) = (g.view(), b.view());
                layer_norm(dev, &x, &mut y, self.width, Some(Affine { gamma: &gv, beta: &bv }), 1e-5)
            }
            None => layer_norm(dev, &x, &mut y, self.width, None, 1e-5),
        }
    }
    fn check(&self) -> Result<f64, String> {
        let y = self.y.download().map_err(|e| e.to_string())?;
        let mut worst = 0.0f64;
        for (r, (xr, yr)) in self.x_host.chunks(self.width).zip(y.chunks(self.width)).enumerate() {
            let (g, b) = match &self.gb_host {
                Some((g, b)) => (Some(g.as_slice()), Some(b.as_slice())),
                None => (None, None),
            };
            let want = oracle::layer_norm_row(xr, g, b, 1e-5);
            for (i, (got, w)) in yr.iter().zip(&want).enumerate() {
                let e = ulp_err(*got, *w);
                if !(e <= 2.0) {
                    return Err(format!("row {r} col {i}: got {got} want {w} ({e:.2} ulp)"));
                }
                worst = worst.max(e);
            }
        }
        Ok(worst)
    }
}
