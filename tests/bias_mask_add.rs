//! Scores += earth bias + shift mask through the public API on every
//! backend present.
//!
//! Oracle: `S + bias[type(w)] + mask[slot(w)]` in f64 from plain index
//! arithmetic; tolerance 1 f16 ulp plus the f32 term
//! `2^-23 * (|S + mask| + |sum|)` (the contract's f32 adds; negligible for
//! these inputs); NaN / ±inf where the f64 sum is. Each element must also be
//! bit-identical to the documented contract
//! `f16((f32(S) + f32(mask)) + f32(bias))`, which also proves it was
//! written.
//! A second test measures how far PyTorch's two-rounding
//! `f16(f16(S + bias) + mask)` is from the same f64 value.
#[macro_use]
mod common;

use common::{Rng, cpu, devices, ulp_err};
use half::f16;
use proptest::prelude::*;
use wavefuse::{AttnBias, AttnMask, Choice, Device, Error, Wave, WindowTable, bias_mask_add};

pub struct Case {
    pub windows: usize,
    pub heads: usize,
    pub tokens: usize,
    pub s: Vec<f16>,
    pub bias: Vec<f16>,
    pub ty: Vec<i32>,
    pub n_types: usize,
    /// (mask, slot table, slots)
    pub mask: Option<(Vec<f16>, Vec<i32>, usize)>,
}

impl Case {
    /// Bias and mask elements added to score element `i` (flat index).
    pub fn addends(&self, i: usize) -> (f16, f16) {
        let tt = self.tokens * self.tokens;
        let (tile, e) = (i / tt, i % tt);
        let (w, h) = (tile / self.heads, tile % self.heads);
        let b = self.bias[(self.ty[w] as usize * self.heads + h) * tt + e];
        let m = match &self.mask {
            Some((m, sl, _)) => m[sl[w] as usize * tt + e],
            None => f16::ZERO,
        };
        (b, m)
    }
}

#[allow(clippy::too_many_arguments)]
pub fn make_case(
    seed: u64,
    windows: usize,
    heads: usize,
    tokens: usize,
    n_types: usize,
    slots: Option<usize>,
    scale: f64,
    special: bool,
) -> Case {
    let mut rng = Rng(seed);
    let tt = tokens * tokens;
    let mut s = rng.halves(windows * heads * tt, scale, 0.0);
    if special {
        for v in s.iter_mut() {
            match rng.below(60) {
                0 => *v = f16::NAN,
                1 => *v = f16::INFINITY,
                2 => *v = f16::NEG_INFINITY,
                3 => *v = f16::from_f32(65504.0),
                _ => {}
            }
        }
    }
    let bias = rng.halves(n_types * heads * tt, 1.0, 0.0);
    let ty = (0..windows)
        .map(|_| rng.below(n_types as u64) as i32)
        .collect();
    let mask = slots.map(|n| {
        let m = (0..n * tt)
            .map(|_| match rng.below(3) {
                0 => f16::from_f32(-100.0),
                _ => f16::ZERO,
            })
            .collect();
        let sl = (0..windows).map(|_| rng.below(n as u64) as i32).collect();
        (m, sl, n)
    });
    Case {
        windows,
        heads,
        tokens,
        s,
        bias,
        ty,
        n_types,
        mask,
    }
}

