//! Residual add + LayerNorm through the public API on every backend present.
//!
//! `residual_out` must be bit-exact: the f16 sum rounded once (nearest-even)
//! from the exact f64 sum. `y` is checked against the f64 LayerNorm of that
//! ROUNDED sum with the tolerance of tests/layer_norm.rs (1 f16 ulp, or the
//! f32 conditioning term); `classic_bug_normalising_unrounded_sum_is_caught`
//! builds rows where normalising the unrounded sum gives different f16
//! outputs and shows the check tells the two apart.
mod common;
mod fused;

use common::{POISON, Rng, devices, halves};
use fused::{add_f16, check_ln_row, round_f16};
use half::f16;
use proptest::prelude::*;
use wavefuse::{Affine, Device, Error, add_layer_norm, add_layer_norm_to};

const WIDTHS: [usize; 3] = [192, 384, 768];

struct Case {
    width: usize,
    rows: usize,
    residual: Vec<f16>,
    branch: Vec<f16>,
    gamma: Option<Vec<f16>>,
    beta: Option<Vec<f16>>,
    eps: f32,
}

#[allow(clippy::too_many_arguments)]
fn make_case(
    seed: u64,
    width: usize,
    rows: usize,
    scale: f64,
    offset: f64,
    branch_rel: f64,
    affine: bool,
    special: u8,
) -> Case {
    let mut rng = Rng(seed);
    let n = rows * width;
    let mut residual = halves(&mut rng, n, scale, offset);
    let mut branch = halves(&mut rng, n, scale * branch_rel, 0.0);
    for r in 0..rows {
        let row = r * width..(r + 1) * width;
        let col = r * width + rng.below(width as u64) as usize;
        match (special, rng.below(4)) {
            // A constant row: constant residual, zero branch.
            (1, 0) => {
                let c = residual[r * width];
                residual[row.clone()].fill(c);
                branch[row].fill(f16::ZERO);
            }
            // A constant sum from a varying residual: r + (-r + c) == c
            // needs exact cancellation, so use branch = -residual + 0.
            (1, 1) => {
                for i in row {
                    branch[i] = -residual[i];
                }
            }
            (2, 0) => residual[col] = f16::NAN,
            (2, 1) => branch[col] = f16::INFINITY,
            (2, 2) => residual[col] = f16::NEG_INFINITY,
            // Overflow: the f16 sum of two finite halves is +Inf.
            (2, 3) => {
                residual[col] = f16::from_f32(60000.0);
                branch[col] = f16::from_f32(30000.0);
            }
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
        residual,
        branch,
        gamma,
        beta,
        eps,
    }
}

/// Runs the case on `dev` (in place or into a separate, poisoned
/// `residual_out`) and returns (residual_out, y).
fn run(dev: &Device, c: &Case, in_place: bool) -> Result<(Vec<f16>, Vec<f16>), Error> {
    let n = c.residual.len();
    let mut res = dev.upload(&c.residual)?;
    let br = dev.upload(&c.branch)?;
    let mut y = dev.upload(&vec![POISON; n])?;
    let g = c.gamma.as_ref().map(|g| dev.upload(g)).transpose()?;
    let b = c.beta.as_ref().map(|b| dev.upload(b)).transpose()?;
    let (gv, bv) = (g.as_ref().map(|g| g.view()), b.as_ref().map(|b| b.view()));
    let affine = match (&gv, &bv) {
        (Some(gamma), Some(beta)) => Some(Affine { gamma, beta }),
        _ => None,
    };
    if in_place {
        add_layer_norm(
            dev,
            &mut res.view_mut(),
            &br.view(),
            &mut y.view_mut(),
            c.width,
            affine,
            c.eps,
        )?;
        Ok((res.download()?, y.download()?))
    } else {
        let mut out = dev.upload(&vec![POISON; n])?;
        add_layer_norm_to(
            dev,
            &res.view(),
            &br.view(),
            &mut out.view_mut(),
            &mut y.view_mut(),
            c.width,
            affine,
            c.eps,
        )?;
        // `residual` is only read.
        let untouched = res.download()?;
        if untouched
            .iter()
            .zip(&c.residual)
            .any(|(a, b)| a.to_bits() != b.to_bits())
        {
            return Err(Error::Empty {
                op: "test: add_layer_norm_to wrote residual",
                what: "residual",
            });
        }
        Ok((out.download()?, y.download()?))
    }
}

/// Checks one case on `dev`; returns the worst y error in ulps.
fn check(dev: &Device, c: &Case, in_place: bool) -> Result<f64, String> {
    let (rout, y) = run(dev, c, in_place).map_err(|e| e.to_string())?;
    let want: Vec<f16> = c
        .residual
        .iter()
        .zip(&c.branch)
        .map(|(&a, &b)| add_f16(a, b))
        .collect();
    for (i, (g, w)) in rout.iter().zip(&want).enumerate() {
        let same = g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan());
        if !same || g.to_bits() == POISON.to_bits() {
            return Err(format!(
                "residual_out[{i}] = {g} ({:#06x}), want {w} ({:#06x}) = {} + {}",
                g.to_bits(),
                w.to_bits(),
                c.residual[i],
                c.branch[i]
            ));
        }
    }
    let mut worst = 0.0f64;
    for r in 0..c.rows {
        let s = r * c.width..(r + 1) * c.width;
        let e = check_ln_row(
            &y[s.clone()],
            &want[s],
            c.gamma.as_deref(),
            c.beta.as_deref(),
            c.eps,
        )
        .map_err(|e| format!("row {r}: {e}"))?;
        worst = worst.max(e);
    }
    Ok(worst)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, .. ProptestConfig::default() })]

    #[test]
    fn matches_f64_oracle(
        seed in any::<u64>(),
        wi in 0usize..3,
        rows in prop_oneof![1usize..4, 30usize..34, 60usize..100],
        log_scale in -3.0f64..4.7,
        offset_kind in 0u8..3,
        log_branch_rel in -3.0f64..0.5,
        affine in any::<bool>(),
        special in 0u8..3,
        in_place in any::<bool>(),
    ) {
        let width = WIDTHS[wi];
        let scale = 10f64.powf(log_scale);
        let offset = match offset_kind { 0 => 0.0, 1 => 3.0 * scale, _ => -100.0 };
        let case = make_case(
            seed, width, rows, scale, offset, 10f64.powf(log_branch_rel), affine, special,
        );
        for dev in devices() {
            let r = check(&dev, &case, in_place);
            prop_assert!(r.is_ok(), "{} (in place {in_place}): {}", dev.info().name, r.err().unwrap_or_default());
        }
    }
}

