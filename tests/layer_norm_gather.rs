//! LayerNorm fused with a token gather, on every backend present.
//!
//! Gathered rows are checked against the f64 LayerNorm of the source row
//! (tolerance of tests/fused/mod.rs: 1 f16 ulp or the f32 conditioning
//! term); padding rows must be exactly `+0.0` (also with affine); no element
//! may still hold POISON. The fused result must also equal, bit for bit,
//! `layer_norm` followed by `gather` (same numerics, one pass fewer).
mod common;
mod fused;

use common::{POISON, Rng, devices, halves};
use fused::{TABLE_KINDS, check_ln_row, table};
use half::f16;
use proptest::prelude::*;
use wavefuse::{Affine, Device, Error, GatherPlan, gather, layer_norm, layer_norm_gather};

const WIDTHS: [usize; 3] = [192, 384, 768];

struct Case {
    width: usize,
    n_src: usize,
    src: Vec<f16>,
    table: Vec<i32>,
    gamma: Option<Vec<f16>>,
    beta: Option<Vec<f16>>,
    eps: f32,
}

#[allow(clippy::too_many_arguments)]
fn make_case(
    seed: u64,
    width: usize,
    n_src: usize,
    n_out: usize,
    kind: u8,
    scale: f64,
    offset: f64,
    affine: bool,
    special: u8,
) -> Case {
    let mut rng = Rng(seed);
    let mut src = halves(&mut rng, n_src * width, scale, offset);
    for r in 0..n_src {
        let col = r * width + rng.below(width as u64) as usize;
        match (special, rng.below(5)) {
            (1, 0) => {
                let c = src[r * width];
                src[r * width..(r + 1) * width].fill(c);
            }
            (2, 0) => src[col] = f16::NAN,
            (2, 1) => src[col] = f16::INFINITY,
            (2, 2) => src[col] = f16::NEG_INFINITY,
            _ => {}
        }
    }
    let table = table(&mut rng, kind, n_out, n_src);
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
        n_src,
        src,
        table,
        gamma,
        beta,
        eps,
    }
}

/// Runs the fused op on `dev`; returns its output.
fn run(dev: &Device, c: &Case) -> Result<Vec<f16>, Error> {
    let plan = GatherPlan::new(dev, &c.table, c.n_src)?;
    let s = dev.upload(&c.src)?;
    let mut out = dev.upload(&vec![POISON; c.table.len() * c.width])?;
    let g = c.gamma.as_ref().map(|g| dev.upload(g)).transpose()?;
    let b = c.beta.as_ref().map(|b| dev.upload(b)).transpose()?;
    let (gv, bv) = (g.as_ref().map(|g| g.view()), b.as_ref().map(|b| b.view()));
    let affine = match (&gv, &bv) {
        (Some(gamma), Some(beta)) => Some(Affine { gamma, beta }),
        _ => None,
    };
    layer_norm_gather(
        dev,
        &plan,
        &s.view(),
        &mut out.view_mut(),
        c.width,
        affine,
        c.eps,
    )?;
    out.download()
}

/// The unfused reference path on `dev`: layer_norm, then gather.
fn run_unfused(dev: &Device, c: &Case) -> Result<Vec<f16>, Error> {
    let plan = GatherPlan::new(dev, &c.table, c.n_src)?;
    let s = dev.upload(&c.src)?;
    let mut normed = dev.upload(&vec![POISON; c.src.len()])?;
    let mut out = dev.upload(&vec![POISON; c.table.len() * c.width])?;
    let g = c.gamma.as_ref().map(|g| dev.upload(g)).transpose()?;
    let b = c.beta.as_ref().map(|b| dev.upload(b)).transpose()?;
    let (gv, bv) = (g.as_ref().map(|g| g.view()), b.as_ref().map(|b| b.view()));
    let affine = match (&gv, &bv) {
        (Some(gamma), Some(beta)) => Some(Affine { gamma, beta }),
        _ => None,
    };
    layer_norm(
        dev,
        &s.view(),
        &mut normed.view_mut(),
        c.width,
        affine,
        c.eps,
    )?;
    gather(dev, &plan, &normed.view(), &mut out.view_mut(), c.width)?;
    out.download()
}

