//! Fused bias + mask + softmax through the public API on every backend
//! present, out of place and in place.
//!
//! Oracle: `z = (f32(S) + f32(mask)) + f32(bias)` formed as the contract
//! says (the f32 adds are part of it), then the softmax of each row of `z`
//! in f64. Tolerance: 1 f16 ulp (floored at the smallest normal's ulp, so
//! tiny probabilities are held to 2^-24 absolute). Rows with NaN, +inf, or
//! only -inf must be NaN everywhere (as `torch.softmax`).
#[macro_use]
mod common;

use common::{POISON, Rng, cpu, devices, ulp_err};
use half::f16;
use proptest::prelude::*;
use wavefuse::{
    AttnBias, AttnMask, Choice, Device, Error, Wave, WindowTable, bias_mask_softmax,
    bias_mask_softmax_inplace,
};

const T: usize = 144;
const TT: usize = T * T;

struct Case {
    heads: usize,
    s: Vec<f16>,
    bias: Vec<f16>,
    ty: Vec<i32>,
    n_types: usize,
    mask: Option<(Vec<f16>, Vec<i32>, usize)>,
}

/// `special`: 0 none, 1 NaN / ±inf / fully masked rows, 2 large scores.
fn make_case(
    seed: u64,
    windows: usize,
    heads: usize,
    n_types: usize,
    slots: Option<usize>,
    scale: f64,
    special: u8,
) -> Case {
    let mut rng = Rng(seed);
    let mut s = rng.halves(windows * heads * TT, scale, 0.0);
    let rows = windows * heads * T;
    if special == 1 {
        for r in 0..rows {
            let row = &mut s[r * T..(r + 1) * T];
            match rng.below(12) {
                0 => row[rng.below(T as u64) as usize] = f16::NAN,
                1 => row[rng.below(T as u64) as usize] = f16::INFINITY,
                2 => row.fill(f16::NEG_INFINITY), // fully masked: NaN
                3 => {
                    // All but one masked: that one gets probability 1.
                    row.fill(f16::NEG_INFINITY);
                    row[rng.below(T as u64) as usize] = f16::from_f32(1.5);
                }
                4 => {
                    for v in row.iter_mut() {
                        if rng.below(2) == 0 {
                            *v = f16::NEG_INFINITY;
                        }
                    }
                }
                5 => row.fill(f16::from_f32(3.0)), // constant row: uniform
                _ => {}
            }
        }
    }
    if special == 2 {
        for v in s.iter_mut() {
            if rng.below(100) == 0 {
                *v = f16::from_f32(60000.0 * (rng.unit() as f32 - 0.5));
            }
        }
    }
    let bias = rng.halves(n_types * heads * TT, 1.0, 0.0);
    let ty = (0..windows)
        .map(|_| rng.below(n_types as u64) as i32)
        .collect();
    let mask = slots.map(|n| {
        let m = (0..n * TT)
            .map(|_| {
                if rng.below(3) == 0 {
                    f16::from_f32(-100.0)
                } else {
                    f16::ZERO
                }
            })
            .collect();
        let sl = (0..windows).map(|_| rng.below(n as u64) as i32).collect();
        (m, sl, n)
    });
    Case {
        heads,
        s,
        bias,
        ty,
        n_types,
        mask,
    }
}

/// Runs the kernel, in place or not; returns the probabilities.
fn run(dev: &Device, c: &Case, inplace: bool) -> Result<Vec<f16>, String> {
    let e = |e: Error| e.to_string();
    let bd = dev.upload(&c.bias).map_err(e)?;
    let ty = WindowTable::new(dev, &c.ty, c.n_types).map_err(e)?;
    let (md, sl) = match &c.mask {
        Some((m, sl, n)) => (
            Some(dev.upload(m).map_err(e)?),
            Some(WindowTable::new(dev, sl, *n).map_err(e)?),
        ),
        None => (None, None),
    };
    let bv = bd.view();
    let mv = md.as_ref().map(|m| m.view());
    let mask = match (&mv, &sl) {
        (Some(mask), Some(slot)) => Some(AttnMask { mask, slot }),
        _ => None,
    };
    let ab = AttnBias {
        bias: &bv,
        ty: &ty,
        mask,
    };
    let mut sd = dev.upload(&c.s).map_err(e)?;
    if inplace {
        bias_mask_softmax_inplace(dev, &mut sd.view_mut(), c.heads, T, &ab).map_err(e)?;
        sd.download().map_err(e)
    } else {
        let mut p = dev.upload(&vec![POISON; c.s.len()]).map_err(e)?;
        bias_mask_softmax(dev, &sd.view(), &mut p.view_mut(), c.heads, T, &ab).map_err(e)?;
        let after = sd.download().map_err(e)?;
        if after
            .iter()
            .zip(&c.s)
            .any(|(a, b)| a.to_bits() != b.to_bits())
        {
            return Err("scores modified by the out-of-place softmax".into());
        }
        p.download().map_err(e)
    }
}

