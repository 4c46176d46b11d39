//! LayerNorm fused with a token gather, on every backend present.
//!
//! Gathered rows are checked against the f64 LayerNorm of the source row
//! (`check_ln_row`: one f16 ulp, no conditioning term; see
//! tests/layer_norm.rs), over sources drawn ill-conditioned often
//! (`common::rows`); padding rows must be exactly `+0.0` (also with
//! affine); no element may still hold POISON. The fused result must also
//! equal, bit for bit, `layer_norm` followed by `gather` on the same
//! backend (same numerics, one pass fewer); across backends it follows
//! `common::agrees_with_emulator`.
#[macro_use]
mod common;
mod fused;

use common::rows::{AFFINE_KINDS, affine, eps, ln_rows};
use common::{POISON, Rng, check_ln_row, cpu, devices};
use fused::{TABLE_KINDS, table};
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

fn make_case(
    seed: u64,
    width: usize,
    n_src: usize,
    n_out: usize,
    kind: u8,
    affine_kind: Option<u8>,
) -> Case {
    let mut rng = Rng(seed);
    let src = ln_rows(&mut rng, n_src, width, true);
    let table = table(&mut rng, kind, n_out, n_src);
    let eps = eps(&mut rng);
    let (gamma, beta) = match affine_kind {
        Some(k) => {
            let (g, b) = affine(&mut rng, k, &src, width, eps);
            (Some(g), Some(b))
        }
        None => (None, None),
    };
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
    fn within_one_ulp_of_f64(
        seed in any::<u64>(),
        wi in 0usize..3,
        n_src in prop_oneof![1usize..4, 1usize..120],
        n_out in prop_oneof![1usize..4, 30usize..34, 60usize..100],
        kind in 0u8..TABLE_KINDS,
        affine_kind in prop_oneof![Just(None), (0..AFFINE_KINDS).prop_map(Some)],
    ) {
        let case = make_case(seed, WIDTHS[wi], n_src, n_out, kind, affine_kind);
        for dev in devices() {
            let r = check(&dev, &case);
            prop_assert!(r.is_ok(), "{}: {}", dev.info().name, r.err().unwrap_or_default());
        }
    }
}

#[test]
fn window_partition_sized_tables_all_widths() {
    for (i, &w) in WIDTHS.iter().enumerate() {
        for affine_kind in [None, Some(0), Some(2)] {
            let case = make_case(0x1A6 + i as u64, w, 400, 517, 4, affine_kind);
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
fn backends_agree_with_the_emulator() {
    // 300 distinct source rows, each gathered about once (a shuffled
    // partition with padding): every backend against the wave64 emulator,
    // bit for bit except NVIDIA's one-ulp allowance.
    let w = 384;
    let mut rng = Rng(5);
    let src = ln_rows(&mut rng, 300, w, false);
    let table = fused::partition(&mut rng, 300, 2);
    let (gamma, beta) = affine(&mut rng, 0, &src, w, 1e-5);
    let case = Case {
        width: w,
        n_src: 300,
        src,
        table,
        gamma: Some(gamma),
        beta: Some(beta),
        eps: 1e-5,
    };
    let distinct: std::collections::HashSet<i32> =
        case.table.iter().copied().filter(|&i| i >= 0).collect();
    assert_eq!(distinct.len(), 300);
    let reference = run(&cpu(), &case).expect("emulator");
    for dev in devices() {
        let info = dev.info();
        let got = run(&dev, &case).expect("launch");
        let differ = common::agrees_with_emulator(info.backend, &info.name, &got, &reference);
        eprintln!(
            "{}: {differ} of {} elements differ from the emulator",
            info.name,
            reference.len()
        );
    }
}

#[test]
fn empty_table_is_a_no_op() {
    for dev in devices() {
        for n_src in [0, 3] {
            let plan = GatherPlan::new(&dev, &[], n_src).expect("empty plan");
            assert!(plan.is_empty());
            let s = dev.upload(&vec![f16::ONE; n_src * 192]).expect("upload");
            let mut o = dev.alloc::<f16>(0).expect("alloc");
            layer_norm_gather(&dev, &plan, &s.view(), &mut o.view_mut(), 192, None, 1e-5)
                .expect("no-op");
        }
    }
}

#[test]
fn rejects_bad_arguments_before_any_launch() {
    let d = cpu();
    let ones = |n: usize| d.upload(&vec![f16::ONE; n]).expect("upload");
    let (p1, p2) = (
        GatherPlan::new(&d, &[0], 1).expect("valid"),
        GatherPlan::new(&d, &[0, -1], 1).expect("valid"),
    );
    let other = GatherPlan::new(&cpu(), &[0], 1).expect("valid");
    let (s192, s200, s384, s193) = (ones(192), ones(200), ones(384), ones(193));
    let (g200, g193) = (ones(200), ones(193));
    let mut o = d.upload(&vec![POISON; 513]).expect("upload");
    let run = |p: &GatherPlan,
               s: &wavefuse::View<'_, f16>,
               o: &mut wavefuse::DeviceBuffer<f16>,
               (oo, on): (usize, usize),
               w: usize,
               eps: f32| {
        layer_norm_gather(
            &d,
            p,
            s,
            &mut o.slice_mut(oo..oo + on).expect("in range"),
            w,
            None,
            eps,
        )
    };
    let aff = |g: &wavefuse::View<'_, f16>,
               b: &wavefuse::View<'_, f16>,
               o: &mut wavefuse::DeviceBuffer<f16>| {
        layer_norm_gather(
            &d,
            &p1,
            &s192.view(),
            &mut o.slice_mut(0..192).expect("in range"),
            192,
            Some(Affine { gamma: g, beta: b }),
            1e-5,
        )
    };
    rejects! {
        "width 256": run(&p1, &ones(256).view(), &mut o, (0, 256), 256, 1e-5)
            => Error::UnsupportedWidth { width: 256, .. },
        "ragged src": run(&p1, &s200.view(), &mut o, (0, 192), 192, 1e-5)
            => Error::RaggedRows { what: "src", .. },
        "src tokens": run(&p1, &s384.view(), &mut o, (0, 192), 192, 1e-5)
            => Error::LengthMismatch { what: "src (tokens)", .. },
        "out tokens": run(&p2, &s192.view(), &mut o, (0, 192), 192, 1e-5)
            => Error::LengthMismatch { what: "out (tokens)", .. },
        "src misaligned": run(&p1, &s193.slice(1..193).expect("in range"), &mut o, (0, 192), 192, 1e-5)
            => Error::Misaligned { what: "src", .. },
        "out misaligned": run(&p1, &s192.view(), &mut o, (1, 192), 192, 1e-5)
            => Error::Misaligned { what: "out", .. },
        "eps < 0": run(&p1, &s192.view(), &mut o, (0, 192), 192, -1e-5)
            => Error::BadParameter { what: "eps", .. },
        "eps NaN": run(&p1, &s192.view(), &mut o, (0, 192), 192, f32::NAN)
            => Error::BadParameter { what: "eps", .. },
        "plan of another device": run(&other, &s192.view(), &mut o, (0, 192), 192, 1e-5)
            => Error::WrongDevice { what: "plan", .. },
        "gamma length": aff(&g200.view(), &s192.view(), &mut o)
            => Error::LengthMismatch { what: "gamma", .. },
        "beta misaligned": aff(&s192.view(), &g193.slice(1..193).expect("in range"), &mut o)
            => Error::Misaligned { what: "beta", .. },
    }
    assert!(
        o.download()
            .expect("download")
            .iter()
            .all(|v| v.to_bits() == POISON.to_bits())
    );
}
