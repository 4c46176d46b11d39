//! LayerNorm through the public API on every backend present.
//!
//! Tolerance: |y - ref| <= 1 f16 ulp of ref (floored at the smallest
//! normal), or <= the reference's own f16 rounding error plus the f32
//! conditioning term 64 * 2^-24 * max|x| * rstd * (1 + |gamma|),
//! where ref is the f64 LayerNorm of the same f16 inputs. The second term is
//! the f32 error of the mean when the offset dwarfs the spread; PyTorch's
//! f32 path has it too. For centred data it is far below an ulp.
mod common;

use common::{POISON, Rng, devices, halves, oracle, ulp_err};
use half::f16;
use proptest::prelude::*;
use wavefuse::{Affine, Device, Error, layer_norm};

const WIDTHS: [usize; 3] = [192, 384, 768];

struct Case {
    width: usize,
    rows: usize,
    x: Vec<f16>,
    gamma: Option<Vec<f16>>,
    beta: Option<Vec<f16>>,
    eps: f32,
}

fn make_case(
    seed: u64,
    width: usize,
    rows: usize,
    scale: f64,
    offset: f64,
    affine: bool,
    special: u8,
) -> Case {
    let mut rng = Rng(seed);
    let mut x = halves(&mut rng, rows * width, scale, offset);
    // Special rows: constant rows, a NaN, +/-Inf.
    for r in 0..rows {
        match (special, rng.below(5)) {
            (1, 0) => {
                let c = x[r * width];
                x[r * width..(r + 1) * width].fill(c);
            }
            (2, 0) => x[r * width + rng.below(width as u64) as usize] = f16::NAN,
            (2, 1) => x[r * width + rng.below(width as u64) as usize] = f16::INFINITY,
            (2, 2) => x[r * width + rng.below(width as u64) as usize] = f16::NEG_INFINITY,
            _ => {}
        }
    }
    let (gamma, beta) = if affine {
        (
            Some(halves(&mut rng, width, 0.5, 1.0)),
            Some(halves(&mut rng, width, 0.5, 0.0)),
        )
    } else {
        (None, None)
    };
    let eps = [1e-5f32, 1e-6, 1e-3][rng.below(3) as usize];
    Case {
        width,
        rows,
        x,
        gamma,
        beta,
        eps,
    }
}

/// Runs one case on `dev` and checks every output element.
fn check(dev: &Device, c: &Case) -> Result<f64, String> {
    let x = dev.upload(&c.x).map_err(|e| e.to_string())?;
    let mut y = dev
        .upload(&vec![POISON; c.x.len()])
        .map_err(|e| e.to_string())?;
    let g = c
        .gamma
        .as_ref()
        .map(|g| dev.upload(g))
        .transpose()
        .map_err(|e| e.to_string())?;
    let b = c
        .beta
        .as_ref()
        .map(|b| dev.upload(b))
        .transpose()
        .map_err(|e| e.to_string())?;
    let (gv, bv) = (g.as_ref().map(|g| g.view()), b.as_ref().map(|b| b.view()));
    let affine = match (&gv, &bv) {
        (Some(gamma), Some(beta)) => Some(Affine { gamma, beta }),
        _ => None,
    };
    layer_norm(dev, &x.view(), &mut y.view_mut(), c.width, affine, c.eps)
        .map_err(|e| e.to_string())?;
    let out = y.download().map_err(|e| e.to_string())?;
    let mut worst = 0.0f64;
    for r in 0..c.rows {
        let row = &c.x[r * c.width..(r + 1) * c.width];
        let want = oracle::layer_norm_row(row, c.gamma.as_deref(), c.beta.as_deref(), c.eps as f64);
        let max_abs = row.iter().map(|v| v.to_f64().abs()).fold(0.0, f64::max);
        let mean = row.iter().map(|v| v.to_f64()).sum::<f64>() / c.width as f64;
        let var = row.iter().map(|v| (v.to_f64() - mean).powi(2)).sum::<f64>() / c.width as f64;
        let rstd = 1.0 / (var + c.eps as f64).sqrt();
        for i in 0..c.width {
            let got = out[r * c.width + i];
            if got.to_bits() == POISON.to_bits() {
                return Err(format!("row {r} col {i}: not written"));
            }
            let w = want[i];
            if w.is_nan() {
                if !got.is_nan() {
                    return Err(format!("row {r} col {i}: want NaN, got {got}"));
                }
                continue;
            }
            let g = c.gamma.as_ref().map_or(1.0, |g| g[i].to_f64().abs());
            let cond = 64.0 * 2f64.powi(-24) * max_abs * rstd * (1.0 + g);
            let err_abs = (got.to_f64() - w).abs();
            let e = ulp_err(got, w);
            // Outputs beyond f16 range saturate to inf; the oracle says so too.
            if w.abs() > 65504.0 {
                continue;
            }
            // The reference's own f16 rounding, in absolute units.
            let round = (f16::from_f64(w).to_f64() - w).abs();
            if !(e <= 1.0 || err_abs <= cond + round + 1e-12) {
                return Err(format!(
                    "row {r} col {i}: got {got} want {w} ({e:.2} ulp, cond {cond:.3e}, {})",
                    dev.info().name
                ));
            }
            worst = worst.max(e);
        }
    }
    Ok(worst)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, .. ProptestConfig::default() })]

    #[test]
    fn matches_f64_oracle(
        seed in any::<u64>(),
        wi in 0usize..3,
        rows in prop_oneof![1usize..4, 30usize..34, 60usize..100],
        log_scale in -3.0f64..4.7,
        offset_kind in 0u8..3,
        affine in any::<bool>(),
        special in 0u8..3,
    ) {
        let width = WIDTHS[wi];
        let scale = 10f64.powf(log_scale);
        let offset = match offset_kind { 0 => 0.0, 1 => 3.0 * scale, _ => -100.0 };
        let case = make_case(seed, width, rows, scale, offset, affine, special);
        for dev in devices() {
            let r = check(&dev, &case);
            prop_assert!(r.is_ok(), "{}: {}", dev.info().name, r.err().unwrap_or_default());
        }
    }
}

