//! Residual add + LayerNorm + gather (window partition) through the public
//! API on every backend present.
//!
//! `residual` must be updated bit-exactly (the f16 sum rounded once);
//! gathered rows are checked against the f64 LayerNorm of the ROUNDED sum
//! (tolerance of tests/fused/mod.rs); padding rows must be `+0.0`; no
//! output element may still hold POISON. The fused op must also equal,
//! bit for bit, `add_layer_norm_to` followed by `layer_norm_gather`.
mod common;
mod fused;

use common::{POISON, Rng, devices, halves};
use fused::{add_f16, check_ln_row, partition};
use half::f16;
use proptest::prelude::*;
use wavefuse::{
    Affine, Device, Error, GatherPlan, add_layer_norm_gather, add_layer_norm_to, layer_norm_gather,
};

const WIDTHS: [usize; 3] = [192, 384, 768];

struct Case {
    width: usize,
    n_src: usize,
    residual: Vec<f16>,
    branch: Vec<f16>,
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
    pad_per_16: u64,
    scale: f64,
    offset: f64,
    branch_rel: f64,
    affine: bool,
    special: u8,
) -> Case {
    let mut rng = Rng(seed);
    let n = n_src * width;
    let mut residual = halves(&mut rng, n, scale, offset);
    let mut branch = halves(&mut rng, n, scale * branch_rel, 0.0);
    for r in 0..n_src {
        let col = r * width + rng.below(width as u64) as usize;
        match (special, rng.below(4)) {
            (1, 0) => {
                let c = residual[r * width];
                residual[r * width..(r + 1) * width].fill(c);
                branch[r * width..(r + 1) * width].fill(f16::ZERO);
            }
            (2, 0) => residual[col] = f16::NAN,
            (2, 1) => branch[col] = f16::NEG_INFINITY,
            (2, 2) => {
                residual[col] = f16::from_f32(-60000.0);
                branch[col] = f16::from_f32(-30000.0);
            }
            _ => {}
        }
    }
    let table = partition(&mut rng, n_src, pad_per_16);
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
        residual,
        branch,
        table,
        gamma,
        beta,
        eps,
    }
}

/// Runs the fused op on `dev`; returns (updated residual, out).
fn run(dev: &Device, c: &Case) -> Result<(Vec<f16>, Vec<f16>), Error> {
    let plan = GatherPlan::new(dev, &c.table, c.n_src)?;
    let mut res = dev.upload(&c.residual)?;
    let br = dev.upload(&c.branch)?;
    let mut out = dev.upload(&vec![POISON; c.table.len() * c.width])?;
    let g = c.gamma.as_ref().map(|g| dev.upload(g)).transpose()?;
    let b = c.beta.as_ref().map(|b| dev.upload(b)).transpose()?;
    let (gv, bv) = (g.as_ref().map(|g| g.view()), b.as_ref().map(|b| b.view()));
    let affine = match (&gv, &bv) {
        (Some(gamma), Some(beta)) => Some(Affine { gamma, beta }),
        _ => None,
    };
    add_layer_norm_gather(
        dev,
        &plan,
        &mut res.view_mut(),
        &br.view(),
        &mut out.view_mut(),
        c.width,
        affine,
        c.eps,
    )?;
    Ok((res.download()?, out.download()?))
}

