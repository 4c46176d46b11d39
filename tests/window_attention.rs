//! Fused window attention through the public API on every backend present
//! (the emulator in wave32 runs NVIDIA's mma fragments, in wave64 AMD's
//! MFMA fragments; CUDA the tensor cores).
//!
//! Oracle: `oracle::attention_row`, the exact attention in f64 of the
//! inputs as the kernel sees them (q, k, v rounded `f16(x + b)` when a QKV
//! bias is given; the bias as f16; the mask in its tile form,
//! `RegionLabels::mask_tile` of the labels), held to the contract's bound
//! (about half an ulp of the output plus `2^-11 sum_j p_j |v_j - out|`
//! for the weights' f16 rounding, plus terms for the f32 sums and scores;
//! see `wavefuse::ops::window_attention`).
//! It guards every step a kernel change can break: the bias and mask
//! rows and strips, the scale and its f16 parts, the QKV bias, the
//! normalisation, the exact redo of non-finite strips, the mask mode and
//! its one-hot operands, the swizzled tiles, the output strip and the
//! launch split at 65,535 windows. Not caught here: the wave barrier
//! between the copy wait and the buffer reads (the
//! emulator's copies are synchronous); that is racecheck's. Rows with NaN
//! / +inf scores or only -inf must be NaN. Outputs are poisoned before
//! every launch.
mod common;

use common::{POISON, Rng, cpu, devices, oracle};
use half::f16;
use proptest::prelude::*;
use wavefuse::{
    Choice, Device, Error, RegionLabels, RegionMask, Wave, WindowAttention, WindowBias,
    WindowTable, window_attention, window_attention_split,
};

const T: usize = 144;
const D: usize = 32;

struct Case {
    windows: usize,
    p: WindowAttention,
    qkv: Vec<f16>,
    qkv_bias: Option<Vec<f16>>,
    bias: Vec<f16>,
    ty: Vec<i32>,
    n_types: usize,
    /// Region labels [slots, 144], window -> slot, slots.
    mask: Option<(Vec<i32>, Vec<i32>, usize)>,
}

/// Labels of `n` slots: each slot cut into 1 to 8 regions (one in four
/// into 9 to 27, more than the kernel's one-hot columns), every token in
/// a random one, labels spread over 0..144 (slot 0 a single region, like
/// Pangu's inner windows).
fn labels(rng: &mut Rng, n: usize) -> Vec<i32> {
    let mut l = Vec::with_capacity(n * T);
    for slot in 0..n {
        let regions = match slot {
            0 => 1,
            _ if rng.below(4) == 0 => 9 + rng.below(19),
            _ => 1 + rng.below(8),
        };
        l.extend((0..T).map(|_| 5 * rng.below(regions) as i32));
    }
    l
}

/// `special`: 0 none; 1 fully masked (-inf) bias rows, single-key rows,
/// random -inf and a NaN / +inf in the bias; 2 large scores.
#[allow(clippy::too_many_arguments)]
fn make_case(
    seed: u64,
    windows: usize,
    heads: usize,
    n_types: usize,
    slots: Option<usize>,
    sigma: f64,
    with_qkv_bias: bool,
    special: u8,
) -> Case {
    let mut rng = Rng(seed);
    let ch = heads * D;
    let mut qkv = rng.halves(windows * T * 3 * ch, sigma, 0.0);
    if special == 2 {
        for x in qkv.iter_mut() {
            if rng.below(50) == 0 {
                *x = f16::from_f64(40.0 * (rng.unit() - 0.5));
            }
        }
    }
    let qkv_bias = with_qkv_bias.then(|| rng.halves(3 * ch, 0.5, 0.0));
    let mut bias = rng.halves(n_types * heads * T * T, 1.0, 0.0);
    let ty = (0..windows)
        .map(|_| rng.below(n_types as u64) as i32)
        .collect();
    let mask = slots.map(|n| {
        let l = labels(&mut rng, n);
        let sl = (0..windows).map(|_| rng.below(n as u64) as i32).collect();
        (l, sl, n)
    });
    if special == 1 {
        for row in bias.chunks_mut(T) {
            match rng.below(40) {
                0 => row[rng.below(T as u64) as usize] = f16::NAN,
                1 => row[rng.below(T as u64) as usize] = f16::INFINITY,
                2 => row.fill(f16::NEG_INFINITY),
                3 => {
                    row.fill(f16::NEG_INFINITY);
                    row[rng.below(T as u64) as usize] = f16::ZERO;
                }
                4 => {
                    for x in row.iter_mut() {
                        if rng.below(2) == 0 {
                            *x = f16::NEG_INFINITY;
                        }
                    }
                }
                _ => {}
            }
        }
    }
    Case {
        windows,
        p: WindowAttention::new(heads),
        qkv,
        qkv_bias,
        bias,
        ty,
        n_types,
        mask,
    }
}