#[test]
fn big_row_counts_and_all_widths_every_backend() {
    // A few full blocks plus a remainder, at every width, affine and not.
    for (i, &w) in WIDTHS.iter().enumerate() {
        for affine in [false, true] {
            let case = make_case(0xC0FFEE + i as u64, w, 517, 1.0, 0.5, affine, 1);
            for dev in devices() {
                let worst =
                    check(&dev, &case).unwrap_or_else(|e| panic!("{}: {e}", dev.info().name));
                eprintln!(
                    "width {w} affine {affine} {}: worst {worst:.2} ulp",
                    dev.info().name
                );
            }
        }
    }
}

#[test]
fn backends_agree_with_the_emulator() {
    // Same source, same reduction order: wave32 and wave64 emulation give
    // identical bits; a GPU agrees within `common::agrees_with_emulator`'s
    // bound. The emulator is the reference even where the suite runs
    // GPU-only.
    let case = make_case(7, 384, 77, 2.0, 1.0, true, 0);
    let run = |dev: &Device| {
        let x = dev.upload(&case.x).expect("upload");
        let mut y = dev.upload(&vec![POISON; case.x.len()]).expect("upload");
        let g = dev
            .upload(case.gamma.as_ref().expect("affine"))
            .expect("upload");
        let b = dev
            .upload(case.beta.as_ref().expect("affine"))
            .expect("upload");
        let (gv, bv) = (g.view(), b.view());
        layer_norm(
            dev,
            &x.view(),
            &mut y.view_mut(),
            384,
            Some(Affine {
                gamma: &gv,
                beta: &bv,
            }),
            case.eps,
        )
        .expect("launch");
        y.download().expect("download")
    };
    let reference = run(&cpu());
    for dev in devices() {
        let info = dev.info();
        let differ = common::agrees_with_emulator(info.backend, &info.name, &run(&dev), &reference);
        eprintln!(
            "{}: {differ} of {} elements differ from the emulator",
            info.name,
            reference.len()
        );
    }
}

// ---- one test per bad input: each is rejected before any launch ----

fn cpu() -> Device {
    Device::open(wavefuse::Choice::Cpu(wavefuse::Wave::W64)).expect("cpu backend")
}

#[test]
fn rejects_unsupported_width() {
    let d = cpu();
    let x = d.upload(&vec![f16::ONE; 512]).expect("upload");
    let mut y = d.alloc::<f16>(512).expect("alloc");
    let e = layer_norm(&d, &x.view(), &mut y.view_mut(), 256, None, 1e-5);
    assert!(
        matches!(e, Err(Error::UnsupportedWidth { width: 256, .. })),
        "{e:?}"
    );
}

