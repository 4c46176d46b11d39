//! splitmix64: the suite and the harness draw fresh inputs from a seed.
use half::f16;

/// A splitmix64 generator.
pub struct Rng(pub u64);

impl Rng {
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Approximately normal (a scaled sum of four uniforms, in [-3.5, 3.5]).
    pub fn normal(&mut self) -> f64 {
        (0..4).map(|_| self.unit()).sum::<f64>() * 1.732 - 3.464
    }

    /// Uniform in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// `n` halves `offset + scale * N(0,1)`, saturating to the f16 range.
    pub fn halves(&mut self, n: usize, scale: f64, offset: f64) -> Vec<f16> {
        (0..n)
            .map(|_| f16::from_f64((offset + scale * self.normal()).clamp(-65504.0, 65504.0)))
            .collect()
    }

    /// `n` halves uniform in `offset +- scale` (the harness's inputs).
    pub fn uniform_halves(&mut self, n: usize, scale: f64, offset: f64) -> Vec<f16> {
        (0..n)
            .map(|_| f16::from_f64(offset + scale * (2.0 * self.unit() - 1.0)))
            .collect()
    }
}