fn check(dev: &Device, c: &Case) -> Result<f64, String> {
    let out = run(dev, c).map_err(|e| e.to_string())?;
    let w = c.width;
    let mut worst = 0.0f64;
    for (t, &i) in c.table.iter().enumerate() {
        let got = &out[t * w..(t + 1) * w];
        if i < 0 {
            if let Some(p) = got.iter().position(|v| v.to_bits() != 0) {
                return Err(format!("pad token {t} col {p}: {:#06x}", got[p].to_bits()));
            }
            continue;
        }
        let x = &c.src[i as usize * w..(i as usize + 1) * w];
        let e = check_ln_row(got, x, c.gamma.as_deref(), c.beta.as_deref(), c.eps)
            .map_err(|e| format!("token {t} (src {i}): {e}"))?;
        worst = worst.max(e);
    }
    // Same numerics as the unfused path, bit for bit (NaN rows as NaN).
    let unfused = run_unfused(dev, c).map_err(|e| e.to_string())?;
    for (j, (a, b)) in out.iter().zip(&unfused).enumerate() {
        if a.to_bits() != b.to_bits() && !(a.is_nan() && b.is_nan()) {
            return Err(format!("element {j}: fused {a}, layer_norm+gather {b}"));
        }
    }
    Ok(worst)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, .. ProptestConfig::default() })]

    #[test]
    fn matches_f64_oracle(
        seed in any::<u64>(),
        wi in 0usize..3,
        n_src in prop_oneof![1usize..4, 1usize..120],
        n_out in prop_oneof![1usize..4, 30usize..34, 60usize..100],
        kind in 0u8..TABLE_KINDS,
        log_scale in -3.0f64..4.7,
        offset_kind in 0u8..3,
        affine in any::<bool>(),
        special in 0u8..3,
    ) {
        let width = WIDTHS[wi];
        let scale = 10f64.powf(log_scale);
        let offset = match offset_kind { 0 => 0.0, 1 => 3.0 * scale, _ => -100.0 };
        let case = make_case(seed, width, n_src, n_out, kind, scale, offset, affine, special);
        for dev in devices() {
            let r = check(&dev, &case);
            prop_assert!(r.is_ok(), "{}: {}", dev.info().name, r.err().unwrap_or_default());
        }
    }
}