#[test]
fn big_row_counts_all_widths_both_modes() {
    for (i, &w) in WIDTHS.iter().enumerate() {
        for affine in [false, true] {
            let case = make_case(0xADD + i as u64, w, 517, 1.0, 0.5, 0.3, affine, 1);
            for dev in devices() {
                for in_place in [false, true] {
                    let worst = check(&dev, &case, in_place)
                        .unwrap_or_else(|e| panic!("{}: {e}", dev.info().name));
                    eprintln!(
                        "width {w} affine {affine} in place {in_place} {}: worst {worst:.2} ulp",
                        dev.info().name
                    );
                }
            }
        }
    }
}

/// f64 LayerNorm of an f64 row (no affine): what normalising the
/// UNROUNDED sum would give.
fn ln_f64(x: &[f64], eps: f64) -> Vec<f64> {
    let n = x.len() as f64;
    let mean = x.iter().sum::<f64>() / n;
    let var = x.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n;
    x.iter().map(|v| (v - mean) / (var + eps).sqrt()).collect()
}

#[test]
fn classic_bug_normalising_unrounded_sum_is_caught() {
    // residual ~ 1000 + small integers (f16 spacing 0.5 there), branch with
    // fine fractional bits in (-0.24, 0.24): rounding the sum moves each
    // element by up to 0.25 against a row spread of ~2, so LayerNorm of the
    // unrounded sum differs from LayerNorm of the rounded one by many ulps.
    let mut rng = Rng(0xB06);
    for &w in &WIDTHS {
        let rows = 37;
        let residual: Vec<f16> = (0..rows * w)
            .map(|_| f16::from_f64(1000.0 + (rng.below(7) as f64 - 3.0)))
            .collect();
        let branch: Vec<f16> = (0..rows * w)
            .map(|_| f16::from_f64((rng.unit() - 0.5) * 0.48))
            .collect();
        let case = Case {
            width: w,
            rows,
            residual,
            branch,
            gamma: None,
            beta: None,
            eps: 1e-5,
        };
        // The inputs really separate the two: count differing f16 outputs.
        let mut differ = 0;
        for r in 0..rows {
            let s = r * w..(r + 1) * w;
            let exact: Vec<f64> = case.residual[s.clone()]
                .iter()
                .zip(&case.branch[s.clone()])
                .map(|(a, b)| a.to_f64() + b.to_f64())
                .collect();
            let rounded: Vec<f64> = exact.iter().map(|&v| round_f16(v).to_f64()).collect();
            let (a, b) = (ln_f64(&exact, 1e-5), ln_f64(&rounded, 1e-5));
            differ += a
                .iter()
                .zip(&b)
                .filter(|(a, b)| f16::from_f64(**a) != f16::from_f64(**b))
                .count();
        }
        assert!(
            differ > rows * w / 2,
            "only {differ} of {} outputs differ",
            rows * w
        );
        for dev in devices() {
            for in_place in [false, true] {
                check(&dev, &case, in_place)
                    .unwrap_or_else(|e| panic!("{} w {w}: {e}", dev.info().name));
            }
            // And the y check rejects the unrounded normalisation: feed it
            // the unrounded-sum outputs as if a kernel had produced them.
            let (_, y) = run(&dev, &case, true).expect("launch");
            let mut rejected = 0;
            for r in 0..rows {
                let s = r * w..(r + 1) * w;
                let exact: Vec<f64> = case.residual[s.clone()]
                    .iter()
                    .zip(&case.branch[s.clone()])
                    .map(|(a, b)| a.to_f64() + b.to_f64())
                    .collect();
                let buggy: Vec<f16> = ln_f64(&exact, 1e-5)
                    .into_iter()
                    .map(f16::from_f64)
                    .collect();
                let rounded: Vec<f16> = exact.iter().map(|&v| round_f16(v)).collect();
                assert!(check_ln_row(&y[s], &rounded, None, None, 1e-5).is_ok());
                if check_ln_row(&buggy, &rounded, None, None, 1e-5).is_err() {
                    rejected += 1;
                }
            }
            assert_eq!(rejected, rows, "the bug must fail every row");
        }
    }
}

