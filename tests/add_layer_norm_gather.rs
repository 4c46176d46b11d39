//! Residual add + LayerNorm + gather (window partition) through the public
//! API on every backend present.
//!
//! `residual` must be updated bit-exactly (the f16 sum rounded once);
//! gathered rows are checked against the f64 LayerNorm of the ROUNDED sum
//! (`check_ln_row`: one f16 ulp, no conditioning term; the sums are drawn
//! ill-conditioned often, `common::rows::add_inputs`); padding rows must
//! be `+0.0`; no output element may still hold POISON. The fused op must
//! also equal, bit for bit, `add_layer_norm_to` followed by
//! `layer_norm_gather`.
#[macro_use]
mod common;
mod fused;

use common::rows::{AFFINE_KINDS, add_inputs, eps};
use common::{POISON, Rng, check_ln_row, cpu, devices};
use fused::{add_affine, add_f16, partition};
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

fn make_case(
    seed: u64,
    width: usize,
    n_src: usize,
    pad_per_16: u64,
    affine_kind: Option<u8>,
) -> Case {
    let mut rng = Rng(seed);
    let (residual, branch) = add_inputs(&mut rng, n_src, width);
    let table = partition(&mut rng, n_src, pad_per_16);
    let eps = eps(&mut rng);
    let (gamma, beta) = add_affine(&mut rng, affine_kind, &residual, &branch, width, eps);
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
    fn within_one_ulp_of_f64(
        seed in any::<u64>(),
        wi in 0usize..3,
        n_src in prop_oneof![1usize..4, 1usize..100],
        pad_per_16 in prop_oneof![Just(0u64), 1u64..4, 10u64..15],
        affine_kind in prop_oneof![Just(None), (0..AFFINE_KINDS).prop_map(Some)],
    ) {
        let case = make_case(seed, WIDTHS[wi], n_src, pad_per_16, affine_kind);
        for dev in devices() {
            let r = check(&dev, &case);
            prop_assert!(r.is_ok(), "{}: {}", dev.info().name, r.err().unwrap_or_default());
        }
    }
}

#[test]
fn window_partition_sized_all_widths() {
    for (i, &w) in WIDTHS.iter().enumerate() {
        for affine_kind in [None, Some(0), Some(2)] {
            let case = make_case(0xA1C + i as u64, w, 400, 3, affine_kind);
            for dev in devices() {
                let worst =
                    check(&dev, &case).unwrap_or_else(|e| panic!("{}: {e}", dev.info().name));
                eprintln!(
                    "width {w} affine {affine_kind:?} {}: worst {worst:.2} ulp",
                    dev.info().name
                );
            }
        }
    }
}

#[test]
fn empty_table_is_a_no_op() {
    for dev in devices() {
        let plan = GatherPlan::new(&dev, &[], 0).expect("empty plan");
        assert!(plan.is_partition());
        let mut r = dev.alloc::<f16>(0).expect("alloc");
        let b = dev.alloc::<f16>(0).expect("alloc");
        let mut o = dev.alloc::<f16>(0).expect("alloc");
        add_layer_norm_gather(
            &dev,
            &plan,
            &mut r.view_mut(),
            &b.view(),
            &mut o.view_mut(),
            192,
            None,
            1e-5,
        )
        .expect("no-op");
    }
}

/// Runs the op on 2 source tokens of `width` with `table`, `branch.1`
/// branch elements at offset `branch.0`, and `out_tokens` output tokens;
/// `dev_b` holds the branch.
fn try_op(
    d: &Device,
    dev_b: &Device,
    table: &[i32],
    width: usize,
    branch: (usize, usize),
    out_tokens: usize,
) -> wavefuse::Result<()> {
    let plan = GatherPlan::new(d, table, 2)?;
    let mut r = d.upload(&vec![f16::ONE; 2 * width])?;
    let b = dev_b.upload(&vec![f16::ONE; branch.0 + branch.1])?;
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
fn rejects_bad_arguments_before_any_launch() {
    let (d, other) = (cpu(), cpu());
    try_op(&d, &d, &[1, -1, 0], 192, (0, 384), 3).expect("a partition is valid");
    rejects! {
        "repeated source": try_op(&d, &d, &[1, -1, 1], 192, (0, 384), 3)
            => Error::BadParameter { what: "plan", .. },
        "missing source": try_op(&d, &d, &[1, -1, -1], 192, (0, 384), 3)
            => Error::BadParameter { what: "plan", .. },
        "width 256": try_op(&d, &d, &[1, 0], 256, (0, 512), 2)
            => Error::UnsupportedWidth { width: 256, .. },
        "branch length": try_op(&d, &d, &[1, 0], 192, (0, 192), 2)
            => Error::LengthMismatch { what: "branch", .. },
        "branch misaligned": try_op(&d, &d, &[1, 0], 192, (1, 384), 2)
            => Error::Misaligned { what: "branch", .. },
        "out tokens": try_op(&d, &d, &[1, 0, -1], 192, (0, 384), 2)
            => Error::LengthMismatch { what: "out (tokens)", .. },
        "branch of another device": try_op(&d, &other, &[1, 0], 192, (0, 384), 2)
            => Error::WrongDevice { what: "branch", .. },
    }
}

#[test]
fn plan_reports_partition() {
    let d = cpu();
    let p = |t: &[i32], n| GatherPlan::new(&d, t, n).expect("valid").is_partition();
    assert!(p(&[2, -1, 0, 1], 3));
    assert!(!p(&[2, -1, 0, 0], 3));
    assert!(!p(&[2, -1, 0], 3));
    assert!(!p(&[-1], 1));
    assert!(p(&[], 0));
    assert!(p(&[-1, -1], 0));
}
