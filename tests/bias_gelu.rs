//! Bias + GELU through the public API on every backend present.
//!
//! Oracle: the GELU in f64 (libm erf / exp) of `x + b` rounded as the
//! contract says (f16 bias: `f16(f32(x) + f32(b))`; bf16 bias:
//! `f32(x) + f32(b)`). Tolerance: 1 f16 ulp (ulp of the exact value,
//! floored at the smallest normal's, so subnormal results are held to
//! 2^-24 absolute). NaN where the oracle gives NaN (NaN inputs, -inf);
//! results beyond the f16 range must be the infinity of the right sign.
#[macro_use]
mod common;

use common::{POISON, Rng, cpu, devices, ulp_err};
use half::{bf16, f16};
use proptest::prelude::*;
use wavefuse::{Choice, Device, Error, GeluBias, GeluMode, Wave, bias_gelu};

/// GELU in f64, special values as in the contract.
fn gelu64(v: f64, mode: GeluMode) -> f64 {
    if v.is_nan() || v == f64::NEG_INFINITY {
        return f64::NAN;
    }
    if v == f64::INFINITY {
        return v;
    }
    match mode {
        // x * Phi(x), Phi through erfc: no cancellation in the tail.
        GeluMode::Erf => 0.5 * v * libm::erfc(-v / std::f64::consts::SQRT_2),
        // 0.5 x (1 + tanh u) = x / (1 + e^(-2u)).
        GeluMode::Tanh => {
            let u = (2.0 / std::f64::consts::PI).sqrt() * (v + 0.044715 * v * v * v);
            v / (1.0 + libm::exp(-2.0 * u))
        }
    }
}

#[derive(Clone, Debug)]
enum Bias {
    F16(Vec<f16>),
    Bf16(Vec<bf16>),
}

impl Bias {
    /// `x + b` as the contract rounds it, in f64.
    fn add(&self, x: f16, col: usize) -> f64 {
        match self {
            Bias::F16(b) => f16::from_f32(x.to_f32() + b[col].to_f32()).to_f64(),
            Bias::Bf16(b) => (x.to_f32() + b[col].to_f32()) as f64,
        }
    }
}

struct Case {
    cols: usize,
    x: Vec<f16>,
    bias: Bias,
    mode: GeluMode,
    /// Elements of offset into the buffers (an odd offset forces the
    /// scalar path even when `cols % 8 == 0`).
    offset: usize,
}

/// Checks one output element; returns its error in ulps.
///
/// A NaN input keeps its payload through the f32 round trip, so an input
/// with the poison's payload legitimately gives the poison's bits: for
/// expected NaNs any NaN passes (the other elements prove the writes).
fn check_elem(got: f16, want: f64, at: &str) -> Result<f64, String> {
    if want.is_nan() {
        return if got.is_nan() {
            Ok(0.0)
        } else {
            Err(format!("{at}: want NaN, got {got}"))
        };
    }
    if got.to_bits() == POISON.to_bits() {
        return Err(format!("{at}: not written"));
    }
    if want.abs() >= 65520.0 {
        return if got.is_infinite() && (got.to_f64() > 0.0) == (want > 0.0) {
            Ok(0.0)
        } else {
            Err(format!("{at}: want overflow of {want}, got {got}"))
        };
    }
    let e = ulp_err(got, want);
    if e <= 1.0 {
        Ok(e)
    } else {
        Err(format!("{at}: got {got} want {want:e} ({e:.3} ulp)"))
    }
}