fn run(dev: &Device, c: &Case) -> Result<Vec<f16>, String> {
    run_with(dev, c, None)
}

/// [`run`] with `labels` in place of the case's (same slots).
fn run_with(dev: &Device, c: &Case, labels: Option<&RegionLabels>) -> Result<Vec<f16>, String> {
    run_split(dev, c, labels, usize::MAX)
}

/// [`run_with`] in launches of at most `per_launch` windows.
fn run_split(
    dev: &Device,
    c: &Case,
    labels: Option<&RegionLabels>,
    per_launch: usize,
) -> Result<Vec<f16>, String> {
    let e = |e: Error| e.to_string();
    let x = dev.upload(&c.qkv).map_err(e)?;
    let qb = c
        .qkv_bias
        .as_ref()
        .map(|b| dev.upload(b))
        .transpose()
        .map_err(e)?;
    let bd = dev.upload(&c.bias).map_err(e)?;
    let ty = WindowTable::new(dev, &c.ty, c.n_types).map_err(e)?;
    let (ld, sl) = match &c.mask {
        Some((l, sl, n)) => (
            Some(RegionLabels::new(dev, l, T).map_err(e)?),
            Some(WindowTable::new(dev, sl, *n).map_err(e)?),
        ),
        None => (None, None),
    };
    let (bv, qbv) = (bd.view(), qb.as_ref().map(|b| b.view()));
    let mask = match (&ld, &sl) {
        (Some(own), Some(slot)) => Some(RegionMask {
            labels: labels.unwrap_or(own),
            slot,
        }),
        _ => None,
    };
    let ab = WindowBias {
        bias: &bv,
        ty: &ty,
        mask,
    };
    let mut out = dev.upload(&vec![POISON; c.qkv.len() / 3]).map_err(e)?;
    window_attention_split(
        dev,
        &x.view(),
        qbv.as_ref(),
        &ab,
        &mut out.view_mut(),
        &c.p,
        per_launch,
    )
    .map_err(e)?;
    out.download().map_err(e)
}

/// q, k, v of (window, head) as the kernel sees them (bias added, rounded).
fn qkv_of(c: &Case, w: usize, h: usize) -> [Vec<Vec<f64>>; 3] {
    let ch = c.p.heads * D;
    [0, 1, 2].map(|part| {
        (0..T)
            .map(|t| {
                (0..D)
                    .map(|d| {
                        let i = part * ch + h * D + d;
                        let x = c.qkv[(w * T + t) * 3 * ch + i];
                        match &c.qkv_bias {
                            Some(b) => f16::from_f32(x.to_f32() + b[i].to_f32()).to_f64(),
                            None => x.to_f64(),
                        }
                    })
                    .collect()
            })
            .collect()
    })
}