#[test]
fn in_place_and_out_of_place_agree_and_backends_agree() {
    // Within a backend, in place and out of place give the same bits.
    // Across backends the residual is bit-exact everywhere; `y` follows
    // `common::agrees_with_emulator` (the emulator, wave64, is the reference
    // even where the suite runs GPU-only).
    let case = make_case(11, 384, 77, 2.0, 1.0, 0.1, true, 0);
    let emu = Device::open(wavefuse::Choice::Cpu(wavefuse::Wave::W64)).expect("emulator");
    let reference = run(&emu, &case, true).expect("in place");
    let bits = |v: &[f16]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    for dev in devices() {
        let info = dev.info();
        let a = run(&dev, &case, true).expect("in place");
        let b = run(&dev, &case, false).expect("out of place");
        assert_eq!(bits(&a.0), bits(&b.0), "{}", info.name);
        assert_eq!(bits(&a.1), bits(&b.1), "{}", info.name);
        assert_eq!(bits(&a.0), bits(&reference.0), "{}: residual", info.name);
        let differ = common::agrees_with_emulator(info.backend, &info.name, &a.1, &reference.1);
        eprintln!(
            "{}: {differ} of {} y elements differ from the emulator",
            info.name,
            a.1.len()
        );
    }
}

#[test]
fn round_f16_reference_is_nearest_even() {
    // 1 + 2^-11 is a tie between 1 and 1 + 2^-10: even wins (1).
    assert_eq!(round_f16(1.0 + 2f64.powi(-11)), f16::ONE);
    assert_eq!(
        round_f16(1.0 + 3.0 * 2f64.powi(-11)),
        f16::from_f64(1.0 + 2.0 * 2f64.powi(-10))
    );
    assert_eq!(round_f16(65519.0), f16::MAX);
    assert_eq!(round_f16(65520.0), f16::INFINITY);
    // Subnormals: spacing 2^-24.
    assert_eq!(round_f16(1.4 * 2f64.powi(-24)).to_bits(), 1);
    assert_eq!(
        add_f16(f16::from_f32(60000.0), f16::from_f32(30000.0)),
        f16::INFINITY
    );
}