#[test]
fn rejects_ragged_rows() {
    let d = cpu();
    let x = d.upload(&vec![f16::ONE; 200]).expect("upload");
    let mut y = d.alloc::<f16>(200).expect("alloc");
    let e = layer_norm(&d, &x.view(), &mut y.view_mut(), 192, None, 1e-5);
    assert!(
        matches!(e, Err(Error::RaggedRows { len: 200, .. })),
        "{e:?}"
    );
}

#[test]
fn rejects_empty_input() {
    let d = cpu();
    let x = d.alloc::<f16>(0).expect("alloc");
    let mut y = d.alloc::<f16>(0).expect("alloc");
    let e = layer_norm(&d, &x.view(), &mut y.view_mut(), 192, None, 1e-5);
    assert!(matches!(e, Err(Error::Empty { .. })), "{e:?}");
}

#[test]
fn rejects_output_length_mismatch() {
    let d = cpu();
    let x = d.upload(&vec![f16::ONE; 384]).expect("upload");
    let mut y = d.alloc::<f16>(192).expect("alloc");
    let e = layer_norm(&d, &x.view(), &mut y.view_mut(), 192, None, 1e-5);
    assert!(
        matches!(e, Err(Error::LengthMismatch { what: "y", .. })),
        "{e:?}"
    );
}

#[test]
fn rejects_misaligned_input_and_output() {
    let d = cpu();
    let x = d.upload(&vec![f16::ONE; 192 * 2 + 1]).expect("upload");
    let mut y = d.alloc::<f16>(192 * 2 + 1).expect("alloc");
    let xv = x.slice(1..385).expect("in range");
    let mut yv = y.slice_mut(0..384).expect("in range");
    let e = layer_norm(&d, &xv, &mut yv, 192, None, 1e-5);
    assert!(
        matches!(e, Err(Error::Misaligned { what: "x", .. })),
        "{e:?}"
    );
    let xv = x.slice(0..384).expect("in range");
    let mut yv = y.slice_mut(1..385).expect("in range");
    let e = layer_norm(&d, &xv, &mut yv, 192, None, 1e-5);
    assert!(
        matches!(e, Err(Error::Misaligned { what: "y", .. })),
        "{e:?}"
    );
}

#[test]
fn rejects_bad_eps() {
    let d = cpu();
    let x = d.upload(&vec![f16::ONE; 192]).expect("upload");
    let mut y = d.alloc::<f16>(192).expect("alloc");
    for eps in [-1e-5, f32::NAN, f32::INFINITY] {
        let e = layer_norm(&d, &x.view(), &mut y.view_mut(), 192, None, eps);
        assert!(
            matches!(e, Err(Error::BadParameter { what: "eps", .. })),
            "{e:?}"
        );
    }
}

#[test]
fn rejects_bad_affine_lengths_and_alignment() {
    let d = cpu();
    let x = d.upload(&vec![f16::ONE; 192]).expect("upload");
    let mut y = d.alloc::<f16>(192).expect("alloc");
    let g = d.upload(&vec![f16::ONE; 200]).expect("upload");
    let b = d.upload(&vec![f16::ZERO; 192]).expect("upload");
    let (gv, bv) = (g.view(), b.view());
    let e = layer_norm(
        &d,
        &x.view(),
        &mut y.view_mut(),
        192,
        Some(Affine {
            gamma: &gv,
            beta: &bv,
        }),
        1e-5,
    );
    assert!(
        matches!(e, Err(Error::LengthMismatch { what: "gamma", .. })),
        "{e:?}"
    );
    let gv = g.slice(1..193).expect("in range");
    let e = layer_norm(
        &d,
        &x.view(),
        &mut y.view_mut(),
        192,
        Some(Affine {
            gamma: &gv,
            beta: &bv,
        }),
        1e-5,
    );
    assert!(
        matches!(e, Err(Error::Misaligned { what: "gamma", .. })),
        "{e:?}"
    );
}

#[test]
fn rejects_buffers_of_another_device() {
    let d1 = cpu();
    let d2 = cpu();
    let x = d2.upload(&vec![f16::ONE; 192]).expect("upload");
    let mut y = d1.alloc::<f16>(192).expect("alloc");
    let e = layer_norm(&d1, &x.view(), &mut y.view_mut(), 192, None, 1e-5);
    assert!(
        matches!(e, Err(Error::WrongDevice { what: "x", .. })),
        "{e:?}"
    );
}