fn run(dev: &Device, c: &Case) -> Result<Vec<f16>, String> {
    let s = |e: Error| e.to_string();
    let mut sd = dev.upload(&c.s).map_err(s)?;
    let bd = dev.upload(&c.bias).map_err(s)?;
    let ty = WindowTable::new(dev, &c.ty, c.n_types).map_err(s)?;
    let (md, sl) = match &c.mask {
        Some((m, sl, n)) => (
            Some(dev.upload(m).map_err(s)?),
            Some(WindowTable::new(dev, sl, *n).map_err(s)?),
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
    bias_mask_add(dev, &mut sd.view_mut(), c.heads, c.tokens, &ab).map_err(s)?;
    sd.download().map_err(s)
}

/// The f16 ulp of `x` (floored at the smallest normal's), as in `ulp_err`.
fn ulp16(x: f64) -> f64 {
    2f64.powf(x.abs().max(f16::MIN_POSITIVE.to_f64()).log2().floor() - 10.0)
}

/// Bound on the contract's f32 rounding errors (two adds), in absolute terms.
fn f32_term(s: f16, m: f16, sum: f64) -> f64 {
    2f64.powi(-23) * ((s.to_f64() + m.to_f64()).abs() + sum.abs())
}

fn check(dev: &Device, c: &Case) -> Result<f64, String> {
    let out = run(dev, c)?;
    let mut worst = 0.0f64;
    for (i, (&got, &sv)) in out.iter().zip(&c.s).enumerate() {
        let (b, m) = c.addends(i);
        let at = format!("{} elem {i} ({sv} + {b} + {m})", dev.info().name);
        let contract = f16::from_f32((sv.to_f32() + m.to_f32()) + b.to_f32());
        let exact = sv.to_f64() + b.to_f64() + m.to_f64();
        if exact.is_nan() {
            if !got.is_nan() {
                return Err(format!("{at}: want NaN, got {got}"));
            }
            continue;
        }
        if got.to_bits() != contract.to_bits() {
            return Err(format!("{at}: got {got:?}, contract {contract:?}"));
        }
        if exact.abs() >= 65520.0 {
            if !(got.is_infinite() && (got.to_f64() > 0.0) == (exact > 0.0)) {
                return Err(format!("{at}: want overflow, got {got}"));
            }
            continue;
        }
        let e = ulp_err(got, exact);
        if e > 1.0 && (got.to_f64() - exact).abs() > ulp16(exact) + f32_term(sv, m, exact) {
            return Err(format!("{at}: {e:.3} ulp from f64"));
        }
        worst = worst.max(e);
    }
    Ok(worst)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, .. ProptestConfig::default() })]

    #[test]
    fn matches_f64_oracle(
        seed in any::<u64>(),
        windows in 1usize..5,
        heads in 1usize..4,
        tokens in prop_oneof![Just(4usize), (1usize..10).prop_map(|k| 4 * k), Just(144usize)],
        n_types in 1usize..4,
        slots in prop_oneof![Just(None), (1usize..4).prop_map(Some)],
        log_scale in -1.0f64..2.5,
        special in any::<bool>(),
    ) {
        let c = make_case(seed, windows, heads, tokens, n_types, slots, 10f64.powf(log_scale), special);
        for dev in devices() {
            let r = check(&dev, &c);
            prop_assert!(r.is_ok(), "{}", r.err().unwrap_or_default());
        }
    }
}

#[test]
fn pangu_tile_many_workgroups() {
    let c = make_case(3, 7, 6, 144, 3, Some(4), 4.0, true);
    for dev in devices() {
        let w = check(&dev, &c).unwrap_or_else(|e| panic!("{e}"));
        eprintln!("{}: worst {w:.3} ulp", dev.info().name);
    }
}

#[test]
fn one_rounding_vs_pytorch_two_roundings() {
    // Scores near +100 that the -100 mask nearly cancels: PyTorch's
    // f16(f16(S + bias) + mask) inherits the first rounding's error (up to
    // half an f16 ulp of ~100) in a result near 0; ours rounds to f16 once
    // (S + mask is exact here, so only the final add rounds in f32).
    let mut c = make_case(17, 4, 2, 144, 2, Some(1), 1.0, false);
    let mut rng = Rng(5);
    for v in c.s.iter_mut() {
        *v = f16::from_f64(100.0 + 0.5 * rng.normal());
    }
    if let Some((m, _, _)) = &mut c.mask {
        m.fill(f16::from_f32(-100.0));
    }
    for dev in devices() {
        let out = run(&dev, &c).expect("launch");
        let (mut ours, mut two, mut differ) = (0.0f64, 0.0f64, 0usize);
        for (i, (&got, &sv)) in out.iter().zip(&c.s).enumerate() {
            let (b, m) = c.addends(i);
            let exact = sv.to_f64() + b.to_f64() + m.to_f64();
            let pt = f16::from_f32(f16::from_f32(sv.to_f32() + b.to_f32()).to_f32() + m.to_f32());
            let err = (got.to_f64() - exact).abs();
            assert!(
                err <= 0.5 * ulp16(exact) + f32_term(sv, m, exact),
                "elem {i}: {sv} + {b} + {m} = {exact:e}, got {got}"
            );
            ours = ours.max(ulp_err(got, exact));
            two = two.max(ulp_err(pt, exact));
            differ += usize::from(pt.to_bits() != got.to_bits());
        }
        eprintln!(
            "{}: one rounding worst {ours:.3} ulp; two roundings worst {two:.1} ulp; {differ} of {} elements differ",
            dev.info().name,
            out.len()
        );
        assert!(ours <= 0.5 + 1e-3, "ours {ours}");
        assert!(
            two > 100.0 && differ > 0,
            "the two-rounding path should be measurably worse here"
        );
    }
    // Without cancellation (the usual -100 mask on O(1) scores) the two
    // paths differ by at most one ulp.
    let c = make_case(18, 4, 2, 144, 2, Some(2), 2.0, false);
    for dev in devices() {
        let out = run(&dev, &c).expect("launch");
        let mut most = 0.0f64;
        for (i, (&got, &sv)) in out.iter().zip(&c.s).enumerate() {
            let (b, m) = c.addends(i);
            let pt = f16::from_f32(f16::from_f32(sv.to_f32() + b.to_f32()).to_f32() + m.to_f32());
            most = most.max(ulp_err(pt, got.to_f64()));
        }
        eprintln!(
            "{}: O(1) scores: paths differ by at most {most:.2} ulp",
            dev.info().name
        );
        assert!(most <= 1.0);
    }
}