/// The f64 softmax of row `r` of `z` (formed in f32 as the contract says);
/// `None` where the row is NaN everywhere.
fn oracle_row(c: &Case, r: usize) -> Option<Vec<f64>> {
    let tile = r / T;
    let (w, h, i) = (tile / c.heads, tile % c.heads, r % T);
    let z: Vec<f64> = (0..T)
        .map(|j| {
            let s = c.s[r * T + j].to_f32();
            let b = c.bias[((c.ty[w] as usize * c.heads + h) * T + i) * T + j].to_f32();
            let m = c.mask.as_ref().map_or(0.0, |(m, sl, _)| {
                m[(sl[w] as usize * T + i) * T + j].to_f32()
            });
            let z = if c.mask.is_some() { (s + m) + b } else { s + b };
            z as f64
        })
        .collect();
    let mx = z.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    if z.iter().any(|v| v.is_nan()) || mx == f64::INFINITY || mx == f64::NEG_INFINITY {
        return None;
    }
    let e: Vec<f64> = z.iter().map(|v| (v - mx).exp()).collect();
    let sum: f64 = e.iter().sum();
    Some(e.iter().map(|v| v / sum).collect())
}

fn check(dev: &Device, c: &Case, inplace: bool) -> Result<f64, String> {
    let out = run(dev, c, inplace)?;
    let mut worst = 0.0f64;
    for r in 0..c.s.len() / T {
        let want = oracle_row(c, r);
        for j in 0..T {
            let got = out[r * T + j];
            let at = format!("{} (inplace {inplace}) row {r} col {j}", dev.info().name);
            match &want {
                None => {
                    if !got.is_nan() {
                        return Err(format!("{at}: want NaN, got {got}"));
                    }
                }
                Some(p) => {
                    if got.to_bits() == POISON.to_bits() {
                        return Err(format!("{at}: not written"));
                    }
                    let e = ulp_err(got, p[j]);
                    if e > 1.0 {
                        return Err(format!("{at}: got {got} want {:e} ({e:.3} ulp)", p[j]));
                    }
                    worst = worst.max(e);
                }
            }
        }
    }
    Ok(worst)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, .. ProptestConfig::default() })]

    #[test]
    fn matches_f64_oracle(
        seed in any::<u64>(),
        windows in 1usize..3,
        heads in 1usize..3,
        n_types in 1usize..3,
        slots in prop_oneof![Just(None), (1usize..3).prop_map(Some)],
        log_scale in -1.0f64..1.5,
        special in 0u8..3,
        inplace in any::<bool>(),
    ) {
        let c = make_case(seed, windows, heads, n_types, slots, 10f64.powf(log_scale), special);
        for dev in devices() {
            let r = check(&dev, &c, inplace);
            prop_assert!(r.is_ok(), "{}", r.err().unwrap_or_default());
        }
    }
}

#[test]
fn pangu_heads_in_place_and_out_of_place() {
    // 6 heads, 3 windows: 2592 rows = 20.25 workgroups (a partial last one).
    let c = make_case(21, 3, 6, 2, Some(2), 3.0, 1);
    for dev in devices() {
        for inplace in [false, true] {
            let w = check(&dev, &c, inplace).unwrap_or_else(|e| panic!("{e}"));
            eprintln!("{} inplace {inplace}: worst {w:.3} ulp", dev.info().name);
        }
    }
}

#[test]
fn fully_masked_rows_are_nan_like_torch() {
    // Every score -inf: softmax of an all -inf row is NaN in PyTorch.
    let mut c = make_case(1, 1, 1, 1, Some(1), 1.0, 0);
    c.s.fill(f16::NEG_INFINITY);
    for dev in devices() {
        let out = run(&dev, &c, false).expect("launch");
        assert!(out.iter().all(|v| v.is_nan()), "{}", dev.info().name);
    }
}