/// Runs `c` on `dev` and checks every element; returns the worst ulp error.
fn run(dev: &Device, c: &Case) -> Result<f64, String> {
    let s = |e: Error| e.to_string();
    let n = c.x.len();
    let mut xb = vec![f16::ZERO; c.offset];
    xb.extend_from_slice(&c.x);
    let x = dev.upload(&xb).map_err(s)?;
    let mut y = dev.upload(&vec![POISON; n + c.offset]).map_err(s)?;
    let xv = x.slice(c.offset..c.offset + n).ok_or("slice")?;
    let mut yv = y.slice_mut(c.offset..c.offset + n).ok_or("slice")?;
    match &c.bias {
        Bias::F16(b) => {
            let mut bb = vec![f16::ZERO; c.offset];
            bb.extend_from_slice(b);
            let bd = dev.upload(&bb).map_err(s)?;
            let bv = bd.slice(c.offset..c.offset + c.cols).ok_or("slice")?;
            bias_gelu(dev, &xv, GeluBias::F16(&bv), &mut yv, c.cols, c.mode).map_err(s)?;
        }
        Bias::Bf16(b) => {
            let mut bb = vec![bf16::ZERO; c.offset];
            bb.extend_from_slice(b);
            let bd = dev.upload(&bb).map_err(s)?;
            let bv = bd.slice(c.offset..c.offset + c.cols).ok_or("slice")?;
            bias_gelu(dev, &xv, GeluBias::Bf16(&bv), &mut yv, c.cols, c.mode).map_err(s)?;
        }
    }
    let out = y.download().map_err(s)?;
    if out[..c.offset]
        .iter()
        .any(|v| v.to_bits() != POISON.to_bits())
    {
        return Err("wrote before the output".into());
    }
    let mut worst = 0.0f64;
    for (i, (&got, &xi)) in out[c.offset..].iter().zip(&c.x).enumerate() {
        let want = gelu64(c.bias.add(xi, i % c.cols), c.mode);
        let at = format!("{} elem {i} (x {xi}, {:?})", dev.info().name, c.mode);
        worst = worst.max(check_elem(got, want, &at)?);
    }
    Ok(worst)
}

#[test]
fn every_f16_input_within_1_ulp_both_modes_both_paths() {
    // All 65536 bit patterns of x (NaNs, infinities, subnormals, -0
    // included) with a zero bias, through the vector path (cols 128) and
    // the scalar path (cols 1), in both modes, with both bias dtypes.
    let x: Vec<f16> = (0..=u16::MAX).map(f16::from_bits).collect();
    for mode in [GeluMode::Erf, GeluMode::Tanh] {
        for cols in [128usize, 1] {
            for bias in [
                Bias::F16(vec![f16::ZERO; cols]),
                Bias::Bf16(vec![bf16::ZERO; cols]),
            ] {
                let c = Case {
                    cols,
                    x: x.clone(),
                    bias,
                    mode,
                    offset: 0,
                };
                for dev in devices() {
                    let worst = run(&dev, &c).unwrap_or_else(|e| panic!("{e}"));
                    eprintln!(
                        "{mode:?} cols {cols} {}: worst {worst:.3} ulp",
                        dev.info().name
                    );
                }
            }
        }
    }
}

#[test]
fn special_values_follow_the_f32_formula() {
    // gelu(+inf) = +inf, gelu(-inf) = NaN (-inf * 0), NaN -> NaN, large
    // negative -> -0.0, in both modes.
    let x = [
        f16::INFINITY,
        f16::NEG_INFINITY,
        f16::NAN,
        f16::from_f32(-30.0),
        f16::from_f32(-65504.0),
        f16::from_f32(65504.0),
        f16::ZERO,
        f16::NEG_ZERO,
    ];
    for mode in [GeluMode::Erf, GeluMode::Tanh] {
        for dev in devices() {
            let xd = dev.upload(&x).expect("upload");
            let b = dev.upload(&[f16::ZERO; 8]).expect("upload");
            let mut y = dev.upload(&[POISON; 8]).expect("upload");
            bias_gelu(
                &dev,
                &xd.view(),
                GeluBias::F16(&b.view()),
                &mut y.view_mut(),
                8,
                mode,
            )
            .expect("launch");
            let y = y.download().expect("download");
            assert_eq!(y[0], f16::INFINITY, "{mode:?}");
            assert!(y[1].is_nan(), "{mode:?} gelu(-inf) = {}", y[1]);
            assert!(y[2].is_nan(), "{mode:?}");
            assert_eq!(y[3].to_bits(), 0x8000, "{mode:?} gelu(-30) = -0");
            assert_eq!(y[4].to_bits(), 0x8000, "{mode:?} gelu(-65504) = -0");
            assert_eq!(y[5], f16::from_f32(65504.0), "{mode:?}");
            // -0 + 0 = +0 in the f16 bias add, so both zeros give +0.
            assert_eq!(y[6].to_bits(), 0, "{mode:?}");
            assert_eq!(y[7].to_bits(), 0, "{mode:?}");
        }
    }
}