/// Checks every output element; returns the worst error in units of the
/// allowed error.
fn check(dev: &Device, c: &Case) -> Result<f64, String> {
    let out = run(dev, c)?;
    let (heads, ch) = (c.p.heads, c.p.heads * D);
    let mut worst = 0.0f64;
    // The mask in its tile form (what PyTorch adds).
    let tile = c
        .mask
        .as_ref()
        .map(|(l, _, _)| RegionLabels::mask_tile(l, T).expect("tile"));
    for w in 0..c.windows {
        for h in 0..heads {
            let [q, k, v] = qkv_of(c, w, h);
            let ty = c.ty[w] as usize;
            for i in 0..T {
                let bias: Vec<f64> = (0..T)
                    .map(|j| c.bias[((ty * heads + h) * T + i) * T + j].to_f64())
                    .collect();
                let mask: Vec<f64> = (0..T)
                    .map(|j| match (&tile, &c.mask) {
                        (Some(m), Some((_, sl, _))) => m[(sl[w] as usize * T + i) * T + j].to_f64(),
                        _ => 0.0,
                    })
                    .collect();
                let want = oracle::attention_row(&q[i], &k, &v, c.p.scale as f64, &mask, &bias);
                for d in 0..D {
                    let got = out[(w * T + i) * ch + h * D + d];
                    let at = format!("{} window {w} head {h} row {i} ch {d}", dev.info().name);
                    match &want {
                        None => {
                            if !got.is_nan() {
                                return Err(format!("{at}: want NaN, got {got}"));
                            }
                        }
                        Some(r) => {
                            if got.to_bits() == POISON.to_bits() {
                                return Err(format!("{at}: not written"));
                            }
                            let err = (got.to_f64() - r.out[d]).abs() / r.tol[d];
                            if err.is_nan() || err > 1.0 {
                                return Err(format!(
                                    "{at}: got {got} want {:e} (error {:.3} of the bound {:e})",
                                    r.out[d], err, r.tol[d]
                                ));
                            }
                            worst = worst.max(err);
                        }
                    }
                }
            }
        }
    }
    Ok(worst)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, .. ProptestConfig::default() })]

    #[test]
    fn matches_f64_oracle(
        seed in any::<u64>(),
        windows in 1usize..3,
        heads in prop_oneof![Just(1usize), Just(2), Just(3)],
        n_types in 1usize..3,
        slots in prop_oneof![Just(None), (1usize..3).prop_map(Some)],
        log_sigma in -0.7f64..0.5,
        with_qkv_bias in any::<bool>(),
        special in 0u8..3,
        scale in prop_oneof![Just(None), Just(Some(1.0f32)), Just(Some(0.0625)), Just(Some(5.0)), Just(Some(1e-3))],
    ) {
        let mut c = make_case(seed, windows, heads, n_types, slots, 10f64.powf(log_sigma), with_qkv_bias, special);
        if let Some(s) = scale {
            c.p.scale = s;
        }
        for dev in devices() {
            let r = check(&dev, &c);
            prop_assert!(r.is_ok(), "{}", r.err().unwrap_or_default());
        }
    }
}

#[test]
fn pangu_heads_6_and_12() {
    for (heads, seed) in [(6, 31), (12, 32)] {
        let c = make_case(seed, 2, heads, 3, Some(2), 1.0, true, 0);
        for dev in devices() {
            let w = check(&dev, &c).unwrap_or_else(|e| panic!("{e}"));
            eprintln!(
                "{} {heads} heads: worst {w:.3} of the bound",
                dev.info().name
            );
        }
    }
}

#[test]
fn many_windows_with_types_in_runs() {
    // Types in runs as Pangu's longitude windows, coming back to an
    // earlier type.
    let windows = 19;
    let mut c = make_case(36, windows, 2, 3, Some(3), 1.0, false, 0);
    c.ty = (0..windows).map(|w| [0, 0, 0, 1, 1, 2, 0][w % 7]).collect();
    for dev in devices() {
        check(&dev, &c).unwrap_or_else(|e| panic!("{e}"));
    }
}

#[test]
fn launches_split_by_windows_give_the_same_outputs() {
    // More than 65,535 windows go in several launches on a (heads,
    // windows) grid, each with its windows' rows of qkv and out and its
    // entries of the tables: here 2 windows per launch (3 launches),
    // against one launch, bit for bit, with and without a mask.
    for (seed, slots) in [(41, Some(3)), (42, None)] {
        let mut c = make_case(seed, 5, 2, 3, slots, 1.0, true, 0);
        c.ty = vec![2, 0, 1, 1, 2];
        if let Some((_, sl, _)) = c.mask.as_mut() {
            *sl = vec![1, 2, 0, 2, 1];
        }
        for dev in devices() {
            let whole = run(&dev, &c).unwrap_or_else(|e| panic!("{e}"));
            let split = run_split(&dev, &c, None, 2).unwrap_or_else(|e| panic!("{e}"));
            let differ = whole
                .iter()
                .zip(&split)
                .filter(|(a, b)| a.to_bits() != b.to_bits())
                .count();
            assert_eq!(differ, 0, "{}: {differ} outputs differ", dev.info().name);
        }
    }
}

#[test]
fn pangu_mask_values_without_special_rows() {
    // The planner's masks (0 / -100, every row keeping its own region):
    // no NaN anywhere, and the bound holds at Pangu's magnitudes.
    let c = make_case(33, 3, 2, 2, Some(3), 1.5, false, 0);
    for dev in devices() {
        let out = run(&dev, &c).expect("launch");
        assert!(out.iter().all(|v| v.is_finite()), "{}", dev.info().name);
        check(&dev, &c).unwrap_or_else(|e| panic!("{e}"));
    }
}