// ---- one test per bad input: each is rejected before any launch ----

fn cpu() -> Device {
    Device::open(wavefuse::Choice::Cpu(wavefuse::Wave::W64)).expect("cpu backend")
}

/// Fresh inputs of `n` elements: (residual, branch, y).
fn bufs(
    d: &Device,
    n: usize,
) -> (
    wavefuse::DeviceBuffer<f16>,
    wavefuse::DeviceBuffer<f16>,
    wavefuse::DeviceBuffer<f16>,
) {
    (
        d.upload(&vec![f16::ONE; n]).expect("upload"),
        d.upload(&vec![f16::ONE; n]).expect("upload"),
        d.upload(&vec![POISON; n]).expect("upload"),
    )
}

/// In-place `add_layer_norm` over whole buffers, no affine.
fn whole(
    d: &Device,
    r: &mut wavefuse::DeviceBuffer<f16>,
    b: &wavefuse::DeviceBuffer<f16>,
    y: &mut wavefuse::DeviceBuffer<f16>,
    width: usize,
    eps: f32,
) -> Result<(), Error> {
    add_layer_norm(
        d,
        &mut r.view_mut(),
        &b.view(),
        &mut y.view_mut(),
        width,
        None,
        eps,
    )
}

#[test]
fn rejects_unsupported_width() {
    let d = cpu();
    let (mut r, b, mut y) = bufs(&d, 512);
    let e = whole(&d, &mut r, &b, &mut y, 256, 1e-5);
    assert!(
        matches!(e, Err(Error::UnsupportedWidth { width: 256, .. })),
        "{e:?}"
    );
    // Nothing was written.
    assert!(
        r.download()
            .expect("download")
            .iter()
            .all(|v| *v == f16::ONE)
    );
}

#[test]
fn rejects_ragged_rows() {
    let d = cpu();
    let (mut r, b, mut y) = bufs(&d, 200);
    let e = whole(&d, &mut r, &b, &mut y, 192, 1e-5);
    assert!(
        matches!(e, Err(Error::RaggedRows { len: 200, .. })),
        "{e:?}"
    );
}

#[test]
fn rejects_empty_input() {
    let d = cpu();
    let (mut r, b, mut y) = bufs(&d, 0);
    let e = whole(&d, &mut r, &b, &mut y, 192, 1e-5);
    assert!(matches!(e, Err(Error::Empty { .. })), "{e:?}");
}

#[test]
fn rejects_branch_length_mismatch() {
    let d = cpu();
    let (mut r, _, mut y) = bufs(&d, 384);
    let b = d.upload(&vec![f16::ONE; 192]).expect("upload");
    let e = whole(&d, &mut r, &b, &mut y, 192, 1e-5);
    assert!(
        matches!(e, Err(Error::LengthMismatch { what: "branch", .. })),
        "{e:?}"
    );
}

#[test]
fn rejects_y_length_mismatch() {
    let d = cpu();
    let (mut r, b, _) = bufs(&d, 384);
    let mut y = d.alloc::<f16>(192).expect("alloc");
    let e = whole(&d, &mut r, &b, &mut y, 192, 1e-5);
    assert!(
        matches!(e, Err(Error::LengthMismatch { what: "y", .. })),
        "{e:?}"
    );
}