#[test]
fn no_windows_is_a_no_op() {
    for dev in devices() {
        let mut s = dev.alloc::<f16>(0).expect("alloc");
        let b = dev.upload(&[f16::ONE; 64]).expect("upload");
        let m = dev.upload(&[f16::ZERO; 64]).expect("upload");
        let (t, sl) = (
            WindowTable::new(&dev, &[], 1).expect("empty table"),
            WindowTable::new(&dev, &[], 1).expect("empty table"),
        );
        assert!(t.is_empty());
        let (bv, mv) = (b.view(), m.view());
        for mask in [
            None,
            Some(AttnMask {
                mask: &mv,
                slot: &sl,
            }),
        ] {
            let ab = AttnBias {
                bias: &bv,
                ty: &t,
                mask,
            };
            bias_mask_add(&dev, &mut s.view_mut(), 1, 8, &ab).expect("no-op");
        }
    }
}

/// Builds buffers of the given lengths and calls `bias_mask_add`; the
/// scores start at element `s_off` of their buffer, the type table lives
/// on `ty_dev`.
#[allow(clippy::too_many_arguments)]
fn try_add(
    d: &Device,
    (s_off, s_len): (usize, usize),
    bias_len: usize,
    (ty_dev, ty, n_types): (&Device, &[i32], usize),
    mask: Option<(usize, &[i32], usize)>,
    heads: usize,
    tokens: usize,
) -> wavefuse::Result<()> {
    let mut s = d.upload(&vec![f16::ONE; s_off + s_len])?;
    let b = d.upload(&vec![f16::ONE; bias_len])?;
    let t = WindowTable::new(ty_dev, ty, n_types)?;
    let m = mask
        .map(|(len, _, _)| d.upload(&vec![f16::ZERO; len]))
        .transpose()?;
    let sl = mask
        .map(|(_, sl, n)| WindowTable::new(d, sl, n))
        .transpose()?;
    let bv = b.view();
    let mv = m.as_ref().map(|m| m.view());
    let mk = match (&mv, &sl) {
        (Some(mask), Some(slot)) => Some(AttnMask { mask, slot }),
        _ => None,
    };
    let mut sv = s.slice_mut(s_off..s_off + s_len).expect("in range");
    bias_mask_add(
        d,
        &mut sv,
        heads,
        tokens,
        &AttnBias {
            bias: &bv,
            ty: &t,
            mask: mk,
        },
    )?;
    let written = s.download()?.iter().any(|v| *v != f16::ONE);
    panic!("accepted (scores written: {written})");
}

#[test]
fn rejects_bad_arguments_before_any_launch() {
    let (d, other) = (
        cpu(),
        Device::open(Choice::Cpu(Wave::W32)).expect("cpu backend"),
    );
    let one: &[i32] = &[0];
    rejects! {
        "tokens 6": try_add(&d, (0, 36), 36, (&d, one, 1), None, 1, 6)
            => Error::BadParameter { what: "tokens", .. },
        "heads 0": try_add(&d, (0, 64), 64, (&d, one, 1), None, 0, 8)
            => Error::BadParameter { what: "heads", .. },
        "scores vs table": try_add(&d, (0, 64), 64, (&d, &[0, 0], 1), None, 1, 8)
            => Error::LengthMismatch { what: "scores", .. },
        "scores but no windows": try_add(&d, (0, 64), 64, (&d, &[], 1), None, 1, 8)
            => Error::LengthMismatch { what: "scores", .. },
        "bias length": try_add(&d, (0, 64), 64, (&d, one, 2), None, 1, 8)
            => Error::LengthMismatch { what: "bias", .. },
        "mask length": try_add(&d, (0, 64), 64, (&d, one, 1), Some((64, &[1], 2)), 1, 8)
            => Error::LengthMismatch { what: "mask", .. },
        "slot table length": try_add(&d, (0, 64), 64, (&d, one, 1), Some((64, &[0, 0], 1)), 1, 8)
            => Error::LengthMismatch { what: "slot", .. },
        "scores misaligned": try_add(&d, (1, 64), 64, (&d, one, 1), None, 1, 8)
            => Error::Misaligned { what: "scores", .. },
        "type table of another device": try_add(&d, (0, 64), 64, (&other, one, 1), None, 1, 8)
            => Error::WrongDevice { what: "ty", .. },
        "table entry past the bound": WindowTable::new(&d, &[0, 3, 1], 3)
            => Error::BadParameter { what: "table", .. },
        "negative table entry": WindowTable::new(&d, &[0, -1, 1], 3)
            => Error::BadParameter { what: "table", .. },
        "bound 0": WindowTable::new(&d, &[0], 0)
            => Error::BadParameter { what: "bound", .. },
    }
}
