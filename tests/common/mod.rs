//! Shared test support: the backends to test, f64 oracles, ulp measures,
//! poisoning and a small PRNG for fresh inputs.
#![allow(dead_code)]

pub mod oracle;

use half::f16;
use wavefuse::{BackendKind, Device};

/// Every backend present: CUDA/HIP when a device exists, CPU emulator in
/// wave64 and wave32 always.
///
/// `WAVEFUSE_TEST_GPU_ONLY=1` keeps only GPU backends (sanitizer runs).
pub fn devices() -> Vec<Device> {
    let d: Vec<Device> = [
        wavefuse::Choice::Cuda(0),
        wavefuse::Choice::Hip(0),
        wavefuse::Choice::Cpu(wavefuse::Wave::W64),
        wavefuse::Choice::Cpu(wavefuse::Wave::W32),
    ]
    .into_iter()
    .filter_map(|c| Device::open(c).ok())
    .collect();
    if std::env::var_os("WAVEFUSE_TEST_GPU_ONLY").is_some() {
        return d
            .into_iter()
            .filter(|d| d.info().backend != BackendKind::Cpu)
            .collect();
    }
    assert!(
        d.iter()
            .filter(|d| d.info().backend == BackendKind::Cpu)
            .count()
            == 2,
        "both emulator modes must be present"
    );
    d
}

/// f16 NaN with a payload that no kernel produces: outputs are filled with
/// it before each launch, so an element the kernel did not write stays
/// recognisably poisoned.
pub const POISON: f16 = f16::from_bits(0x7e5a);

/// Distance in f16 ulps between `got` and the exact value `want`, where the
/// ulp is that of `want` in f16 (floored at the smallest normal's ulp).
pub fn ulp_err(got: f16, want: f64) -> f64 {
    let g = got.to_f64();
    let a = want.abs().max(f16::MIN_POSITIVE.to_f64());
    let e = a.log2().floor();
    let ulp = 2f64.powf(e - 10.0);
    (g - want).abs() / ulp
}

/// splitmix64: tests draw fresh inputs from a proptest-chosen seed.
pub struct Rng(pub u64);

impl Rng {
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
    /// Approximately normal (sum of uniforms).
    pub fn normal(&mut self) -> f64 {
        (0..4).map(|_| self.unit()).sum::<f64>() * 1.732 - 3.464
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

/// Halves `offset + scale * N(0,1)`, saturating to the f16 range.
pub fn halves(rng: &mut Rng, n: usize, scale: f64, offset: f64) -> Vec<f16> {
    (0..n)
        .map(|_| f16::from_f64((offset + scale * rng.normal()).clamp(-65504.0, 65504.0)))
        .collect()
}

/// Checks one case's output from `backend` against the emulator's
/// (`reference`, from `Cpu(W64)`): the emulator in either wave mode and the
/// HIP build (IEEE arithmetic throughout) must give the same bits; the
/// NVIDIA build, whose kernels use the hardware's approximate reciprocal
/// square root / exp2 / reciprocal, may move an element by one f16 ulp.
/// Returns how many elements differ.
pub fn agrees_with_emulator(
    backend: wavefuse::BackendKind,
    name: &str,
    got: &[f16],
    reference: &[f16],
) -> usize {
    assert_eq!(got.len(), reference.len(), "{name}: length");
    let mut differ = 0;
    for (i, (a, b)) in got.iter().zip(reference).enumerate() {
        if a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()) {
            continue;
        }
        differ += 1;
        assert!(
            backend == wavefuse::BackendKind::Cuda,
            "{name} differs from the emulator at {i}: {a} vs {b}"
        );
        let e = ulp_err(*a, b.to_f64());
        assert!(e <= 1.0, "{name} at {i}: {a} vs emulator {b} ({e} ulp)");
    }
    differ
}