#[test]
fn rejects_residual_out_length_mismatch() {
    let d = cpu();
    let (r, b, mut y) = bufs(&d, 384);
    let mut o = d.alloc::<f16>(192).expect("alloc");
    let e = add_layer_norm_to(
        &d,
        &r.view(),
        &b.view(),
        &mut o.view_mut(),
        &mut y.view_mut(),
        192,
        None,
        1e-5,
    );
    assert!(
        matches!(
            e,
            Err(Error::LengthMismatch {
                what: "residual_out",
                ..
            })
        ),
        "{e:?}"
    );
}

#[test]
fn rejects_misaligned_residual_branch_y_and_residual_out() {
    let d = cpu();
    let n = 384;
    let (mut r, b, mut y) = bufs(&d, n + 1);
    let mut o = d.alloc::<f16>(n + 1).expect("alloc");
    {
        let mut rv = r.slice_mut(1..n + 1).expect("in range");
        let e = add_layer_norm(
            &d,
            &mut rv,
            &b.slice(0..n).expect("in range"),
            &mut y.slice_mut(0..n).expect("in range"),
            192,
            None,
            1e-5,
        );
        assert!(
            matches!(
                e,
                Err(Error::Misaligned {
                    what: "residual",
                    ..
                })
            ),
            "{e:?}"
        );
    }
    {
        let mut rv = r.slice_mut(0..n).expect("in range");
        let e = add_layer_norm(
            &d,
            &mut rv,
            &b.slice(1..n + 1).expect("in range"),
            &mut y.slice_mut(0..n).expect("in range"),
            192,
            None,
            1e-5,
        );
        assert!(
            matches!(e, Err(Error::Misaligned { what: "branch", .. })),
            "{e:?}"
        );
    }
    {
        let mut rv = r.slice_mut(0..n).expect("in range");
        let e = add_layer_norm(
            &d,
            &mut rv,
            &b.slice(0..n).expect("in range"),
            &mut y.slice_mut(1..n + 1).expect("in range"),
            192,
            None,
            1e-5,
        );
        assert!(
            matches!(e, Err(Error::Misaligned { what: "y", .. })),
            "{e:?}"
        );
    }
    let e = add_layer_norm_to(
        &d,
        &r.slice(0..n).expect("in range"),
        &b.slice(0..n).expect("in range"),
        &mut o.slice_mut(1..n + 1).expect("in range"),
        &mut y.slice_mut(0..n).expect("in range"),
        192,
        None,
        1e-5,
    );
    assert!(
        matches!(
            e,
            Err(Error::Misaligned {
                what: "residual_out",
                ..
            })
        ),
        "{e:?}"
    );
}

#[test]
fn rejects_bad_eps() {
    let d = cpu();
    let (mut r, b, mut y) = bufs(&d, 192);
    for eps in [-1e-5, f32::NAN, f32::INFINITY] {
        let e = whole(&d, &mut r, &b, &mut y, 192, eps);
        assert!(
            matches!(e, Err(Error::BadParameter { what: "eps", .. })),
            "{e:?}"
        );
    }
}

#[test]
fn rejects_bad_affine_lengths_and_alignment() {
    let d = cpu();
    let (mut r, b, mut y) = bufs(&d, 192);
    let g = d.upload(&vec![f16::ONE; 200]).expect("upload");
    let bt = d.upload(&vec![f16::ZERO; 192]).expect("upload");
    let (gv, bv) = (g.view(), bt.view());
    let e = add_layer_norm(
        &d,
        &mut r.view_mut(),
        &b.view(),
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
    let e = add_layer_norm(
        &d,
        &mut r.view_mut(),
        &b.view(),
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
    let (mut r, _, mut y) = bufs(&d1, 192);
    let b = d2.upload(&vec![f16::ONE; 192]).expect("upload");
    let e = whole(&d1, &mut r, &b, &mut y, 192, 1e-5);
    assert!(
        matches!(e, Err(Error::WrongDevice { what: "branch", .. })),
        "{e:?}"
    );
}
