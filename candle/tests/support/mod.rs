//! Shared test support: the candle devices to test, fresh random tensors,
//! f16 ulp measures.
#![allow(dead_code)]

use candle_core::{DType, Device, Tensor};
use half::f16;

/// Whether this run must test CUDA (`WAVEFUSE_REQUIRE` names it, as in the
/// workspace suite).
pub fn cuda_required() -> bool {
    std::env::var("WAVEFUSE_REQUIRE").is_ok_and(|v| v.split(',').any(|b| b == "cuda"))
}

/// The CUDA device, when this build has candle's CUDA backend and a GPU
/// opens; fails (never skips) when CUDA is required and absent.
// The returns are needed in the build without the `cuda` feature.
#[allow(clippy::needless_return)]
pub fn cuda() -> Option<Device> {
    #[cfg(feature = "cuda")]
    match Device::new_cuda(0) {
        Ok(d) => return Some(d),
        Err(e) => {
            assert!(
                !cuda_required(),
                "WAVEFUSE_REQUIRE names cuda but it did not open: {e}"
            );
            eprintln!("no CUDA device ({e}): CUDA cases not run");
            return None;
        }
    }
    #[cfg(not(feature = "cuda"))]
    {
        assert!(
            !cuda_required(),
            "WAVEFUSE_REQUIRE names cuda but this test binary was built without the `cuda` feature"
        );
        None
    }
}

/// splitmix64.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1).
    pub fn sym(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 52) as f64 - 1.0
    }

    /// f16 values `offset + scale * U(-1, 1)` as a CPU tensor of `dims`.
    pub fn halves(&mut self, dims: &[usize], scale: f64, offset: f64) -> Tensor {
        let n: usize = dims.iter().product();
        let v: Vec<f16> = (0..n)
            .map(|_| f16::from_f64(offset + scale * self.sym()))
            .collect();
        Tensor::from_vec(v, dims, &Device::Cpu).expect("tensor")
    }
}

/// A tensor's elements as f64 (any float dtype, any device).
pub fn f64s(t: &Tensor) -> Vec<f64> {
    t.to_dtype(DType::F64)
        .and_then(|t| t.flatten_all())
        .and_then(|t| t.to_vec1::<f64>())
        .expect("to f64")
}

/// A tensor's f16 elements (any device).
pub fn halves_of(t: &Tensor) -> Vec<f16> {
    t.flatten_all()
        .and_then(|t| t.to_vec1::<f16>())
        .expect("to f16")
}

/// Distance in f16 ulps of `got` from the exact `want` (the ulp of `want`,
/// floored at the subnormal spacing). NaN against NaN and an infinity
/// against the same infinity are 0; NaN against a number, or an infinity
/// against anything else, is infinite, so no check passes a stray NaN.
pub fn ulps(got: f16, want: f64) -> f64 {
    let g = got.to_f64();
    if g.is_nan() || want.is_nan() {
        return if g.is_nan() && want.is_nan() {
            0.0
        } else {
            f64::INFINITY
        };
    }
    if g.is_infinite() || want.is_infinite() {
        return if g == want { 0.0 } else { f64::INFINITY };
    }
    let a = want.abs().max(f16::MIN_POSITIVE.to_f64());
    let ulp = 2f64.powf(a.log2().floor() - 10.0);
    (g - want).abs() / ulp
}

/// The largest ulp distance of `got` from `want` ([`ulps`]).
pub fn max_ulps(got: &[f16], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len(), "lengths");
    got.iter()
        .zip(want)
        .map(|(g, w)| ulps(*g, *w))
        .fold(0.0, f64::max)
}

/// The CUDA result agrees with the emulator's: the NVIDIA build's
/// approximate reciprocal square root / exp2 / reciprocal may move an
/// element by one f16 ulp (the workspace suite's rule), nothing more.
pub fn agrees(name: &str, cuda: &[f16], cpu: &[f16]) {
    assert_eq!(cuda.len(), cpu.len(), "{name}: lengths");
    for (i, (a, b)) in cuda.iter().zip(cpu).enumerate() {
        if a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()) {
            continue;
        }
        assert!(
            ulps(*a, b.to_f64()) <= 1.0,
            "{name} at {i}: CUDA {a} vs emulator {b}"
        );
    }
}