#[test]
fn window_partition_sized_tables_all_widths() {
    for (i, &w) in WIDTHS.iter().enumerate() {
        for affine in [false, true] {
            let case = make_case(0x1A6 + i as u64, w, 400, 517, 4, 1.0, 0.5, affine, 1);
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
fn backends_agree_bit_for_bit() {
    let case = make_case(5, 384, 50, 77, 3, 2.0, 1.0, true, 0);
    let outs: Vec<_> = devices()
        .iter()
        .map(|d| (d.info().name.clone(), run(d, &case).expect("launch")))
        .collect();
    for (name, o) in &outs[1..] {
        let same = o
            .iter()
            .zip(&outs[0].1)
            .all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same, "{name} differs from {}", outs[0].0);
    }
}

// ---- one test per bad input: each is rejected before any launch ----

fn cpu() -> Device {
    Device::open(wavefuse::Choice::Cpu(wavefuse::Wave::W64)).expect("cpu backend")
}

#[test]
fn rejects_unsupported_width() {
    let d = cpu();
    let p = GatherPlan::new(&d, &[0], 1).expect("valid");
    let s = d.upload(&vec![f16::ONE; 256]).expect("upload");
    let mut o = d.alloc::<f16>(256).expect("alloc");
    let e = layer_norm_gather(&d, &p, &s.view(), &mut o.view_mut(), 256, None, 1e-5);
    assert!(
        matches!(e, Err(Error::UnsupportedWidth { width: 256, .. })),
        "{e:?}"
    );
}

#[test]
fn rejects_ragged_src() {
    let d = cpu();
    let p = GatherPlan::new(&d, &[0], 1).expect("valid");
    let s = d.upload(&vec![f16::ONE; 200]).expect("upload");
    let mut o = d.alloc::<f16>(192).expect("alloc");
    let e = layer_norm_gather(&d, &p, &s.view(), &mut o.view_mut(), 192, None, 1e-5);
    assert!(
        matches!(e, Err(Error::RaggedRows { what: "src", .. })),
        "{e:?}"
    );
}

#[test]
fn rejects_src_with_wrong_token_count() {
    let d = cpu();
    let p = GatherPlan::new(&d, &[0], 1).expect("valid");
    let s = d.upload(&vec![f16::ONE; 2 * 192]).expect("upload");
    let mut o = d.alloc::<f16>(192).expect("alloc");
    let e = layer_norm_gather(&d, &p, &s.view(), &mut o.view_mut(), 192, None, 1e-5);
    assert!(
        matches!(
            e,
            Err(Error::LengthMismatch {
                what: "src (tokens)",
                ..
            })
        ),
        "{e:?}"
    );
}

#[test]
fn rejects_out_with_wrong_token_count() {
    let d = cpu();
    let p = GatherPlan::new(&d, &[0, -1], 1).expect("valid");
    let s = d.upload(&vec![f16::ONE; 192]).expect("upload");
    let mut o = d.alloc::<f16>(192).expect("alloc");
    let e = layer_norm_gather(&d, &p, &s.view(), &mut o.view_mut(), 192, None, 1e-5);
    assert!(
        matches!(
            e,
            Err(Error::LengthMismatch {
                what: "out (tokens)",
                ..
            })
        ),
        "{e:?}"
    );
}

#[test]
fn rejects_misaligned_src_and_out() {
    let d = cpu();
    let p = GatherPlan::new(&d, &[0], 1).expect("valid");
    let s = d.upload(&vec![f16::ONE; 193]).expect("upload");
    let mut o = d.alloc::<f16>(193).expect("alloc");
    let e = layer_norm_gather(
        &d,
        &p,
        &s.slice(1..193).expect("in range"),
        &mut o.slice_mut(0..192).expect("in range"),
        192,
        None,
        1e-5,
    );
    assert!(
        matches!(e, Err(Error::Misaligned { what: "src", .. })),
        "{e:?}"
    );
    let e = layer_norm_gather(
        &d,
        &p,
        &s.slice(0..192).expect("in range"),
        &mut o.slice_mut(1..193).expect("in range"),
        192,
        None,
        1e-5,
    );
    assert!(
        matches!(e, Err(Error::Misaligned { what: "out", .. })),
        "{e:?}"
    );
}

#[test]
fn rejects_bad_eps() {
    let d = cpu();
    let p = GatherPlan::new(&d, &[0], 1).expect("valid");
    let s = d.upload(&vec![f16::ONE; 192]).expect("upload");
    let mut o = d.alloc::<f16>(192).expect("alloc");
    for eps in [-1e-5, f32::NAN, f32::INFINITY] {
        let e = layer_norm_gather(&d, &p, &s.view(), &mut o.view_mut(), 192, None, eps);
        assert!(
            matches!(e, Err(Error::BadParameter { what: "eps", .. })),
            "{e:?}"
        );
    }
}

#[test]
fn rejects_bad_affine_lengths_and_alignment() {
    let d = cpu();
    let p = GatherPlan::new(&d, &[0], 1).expect("valid");
    let s = d.upload(&vec![f16::ONE; 192]).expect("upload");
    let mut o = d.alloc::<f16>(192).expect("alloc");
    let g = d.upload(&vec![f16::ONE; 200]).expect("upload");
    let b = d.upload(&vec![f16::ZERO; 193]).expect("upload");
    let (gv, bv) = (g.view(), b.slice(0..192).expect("in range"));
    let e = layer_norm_gather(
        &d,
        &p,
        &s.view(),
        &mut o.view_mut(),
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
    let bv = b.slice(1..193).expect("in range");
    let gv = g.slice(0..192).expect("in range");
    let e = layer_norm_gather(
        &d,
        &p,
        &s.view(),
        &mut o.view_mut(),
        192,
        Some(Affine {
            gamma: &gv,
            beta: &bv,
        }),
        1e-5,
    );
    assert!(
        matches!(e, Err(Error::Misaligned { what: "beta", .. })),
        "{e:?}"
    );
}

#[test]
fn rejects_plan_of_another_device() {
    let (d1, d2) = (cpu(), cpu());
    let p = GatherPlan::new(&d2, &[0], 1).expect("valid");
    let s = d1.upload(&vec![f16::ONE; 192]).expect("upload");
    let mut o = d1.alloc::<f16>(192).expect("alloc");
    let e = layer_norm_gather(&d1, &p, &s.view(), &mut o.view_mut(), 192, None, 1e-5);
    assert!(
        matches!(e, Err(Error::WrongDevice { what: "plan", .. })),
        "{e:?}"
    );
}