/// The unfused path on `dev`: add_layer_norm_to, then layer_norm_gather.
fn run_unfused(dev: &Device, c: &Case) -> Result<(Vec<f16>, Vec<f16>), Error> {
    let plan = GatherPlan::new(dev, &c.table, c.n_src)?;
    let res = dev.upload(&c.residual)?;
    let br = dev.upload(&c.branch)?;
    let mut sum = dev.upload(&vec![POISON; c.residual.len()])?;
    let mut normed = dev.upload(&vec![POISON; c.residual.len()])?;
    let mut out = dev.upload(&vec![POISON; c.table.len() * c.width])?;
    let g = c.gamma.as_ref().map(|g| dev.upload(g)).transpose()?;
    let b = c.beta.as_ref().map(|b| dev.upload(b)).transpose()?;
    let (gv, bv) = (g.as_ref().map(|g| g.view()), b.as_ref().map(|b| b.view()));
    let affine = match (&gv, &bv) {
        (Some(gamma), Some(beta)) => Some(Affine { gamma, beta }),
        _ => None,
    };
    add_layer_norm_to(
        dev,
        &res.view(),
        &br.view(),
        &mut sum.view_mut(),
        &mut normed.view_mut(),
        c.width,
        affine,
        c.eps,
    )?;
    layer_norm_gather(
        dev,
        &plan,
        &sum.view(),
        &mut out.view_mut(),
        c.width,
        affine,
        c.eps,
    )?;
    Ok((sum.download()?, out.download()?))
}

fn check(dev: &Device, c: &Case) -> Result<f64, String> {
    let (res, out) = run(dev, c).map_err(|e| e.to_string())?;
    let w = c.width;
    let want: Vec<f16> = c
        .residual
        .iter()
        .zip(&c.branch)
        .map(|(&a, &b)| add_f16(a, b))
        .collect();
    for (i, (g, r)) in res.iter().zip(&want).enumerate() {
        if g.to_bits() != r.to_bits() && !(g.is_nan() && r.is_nan()) {
            return Err(format!("residual[{i}] = {g}, want {r}"));
        }
    }
    let mut worst = 0.0f64;
    for (t, &i) in c.table.iter().enumerate() {
        let got = &out[t * w..(t + 1) * w];
        if i < 0 {
            if let Some(p) = got.iter().position(|v| v.to_bits() != 0) {
                return Err(format!("pad token {t} col {p}: {:#06x}", got[p].to_bits()));
            }
            continue;
        }
        let x = &want[i as usize * w..(i as usize + 1) * w];
        let e = check_ln_row(got, x, c.gamma.as_deref(), c.beta.as_deref(), c.eps)
            .map_err(|e| format!("token {t} (src {i}): {e}"))?;
        worst = worst.max(e);
    }
    let (res2, out2) = run_unfused(dev, c).map_err(|e| e.to_string())?;
    let same = |a: &[f16], b: &[f16]| {
        a.iter()
            .zip(b)
            .all(|(x, y)| x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()))
    };
    if !same(&res, &res2) || !same(&out, &out2) {
        return Err("fused and unfused paths differ".into());
    }
    Ok(worst)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, .. ProptestConfig::default() })]

    #[test]
    fn matches_f64_oracle(
        seed in any::<u64>(),
        wi in 0usize..3,
        n_src in prop_oneof![1usize..4, 1usize..100],
        pad_per_16 in prop_oneof![Just(0u64), 1u64..4, 10u64..15],
        log_scale in -3.0f64..4.7,
        offset_kind in 0u8..3,
        log_branch_rel in -3.0f64..0.5,
        affine in any::<bool>(),
        special in 0u8..3,
    ) {
        let width = WIDTHS[wi];
        let scale = 10f64.powf(log_scale);
        let offset = match offset_kind { 0 => 0.0, 1 => 3.0 * scale, _ => -100.0 };
        let case = make_case(
            seed, width, n_src, pad_per_16, scale, offset, 10f64.powf(log_branch_rel), affine, special,
        );
        for dev in devices() {
            let r = check(&dev, &case);
            prop_assert!(r.is_ok(), "{}: {}", dev.info().name, r.err().unwrap_or_default());
        }
    }
}