#[test]
fn large_biases_keep_their_exact_scale() {
    // Every key equally likely although its bias is up to ~360: q is one
    // vector u, k_j = a_j u, and the bias cancels the score (bias_ij =
    // -scale q_i . k_j + N(0, 1)). The bias enters in units of 1 / scale
    // through two f16 parts; with the second part dropped (2^-13.2
    // relative at 1/sqrt(32)) an output went past the bound (1.11 of it at
    // the first one checked, emulator), against 0.05 of it for the kernel.
    let mut c = make_case(37, 1, 1, 1, None, 1.0, false, 0);
    let mut rng = Rng(38);
    let u: Vec<f16> = (0..D).map(|_| f16::from_f64(2.0 * rng.normal())).collect();
    for t in 0..T {
        let a = f16::from_f64(32.0 * (rng.unit() - 0.5));
        for (d, &ud) in u.iter().enumerate() {
            c.qkv[t * 3 * D + d] = ud;
            c.qkv[t * 3 * D + D + d] = f16::from_f64(a.to_f64() * ud.to_f64());
        }
    }
    let scale = c.p.scale as f64;
    for i in 0..T {
        for j in 0..T {
            let s: f64 = (0..D)
                .map(|d| c.qkv[i * 3 * D + d].to_f64() * c.qkv[j * 3 * D + D + d].to_f64())
                .sum();
            c.bias[i * T + j] = f16::from_f64(-scale * s + rng.normal());
        }
    }
    for dev in devices() {
        let w = check(&dev, &c).unwrap_or_else(|e| panic!("{e}"));
        eprintln!("{}: worst {w:.3} of the bound", dev.info().name);
    }
}

#[test]
fn masks_at_the_smallest_scales() {
    // Below about 2^-9.4 the mask in units of 1 / scale is no finite f16:
    // masked windows take the exact path; the bound holds either side.
    // Fails (emulator, each swapped in once) with the exact path's mask
    // dropped (at 2^-14) and with the one-hot sign flipped (at 2e-3).
    for (scale, seed) in [(1.0f32 / 16384.0, 41), (1e-3, 42), (2e-3, 43)] {
        let mut c = make_case(seed, 2, 2, 1, Some(3), 4.0, false, 0);
        c.p.scale = scale;
        // Both windows masked: 4 interleaved regions and 4 runs of 36.
        let labels = (0..3 * T)
            .map(|x| match x / T {
                0 => 0,
                1 => (x % T % 4) as i32,
                _ => (x % T / 36) as i32,
            })
            .collect();
        c.mask = Some((labels, vec![1, 2], 3));
        for dev in devices() {
            check(&dev, &c).unwrap_or_else(|e| panic!("scale {scale}: {e}"));
        }
    }
}

#[test]
fn every_label_decides_the_mask_mode() {
    // Windows whose labels differ only in their last pieces: all one
    // region but token 143 (window 0) or 128 (window 2), and eight regions
    // in tokens 0..8 with a ninth first at token 143 (window 1: more than
    // the one-hot columns). A mask mode read from fewer labels calls
    // windows 0 and 2 unmasked and window 1 one-hot. Fails (emulator, each
    // swapped in once) with the mode, or only its one-hot range check,
    // read from the first 128 labels (wave32).
    let mut c = make_case(44, 3, 2, 1, Some(3), 1.5, false, 0);
    let labels = (0..3 * T)
        .map(|x| match (x / T, x % T) {
            (0, 143) | (2, 128) => 1,
            (1, t) if t < 8 => t as i32,
            (1, 143) => 8,
            _ => 0,
        })
        .collect();
    c.mask = Some((labels, vec![0, 1, 2], 3));
    for dev in devices() {
        check(&dev, &c).unwrap_or_else(|e| panic!("{e}"));
    }
}

#[test]
fn fully_masked_rows_are_nan_like_torch() {
    // A label mask never masks a whole row; a bias row of -inf does.
    let mut c = make_case(34, 1, 1, 1, Some(1), 1.0, false, 0);
    c.bias[..T * 5].fill(f16::NEG_INFINITY); // rows 0..5 of the tile
    for dev in devices() {
        let out = run(&dev, &c).expect("launch");
        for (t, row) in out.chunks(D).enumerate() {
            assert_eq!(
                row.iter().all(|v| v.is_nan()),
                t < 5,
                "{} token {t}",
                dev.info().name
            );
        }
    }
}