#[test]
fn vector_and_scalar_paths_agree_bit_for_bit() {
    let mut rng = Rng(99);
    let cols = 64;
    let x = rng.halves(37 * cols, 3.0, 0.0);
    let b = rng.halves(cols, 1.0, 0.0);
    let mut outs = Vec::new();
    for dev in devices() {
        for offset in [0usize, 1] {
            let mut xb = vec![f16::ZERO; offset];
            xb.extend_from_slice(&x);
            let mut bb = vec![f16::ZERO; offset];
            bb.extend_from_slice(&b);
            let xd = dev.upload(&xb).expect("upload");
            let bd = dev.upload(&bb).expect("upload");
            let mut y = dev.upload(&vec![POISON; x.len() + offset]).expect("upload");
            let xv = xd.slice(offset..offset + x.len()).expect("slice");
            let bv = bd.slice(offset..offset + cols).expect("slice");
            let mut yv = y.slice_mut(offset..offset + x.len()).expect("slice");
            bias_gelu(&dev, &xv, GeluBias::F16(&bv), &mut yv, cols, GeluMode::Erf).expect("launch");
            let out = y.download().expect("download");
            outs.push((
                format!("{} offset {offset}", dev.info().name),
                out[offset..].to_vec(),
            ));
        }
    }
    // Within a backend the two paths agree bit for bit. Across backends the
    // GPUs' hardware reciprocal and exp2 may move a result by one f16 ulp
    // (the emulator uses exact division and libm's exp2).
    for pair in outs.chunks(2) {
        let [(na, a), (nb, b)] = pair else {
            panic!("two offsets per device")
        };
        assert!(
            a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()),
            "{nb} differs from {na}"
        );
    }
    for (name, o) in &outs[2..] {
        let worst = o
            .iter()
            .zip(&outs[0].1)
            .map(|(a, b)| (a.to_bits() as i32 - b.to_bits() as i32).abs())
            .max()
            .unwrap_or(0);
        assert!(worst <= 1, "{name}: {worst} ulp from {}", outs[0].0);
    }
}

#[allow(clippy::too_many_arguments)]
fn make_case(
    seed: u64,
    rows: usize,
    cols: usize,
    log_scale: f64,
    bf: bool,
    tanh: bool,
    offset: usize,
    special: bool,
) -> Case {
    let mut rng = Rng(seed);
    let scale = 10f64.powf(log_scale);
    let mut x = rng.halves(rows * cols, scale, 0.0);
    if special {
        for v in x.iter_mut() {
            match rng.below(40) {
                0 => *v = f16::NAN,
                1 => *v = f16::INFINITY,
                2 => *v = f16::NEG_INFINITY,
                3 => *v = f16::from_bits(rng.below(0x400) as u16), // subnormal
                4 => *v = f16::from_f32(-5.0 - rng.unit() as f32 * 2.0), // erfc tail
                _ => {}
            }
        }
    }
    let bias = if bf {
        // bf16 can leave the f16 range: exercise overflow to inf too.
        Bias::Bf16(
            (0..cols)
                .map(|_| bf16::from_f64(rng.normal() * if rng.below(8) == 0 { 1e5 } else { scale }))
                .collect(),
        )
    } else {
        Bias::F16(rng.halves(cols, scale, 0.0))
    };
    Case {
        cols,
        x,
        bias,
        mode: if tanh { GeluMode::Tanh } else { GeluMode::Erf },
        offset,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, .. ProptestConfig::default() })]

    #[test]
    fn matches_f64_oracle(
        seed in any::<u64>(),
        rows in prop_oneof![1usize..4, 5usize..40],
        cols in prop_oneof![Just(1usize), 1usize..20, (1usize..40).prop_map(|k| 8 * k), Just(768)],
        log_scale in -2.0f64..3.0,
        bf in any::<bool>(),
        tanh in any::<bool>(),
        offset in prop_oneof![3 => Just(0usize), 1 => Just(1usize), 1 => Just(8usize)],
        special in any::<bool>(),
    ) {
        let c = make_case(seed, rows, cols, log_scale, bf, tanh, offset, special);
        for dev in devices() {
            let r = run(&dev, &c);
            prop_assert!(r.is_ok(), "{}", r.err().unwrap_or_default());
        }
    }
}