#[test]
fn window_partition_sized_all_widths() {
    for (i, &w) in WIDTHS.iter().enumerate() {
        for affine in [false, true] {
            let case = make_case(0xA1C + i as u64, w, 400, 3, 1.0, 0.5, 0.3, affine, 1);
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

// ---- one test per bad input: each is rejected before any launch ----

fn cpu() -> Device {
    Device::open(wavefuse::Choice::Cpu(wavefuse::Wave::W64)).expect("cpu backend")
}

/// Runs the op on 2 source tokens of 192 with `table`, `branch_len`
/// branch elements at `branch_off`, and `out_tokens` output tokens.
fn try_op(
    d: &Device,
    table: &[i32],
    width: usize,
    branch: (usize, usize),
    out_tokens: usize,
) -> wavefuse::Result<()> {
    let plan = GatherPlan::new(d, table, 2)?;
    let mut r = d.upload(&vec![f16::ONE; 2 * width])?;
    let b = d.upload(&vec![f16::ONE; branch.0 + branch.1])?;
    let mut o = d.alloc::<f16>(out_tokens * width)?;
    let bv = b.slice(branch.0..branch.0 + branch.1).expect("in range");
    add_layer_norm_gather(
        d,
        &plan,
        &mut r.view_mut(),
        &bv,
        &mut o.view_mut(),
        width,
        None,
        1e-5,
    )
}

#[test]
fn accepts_a_partition() {
    try_op(&cpu(), &[1, -1, 0], 192, (0, 384), 3).expect("valid");
}

#[test]
fn rejects_plan_with_a_repeated_source() {
    let e = try_op(&cpu(), &[1, -1, 1], 192, (0, 384), 3);
    assert!(
        matches!(e, Err(Error::BadParameter { what: "plan", .. })),
        "{e:?}"
    );
}

#[test]
fn rejects_plan_missing_a_source() {
    let e = try_op(&cpu(), &[1, -1, -1], 192, (0, 384), 3);
    assert!(
        matches!(e, Err(Error::BadParameter { what: "plan", .. })),
        "{e:?}"
    );
}

#[test]
fn rejects_unsupported_width() {
    let e = try_op(&cpu(), &[1, 0], 256, (0, 512), 2);
    assert!(
        matches!(e, Err(Error::UnsupportedWidth { width: 256, .. })),
        "{e:?}"
    );
}

#[test]
fn rejects_branch_length_mismatch() {
    let e = try_op(&cpu(), &[1, 0], 192, (0, 192), 2);
    assert!(
        matches!(e, Err(Error::LengthMismatch { what: "branch", .. })),
        "{e:?}"
    );
}

#[test]
fn rejects_misaligned_branch() {
    let e = try_op(&cpu(), &[1, 0], 192, (1, 384), 2);
    assert!(
        matches!(e, Err(Error::Misaligned { what: "branch", .. })),
        "{e:?}"
    );
}

#[test]
fn rejects_out_with_wrong_token_count() {
    let e = try_op(&cpu(), &[1, 0, -1], 192, (0, 384), 2);
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
fn rejects_branch_of_another_device() {
    let (d1, d2) = (cpu(), cpu());
    let plan = GatherPlan::new(&d1, &[1, 0], 2).expect("valid");
    let mut r = d1.upload(&vec![f16::ONE; 384]).expect("upload");
    let b = d2.upload(&vec![f16::ONE; 384]).expect("upload");
    let mut o = d1.alloc::<f16>(384).expect("alloc");
    let e = add_layer_norm_gather(
        &d1,
        &plan,
        &mut r.view_mut(),
        &b.view(),
        &mut o.view_mut(),
        192,
        None,
        1e-5,
    );
    assert!(
        matches!(e, Err(Error::WrongDevice { what: "branch", .. })),
        "{e:?}"
    );
}

#[test]
fn plan_reports_partition() {
    let d = cpu();
    let p = |t: &[i32], n| GatherPlan::new(&d, t, n).expect("valid").is_partition();
    assert!(p(&[2, -1, 0, 1], 3));
    assert!(!p(&[2, -1, 0, 0], 3));
    assert!(!p(&[2, -1, 0], 3));
    assert!(!p(&[-1], 1));
}