#[test]
fn planner_labels_give_the_planner_masks() {
    // A shifted plan of 8 windows (2 x 2 x 2) whose masks cut windows on
    // every axis: the kernel with the planner's labels against the oracle
    // with the planner's own f32 mask tiles.
    use wavefuse_shared::window::{Grid3, Shift3, Window3, WindowPlan};
    let plan = WindowPlan::new(
        Grid3 { z: 4, h: 12, w: 24 },
        Window3 { z: 2, h: 6, w: 12 },
        Shift3 { z: 1, h: 3, w: 6 },
    )
    .expect("plan");
    let ms = plan.mask_slots();
    assert!(ms.n_slots > 1);
    let windows = plan.n_windows();
    let mut c = make_case(35, windows, 2, 1, Some(1), 1.5, true, 0);
    c.mask = Some((
        ms.slot_labels.clone(),
        ms.window_to_slot.clone(),
        ms.n_slots,
    ));
    assert_eq!(
        RegionLabels::mask_tile(&ms.slot_labels, T).expect("tile"),
        ms.slot_masks
            .iter()
            .map(|&m| f16::from_f32(m))
            .collect::<Vec<_>>()
    );
    for dev in devices() {
        check(&dev, &c).unwrap_or_else(|e| panic!("{e}"));
    }
}

// ---- one test per bad input: each is rejected before any launch ----