#[test]
fn several_blocks_with_a_remainder() {
    // 1031 rows x 96 cols: many workgroups, the last one partial.
    let c = make_case(5, 1031, 96, 0.5, false, false, 0, true);
    for dev in devices() {
        run(&dev, &c).unwrap_or_else(|e| panic!("{e}"));
    }
}

#[test]
fn no_rows_is_a_no_op() {
    for dev in devices() {
        let x = dev.alloc::<f16>(0).expect("alloc");
        let b = dev.upload(&[f16::ONE; 8]).expect("upload");
        let mut y = dev.alloc::<f16>(0).expect("alloc");
        for cols in [8, 3] {
            let b = b.slice(0..cols).expect("in range");
            bias_gelu(
                &dev,
                &x.view(),
                GeluBias::F16(&b),
                &mut y.view_mut(),
                cols,
                GeluMode::Erf,
            )
            .expect("no-op");
        }
    }
}

/// `bias_gelu` on `x` (`x_len` ones), a `bias` view, and a poisoned `y`
/// of `y_len`.
fn try_gelu(
    d: &Device,
    x_len: usize,
    bias: GeluBias<'_>,
    y_len: usize,
    cols: usize,
) -> wavefuse::Result<()> {
    let x = d.upload(&vec![f16::ONE; x_len])?;
    let mut y = d.upload(&vec![POISON; y_len])?;
    bias_gelu(d, &x.view(), bias, &mut y.view_mut(), cols, GeluMode::Erf)?;
    panic!("accepted: {:?}", y.download());
}

#[test]
fn rejects_bad_arguments_before_any_launch() {
    let d = cpu();
    let other = Device::open(Choice::Cpu(Wave::W32)).expect("cpu backend");
    let b8 = d.upload(&[f16::ONE; 8]).expect("upload");
    let b7 = d.upload(&[bf16::ONE; 7]).expect("upload");
    let b_other = other.upload(&[f16::ONE; 8]).expect("upload");
    let (v8, v_other) = (b8.view(), b_other.view());
    rejects! {
        "cols 0": try_gelu(&d, 8, GeluBias::F16(&v8), 8, 0)
            => Error::BadParameter { what: "cols", .. },
        "ragged x": try_gelu(&d, 20, GeluBias::F16(&v8), 20, 8)
            => Error::RaggedRows { len: 20, width: 8, .. },
        "y length": try_gelu(&d, 16, GeluBias::F16(&v8), 8, 8)
            => Error::LengthMismatch { what: "y", .. },
        "bias length": try_gelu(&d, 16, GeluBias::Bf16(&b7.view()), 16, 8)
            => Error::LengthMismatch { what: "bias", got: 7, .. },
        "bias of another device": try_gelu(&d, 8, GeluBias::F16(&v_other), 8, 8)
            => Error::WrongDevice { what: "bias", .. },
    }
}