/// The emulator's wave64 and wave32 modes agree bit for bit (same source,
/// same order). A GPU computes `exp` with its hardware `exp2` (a few f32
/// ulps from the host's `exp2f`), so it must agree with the emulator
/// within 1 f16 ulp, and bit for bit on most elements.
#[test]
fn backends_agree() {
    let c = make_case(8, 2, 2, 2, Some(1), 2.0, 1);
    let outs: Vec<_> = devices()
        .iter()
        .map(|d| (d.info().clone(), run(d, &c, false).expect("launch")))
        .collect();
    // The emulator is the reference even where the suite runs GPU-only.
    let emu = wavefuse::Device::open(wavefuse::Choice::Cpu(wavefuse::Wave::W64)).expect("emulator");
    let cpu = (emu.info().clone(), run(&emu, &c, false).expect("launch"));
    for (info, o) in &outs {
        let mut differ = 0usize;
        for (i, (a, b)) in o.iter().zip(&cpu.1).enumerate() {
            if a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()) {
                continue;
            }
            differ += 1;
            assert!(
                info.backend != wavefuse::BackendKind::Cpu,
                "{} differs from {} at {i}: {a} vs {b}",
                info.name,
                cpu.0.name
            );
            let e = common::ulp_err(*a, b.to_f64());
            assert!(
                e <= 1.0,
                "{} at {i}: {a} vs emulator {b} ({e} ulp)",
                info.name
            );
        }
        eprintln!(
            "{}: {differ} of {} elements differ from the emulator (all within 1 ulp)",
            info.name,
            o.len()
        );
    }
}

#[test]
fn no_windows_is_a_no_op() {
    for dev in devices() {
        let mut s = dev.alloc::<f16>(0).expect("alloc");
        let mut p = dev.alloc::<f16>(0).expect("alloc");
        let b = dev.upload(&vec![f16::ONE; TT]).expect("upload");
        let t = WindowTable::new(&dev, &[], 1).expect("empty table");
        let bv = b.view();
        let ab = AttnBias {
            bias: &bv,
            ty: &t,
            mask: None,
        };
        bias_mask_softmax(&dev, &s.view(), &mut p.view_mut(), 1, T, &ab).expect("no-op");
        bias_mask_softmax_inplace(&dev, &mut s.view_mut(), 1, T, &ab).expect("no-op");
    }
}

/// `bias_mask_softmax` over one window: `s_len` scores, `bias` of `TT`
/// on `bias_dev`, probs of `p.1` at offset `p.0`, an optional mask of
/// `TT` with a slot table of bound `slots`, `tokens` per row.
fn try_softmax(
    d: &Device,
    bias_dev: &Device,
    s_len: usize,
    p: (usize, usize),
    slots: Option<usize>,
    heads: usize,
    tokens: usize,
) -> wavefuse::Result<()> {
    let s = d.upload(&vec![f16::ONE; s_len])?;
    let b = bias_dev.upload(&vec![f16::ONE; TT])?;
    let m = d.upload(&vec![f16::ZERO; TT])?;
    let mut out = d.upload(&vec![POISON; p.0 + p.1])?;
    let t = WindowTable::new(d, &[0], 1)?;
    let sl = WindowTable::new(d, &[0], slots.unwrap_or(1))?;
    let (bv, mv) = (b.view(), m.view());
    let ab = AttnBias {
        bias: &bv,
        ty: &t,
        mask: slots.map(|_| AttnMask {
            mask: &mv,
            slot: &sl,
        }),
    };
    let mut pv = out.slice_mut(p.0..p.0 + p.1).expect("in range");
    bias_mask_softmax(d, &s.view(), &mut pv, heads, tokens, &ab)?;
    panic!("accepted");
}

#[test]
fn rejects_bad_arguments_before_any_launch() {
    let (d, other) = (
        cpu(),
        Device::open(Choice::Cpu(Wave::W32)).expect("cpu backend"),
    );
    let mut s = d.upload(&vec![f16::ONE; TT]).expect("upload");
    let b = d.upload(&vec![f16::ONE; TT]).expect("upload");
    let t = WindowTable::new(&d, &[0], 1).expect("table");
    let bv = b.view();
    let ab = AttnBias {
        bias: &bv,
        ty: &t,
        mask: None,
    };
    rejects! {
        "tokens 8": try_softmax(&d, &d, 64, (0, 64), None, 1, 8)
            => Error::UnsupportedWidth { width: 8, .. },
        "heads 0 (in place)": bias_mask_softmax_inplace(&d, &mut s.view_mut(), 0, T, &ab)
            => Error::BadParameter { what: "heads", .. },
        "probs length": try_softmax(&d, &d, TT, (0, TT - 8), None, 1, T)
            => Error::LengthMismatch { what: "probs", .. },
        "mask length": try_softmax(&d, &d, TT, (0, TT), Some(2), 1, T)
            => Error::LengthMismatch { what: "mask", .. },
        "probs misaligned": try_softmax(&d, &d, TT, (4, TT), None, 1, T)
            => Error::Misaligned { what: "probs", .. },
        "bias of another device": try_softmax(&d, &other, TT, (0, TT), None, 1, T)
            => Error::WrongDevice { what: "bias", .. },
    }
    assert!(
        s.download()
            .expect("download")
            .iter()
            .all(|v| *v == f16::ONE)
    );
}