/// A valid one-window, one-head setup on `d`, then `f` with its parts.
fn with_setup(
    d: &Device,
    f: impl FnOnce(&wavefuse::DeviceBuffer<f16>, &WindowBias<'_>, &mut wavefuse::DeviceBuffer<f16>),
) {
    let x = d.upload(&vec![f16::ONE; T * 3 * D]).expect("upload");
    let b = d.upload(&vec![f16::ZERO; T * T]).expect("upload");
    let t = WindowTable::new(d, &[0], 1).expect("table");
    let mut o = d.alloc::<f16>(T * D).expect("alloc");
    let bv = b.view();
    let ab = WindowBias {
        bias: &bv,
        ty: &t,
        mask: None,
    };
    f(&x, &ab, &mut o);
}

fn reject(p: WindowAttention, want: impl Fn(&Error) -> bool) {
    let d = cpu();
    with_setup(&d, |x, ab, o| {
        let e = window_attention(&d, &x.view(), None, ab, &mut o.view_mut(), &p);
        assert!(e.as_ref().err().is_some_and(&want), "{e:?}");
    });
}

#[test]
fn rejects_head_dim_other_than_32() {
    let mut p = WindowAttention::new(1);
    p.head_dim = 64;
    reject(p, |e| {
        matches!(e, Error::UnsupportedWidth { width: 64, .. })
    });
}

#[test]
fn rejects_tokens_other_than_144() {
    let mut p = WindowAttention::new(1);
    p.tokens_per_window = 98;
    reject(p, |e| {
        matches!(e, Error::UnsupportedWidth { width: 98, .. })
    });
}

#[test]
fn rejects_zero_heads_and_scales_out_of_range() {
    reject(WindowAttention::new(0), |e| {
        matches!(e, Error::BadParameter { what: "heads", .. })
    });
    for scale in [f32::NAN, f32::INFINITY, 0.0, -0.125, 2e-5, 8.5] {
        let mut p = WindowAttention::new(1);
        p.scale = scale;
        reject(p, |e| {
            matches!(e, Error::BadParameter { what: "scale", .. })
        });
    }
}

#[test]
fn rejects_heads_disagreeing_with_the_lengths() {
    reject(WindowAttention::new(2), |e| {
        matches!(e, Error::LengthMismatch { what: "qkv", .. })
    });
}

#[test]
fn rejects_empty_qkv_for_a_window() {
    let d = cpu();
    let x = d.alloc::<f16>(0).expect("alloc");
    with_setup(&d, |_, ab, o| {
        let e = window_attention(
            &d,
            &x.view(),
            None,
            ab,
            &mut o.view_mut(),
            &WindowAttention::new(1),
        );
        assert!(
            matches!(e, Err(Error::LengthMismatch { what: "qkv", .. })),
            "{e:?}"
        );
    });
}

#[test]
fn no_windows_is_a_no_op() {
    for dev in devices() {
        let x = dev.alloc::<f16>(0).expect("alloc");
        let mut o = dev.alloc::<f16>(0).expect("alloc");
        let b = dev.upload(&vec![f16::ZERO; T * T]).expect("upload");
        let l = RegionLabels::new(&dev, &[0; T], T).expect("labels");
        let (t, sl) = (
            WindowTable::new(&dev, &[], 1).expect("empty table"),
            WindowTable::new(&dev, &[], 1).expect("empty table"),
        );
        let bv = b.view();
        for mask in [
            None,
            Some(RegionMask {
                labels: &l,
                slot: &sl,
            }),
        ] {
            let ab = WindowBias {
                bias: &bv,
                ty: &t,
                mask,
            };
            window_attention(
                &dev,
                &x.view(),
                None,
                &ab,
                &mut o.view_mut(),
                &WindowAttention::new(1),
            )
            .expect("no-op");
        }
    }
}

#[test]
fn rejects_output_of_the_wrong_length() {
    let d = cpu();
    let mut o = d.alloc::<f16>(T * D - 8).expect("alloc");
    with_setup(&d, |x, ab, _| {
        let e = window_attention(
            &d,
            &x.view(),
            None,
            ab,
            &mut o.view_mut(),
            &WindowAttention::new(1),
        );
        assert!(
            matches!(e, Err(Error::LengthMismatch { what: "out", .. })),
            "{e:?}"
        );
    });
}

#[test]
fn rejects_qkv_bias_and_bias_and_mask_of_the_wrong_length() {
    let d = cpu();
    let qb = d.upload(&[f16::ZERO; 3 * D - 8]).expect("upload");
    with_setup(&d, |x, ab, o| {
        let e = window_attention(
            &d,
            &x.view(),
            Some(&qb.view()),
            ab,
            &mut o.view_mut(),
            &WindowAttention::new(1),
        );
        assert!(
            matches!(
                e,
                Err(Error::LengthMismatch {
                    what: "qkv_bias",
                    ..
                })
            ),
            "{e:?}"
        );
    });
    let b = d.upload(&vec![f16::ZERO; T * T]).expect("upload");
    let t2 = WindowTable::new(&d, &[0], 2).expect("table");
    with_setup(&d, |x, _, o| {
        let bv = b.view();
        let ab = WindowBias {
            bias: &bv,
            ty: &t2,
            mask: None,
        };
        let e = window_attention(
            &d,
            &x.view(),
            None,
            &ab,
            &mut o.view_mut(),
            &WindowAttention::new(1),
        );
        assert!(
            matches!(e, Err(Error::LengthMismatch { what: "bias", .. })),
            "{e:?}"
        );
    });
    let sl = WindowTable::new(&d, &[1], 2).expect("table");
    // One slot of labels for a table of two slots, then labels of 72 tokens.
    let l1 = RegionLabels::new(&d, &[0; T], T).expect("labels");
    let l72 = RegionLabels::new(&d, &[0; 144], 72).expect("labels");
    for (labels, got, expected) in [(&l1, T, 2 * T), (&l72, 72, T)] {
        with_setup(&d, |x, ab, o| {
            let ab = WindowBias {
                mask: Some(RegionMask { labels, slot: &sl }),
                ..*ab
            };
            let e = window_attention(
                &d,
                &x.view(),
                None,
                &ab,
                &mut o.view_mut(),
                &WindowAttention::new(1),
            );
            assert!(
                matches!(e, Err(Error::LengthMismatch { what: "labels", got: g, expected: x, .. }) if g == got && x == expected),
                "{e:?}"
            );
        });
    }
}

#[test]
fn rejects_bad_region_labels() {
    let d = cpu();
    let bad = |r: Result<RegionLabels, Error>, what: &str| {
        assert!(
            matches!(&r, Err(Error::BadParameter { what: w, .. }) if *w == what),
            "{r:?}"
        );
    };
    let mut l = vec![0i32; 2 * T];
    l[T + 7] = T as i32;
    bad(RegionLabels::new(&d, &l, T), "labels");
    l[T + 7] = -1;
    bad(RegionLabels::new(&d, &l, T), "labels");
    bad(RegionLabels::new(&d, &[], T), "labels");
    bad(RegionLabels::new(&d, &[0; T + 1], T), "labels");
    bad(RegionLabels::new(&d, &[0; T], 0), "tokens");
    let ok = RegionLabels::new(&d, &[3; 2 * T], T).expect("labels");
    assert_eq!((ok.slots(), ok.tokens()), (2, T));
    // A mask tile that is not a region mask has no labels.
    let mut m = RegionLabels::mask_tile(&labels(&mut Rng(37), 2), T)
        .expect("tile")
        .iter()
        .map(|v| v.to_f32())
        .collect::<Vec<_>>();
    m[T * T + 5 * T + 9] = if m[T * T + 5 * T + 9] == 0.0 {
        -100.0
    } else {
        0.0
    };
    bad(RegionLabels::from_mask(&d, &m, T), "mask");
    m[T * T + 5 * T + 9] = -50.0;
    bad(RegionLabels::from_mask(&d, &m, T), "mask");
    bad(RegionLabels::from_mask(&d, &m[..T * T - 1], T), "mask");
    // A query outside every region (its row all -100).
    let mut m = vec![0.0f32; T * T];
    m[3 * T..4 * T].fill(-100.0);
    bad(RegionLabels::from_mask(&d, &m, T), "mask");
    bad(RegionLabels::from_mask(&d, &m, 0), "tokens");
}

#[test]
fn labels_from_a_region_mask_give_the_same_attention() {
    // Labels read back from the tile form (first token of each region)
    // differ from the originals but give the same mask, hence the same
    // bits out of the kernel.
    let c = make_case(38, 3, 1, 1, Some(4), 1.0, false, 0);
    let Some((l, _, _)) = &c.mask else {
        unreachable!()
    };
    let tile: Vec<f32> = RegionLabels::mask_tile(l, T)
        .expect("tile")
        .iter()
        .map(|v| v.to_f32())
        .collect();
    for dev in devices() {
        let from = RegionLabels::from_mask(&dev, &tile, T).expect("a region mask");
        assert_eq!((from.slots(), from.tokens()), (4, T));
        let a = run(&dev, &c).expect("launch");
        let b = run_with(&dev, &c, Some(&from)).expect("launch");
        assert!(
            a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()),
            "{}",
            dev.info().name
        );
    }
}

#[test]
fn rejects_misaligned_output() {
    let d = cpu();
    let mut o = d.alloc::<f16>(T * D + 4).expect("alloc");
    with_setup(&d, |x, ab, _| {
        let mut ov = o.slice_mut(4..T * D + 4).expect("slice");
        let e = window_attention(&d, &x.view(), None, ab, &mut ov, &WindowAttention::new(1));
        assert!(
            matches!(e, Err(Error::Misaligned { what: "out", .. })),
            "{e:?}"
        );
    });
}

#[test]
fn rejects_buffers_of_another_device() {
    let d = cpu();
    let other = Device::open(Choice::Cpu(Wave::W32)).expect("cpu backend");
    let x = other.upload(&vec![f16::ONE; T * 3 * D]).expect("upload");
    with_setup(&d, |_, ab, o| {
        let e = window_attention(
            &d,
            &x.view(),
            None,
            ab,
            &mut o.view_mut(),
            &WindowAttention::new(1),
        );
        assert!(
            matches!(e, Err(Error::WrongDevice { what: "qkv", .. })),
            "{e:?}"
        );
    });
}

#[test]
fn rejects_output_overlapping_the_input() {
    let d = cpu();
    let x = d.upload(&vec![f16::ONE; T * 3 * D]).expect("upload");
    let ptr = x.device_ptr();
    // SAFETY: both spans lie in `x`, which outlives the views; the overlap
    // is what is being rejected (nothing is launched).
    let (xin, mut out) = unsafe {
        (
            wavefuse::View::<f16>::from_raw(&d, ptr, T * 3 * D).expect("view"),
            wavefuse::ViewMut::<f16>::from_raw(&d, ptr + (T * 2 * D * 2) as u64, T * D)
                .expect("view"),
        )
    };
    let b = d.upload(&vec![f16::ZERO; T * T]).expect("upload");
    let t = WindowTable::new(&d, &[0], 1).expect("table");
    let bv = b.view();
    let ab = WindowBias {
        bias: &bv,
        ty: &t,
        mask: None,
    };
    let e = window_attention(&d, &xin, None, &ab, &mut out, &WindowAttention::new(1));
    assert!(matches!(e, Err(Error::Aliasing { .. })), "{e:?}");
}
