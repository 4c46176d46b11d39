//! QKV split + q scale through the public API on every backend present.
//!
//! Oracle: plain index arithmetic (PyTorch's `reshape(B_, T, 3, H, 32)
//! .permute(2, 0, 3, 1, 4)`), values in f64. Each output element must be
//! bit-identical to the documented contract (`q = f16(f32(x) * scale)`,
//! k / v bit copies; with bias `f16(x + b)` first) and within 1 f16 ulp of
//! the f64 value of the same expression (`(x [+ b rounded to f16]) * scale`).
#[macro_use]
mod common;

use common::{POISON, Rng, cpu, devices, ulp_err};
use half::f16;
use proptest::prelude::*;
use wavefuse::{Choice, Device, Error, QkvSplit, Wave, qkv_split};

struct Case {
    windows: usize,
    p: QkvSplit,
    x: Vec<f16>,
    bias: Option<Vec<f16>>,
}

#[allow(clippy::needless_range_loop)] // indices mirror the tensor layout
fn run(dev: &Device, c: &Case) -> Result<(), String> {
    let s = |e: Error| e.to_string();
    let (h, t) = (c.p.heads, c.p.tokens_per_window);
    let ch = h * 32;
    let n = c.x.len() / 3;
    let x = dev.upload(&c.x).map_err(s)?;
    let b = c
        .bias
        .as_ref()
        .map(|b| dev.upload(b))
        .transpose()
        .map_err(s)?;
    let mut outs = [(); 3].map(|_| dev.upload(&vec![POISON; n]));
    let [q, k, v] = &mut outs;
    let (q, k, v) = (
        q.as_mut().map_err(|e| e.to_string())?,
        k.as_mut().map_err(|e| e.to_string())?,
        v.as_mut().map_err(|e| e.to_string())?,
    );
    let bv = b.as_ref().map(|b| b.view());
    qkv_split(
        dev,
        &x.view(),
        bv.as_ref(),
        &mut q.view_mut(),
        &mut k.view_mut(),
        &mut v.view_mut(),
        &c.p,
    )
    .map_err(s)?;
    let got = [
        q.download().map_err(s)?,
        k.download().map_err(s)?,
        v.download().map_err(s)?,
    ];
    for w in 0..c.windows {
        for tok in 0..t {
            for part in 0..3 {
                for hh in 0..h {
                    for d in 0..32 {
                        let ci = part * ch + hh * 32 + d;
                        let xi = c.x[(w * t + tok) * 3 * ch + ci];
                        let o = got[part][((w * h + hh) * t + tok) * 32 + d];
                        let at = format!(
                            "{} w {w} t {tok} part {part} head {hh} d {d}",
                            dev.info().name
                        );
                        let scale = if part == 0 { c.p.scale } else { 1.0 };
                        // The contract, in f32, and its f64 value.
                        let (contract, exact) = match &c.bias {
                            Some(b) => {
                                let xb = f16::from_f32(xi.to_f32() + b[ci].to_f32());
                                (
                                    f16::from_f32(xb.to_f32() * scale),
                                    xb.to_f64() * scale as f64,
                                )
                            }
                            None if part == 0 => (
                                f16::from_f32(xi.to_f32() * scale),
                                xi.to_f64() * scale as f64,
                            ),
                            None => (xi, xi.to_f64()),
                        };
                        if contract.is_nan() {
                            if !o.is_nan() {
                                return Err(format!("{at}: want NaN, got {o}"));
                            }
                            // k / v without bias: bit copies, NaN payload too.
                            if c.bias.is_none() && part > 0 && o.to_bits() != xi.to_bits() {
                                return Err(format!("{at}: NaN payload not copied"));
                            }
                            continue;
                        }
                        if o.to_bits() != contract.to_bits() {
                            return Err(format!("{at}: got {o:?} want {contract:?}"));
                        }
                        if exact.is_finite() && exact.abs() < 65504.0 && ulp_err(o, exact) > 1.0 {
                            return Err(format!("{at}: {} ulp from f64", ulp_err(o, exact)));
                        }
                    }
                }
            }
        }
    }
    Ok(())
}

fn make_case(
    seed: u64,
    windows: usize,
    heads: usize,
    tokens: usize,
    bias: bool,
    scale: Option<f32>,
    special: bool,
) -> Case {
    let mut rng = Rng(seed);
    let mut p = QkvSplit::new(heads);
    p.tokens_per_window = tokens;
    if let Some(s) = scale {
        p.scale = s;
    }
    let mut x = rng.halves(windows * tokens * 3 * heads * 32, 4.0, 0.0);
    if special {
        for v in x.iter_mut() {
            match rng.below(50) {
                0 => *v = f16::from_bits(0x7c01 + rng.below(0x3fe) as u16), // NaN, any payload
                1 => *v = f16::INFINITY,
                2 => *v = f16::NEG_INFINITY,
                3 => *v = f16::from_f32(65504.0),
                4 => *v = f16::from_bits(rng.below(0x400) as u16),
                _ => {}
            }
        }
    }
    let bias = bias.then(|| rng.halves(3 * heads * 32, 2.0, 0.0));
    Case {
        windows,
        p,
        x,
        bias,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, .. ProptestConfig::default() })]

    #[test]
    fn matches_oracle(
        seed in any::<u64>(),
        windows in 1usize..4,
        heads in prop_oneof![1usize..4, Just(6usize)],
        tokens in prop_oneof![Just(1usize), 1usize..20, Just(144usize)],
        bias in any::<bool>(),
        scale in prop_oneof![Just(None), (-4.0f32..4.0).prop_map(Some)],
        special in any::<bool>(),
    ) {
        let c = make_case(seed, windows, heads, tokens, bias, scale, special);
        for dev in devices() {
            let r = run(&dev, &c);
            prop_assert!(r.is_ok(), "{}", r.err().unwrap_or_default());
        }
    }
}

#[test]
fn pangu_shapes_with_and_without_bias() {
    // 6 and 12 heads of 32 at 144 tokens, several workgroups and a remainder.
    for (windows, heads) in [(5, 6), (3, 12)] {
        for bias in [false, true] {
            let c = make_case(11 + heads as u64, windows, heads, 144, bias, None, true);
            for dev in devices() {
                run(&dev, &c).unwrap_or_else(|e| panic!("{e}"));
            }
        }
    }
}

#[test]
fn default_scale_is_one_over_sqrt_32() {
    let p = QkvSplit::new(6);
    // Python's `32 ** -0.5`, rounded to f32 as PyTorch's opmath does.
    assert_eq!(p.scale, 0.176_776_695_296_636_87_f64 as f32);
    assert_eq!((p.head_dim, p.tokens_per_window), (32, 144));
}

/// Runs `qkv_split` with `n_in` inputs and outputs of `n_out` elements,
/// `q` starting at element `q_off` of its buffer, `k` on `k_dev`.
fn try_split(
    d: &Device,
    k_dev: &Device,
    n_in: usize,
    (q_off, n_out): (usize, [usize; 3]),
    bias: Option<usize>,
    p: &QkvSplit,
) -> wavefuse::Result<()> {
    let x = d.upload(&vec![f16::ONE; n_in])?;
    let b = bias.map(|n| d.upload(&vec![f16::ONE; n])).transpose()?;
    let mut q = d.upload(&vec![POISON; q_off + n_out[0]])?;
    let mut k = k_dev.upload(&vec![POISON; n_out[1]])?;
    let mut v = d.upload(&vec![POISON; n_out[2]])?;
    let bv = b.as_ref().map(|b| b.view());
    qkv_split(
        d,
        &x.view(),
        bv.as_ref(),
        &mut q.slice_mut(q_off..q_off + n_out[0]).expect("in range"),
        &mut k.view_mut(),
        &mut v.view_mut(),
        p,
    )
}

const ONE_WINDOW: usize = 144 * 3 * 32; // heads = 1

#[test]
fn no_windows_is_a_no_op() {
    for dev in devices() {
        try_split(&dev, &dev, 0, (0, [0; 3]), None, &QkvSplit::new(1)).expect("no-op");
        try_split(&dev, &dev, 0, (0, [0; 3]), Some(96), &QkvSplit::new(1)).expect("no-op");
    }
}

#[test]
fn rejects_bad_arguments_before_any_launch() {
    let (d, other) = (
        cpu(),
        Device::open(Choice::Cpu(Wave::W32)).expect("cpu backend"),
    );
    let n = ONE_WINDOW / 3;
    let with = |f: &dyn Fn(&mut QkvSplit)| {
        let mut p = QkvSplit::new(1);
        f(&mut p);
        p
    };
    rejects! {
        "head_dim 64": try_split(&d, &d, 2 * ONE_WINDOW, (0, [ONE_WINDOW; 3]), None, &with(&|p| p.head_dim = 64))
            => Error::UnsupportedWidth { width: 64, .. },
        "heads 0": try_split(&d, &d, ONE_WINDOW, (0, [n; 3]), None, &QkvSplit::new(0))
            => Error::BadParameter { what: "heads", .. },
        "tokens_per_window 0": try_split(&d, &d, ONE_WINDOW, (0, [n; 3]), None, &with(&|p| p.tokens_per_window = 0))
            => Error::BadParameter { what: "tokens_per_window", .. },
        "scale NaN": try_split(&d, &d, ONE_WINDOW, (0, [n; 3]), None, &with(&|p| p.scale = f32::NAN))
            => Error::BadParameter { what: "scale", .. },
        "partial window": try_split(&d, &d, ONE_WINDOW + 96, (0, [n + 32; 3]), None, &QkvSplit::new(1))
            => Error::RaggedRows { .. },
        "v length": try_split(&d, &d, ONE_WINDOW, (0, [n, n, n - 8]), None, &QkvSplit::new(1))
            => Error::LengthMismatch { what: "v", .. },
        "bias length": try_split(&d, &d, ONE_WINDOW, (0, [n; 3]), Some(32), &QkvSplit::new(1))
            => Error::LengthMismatch { what: "bias", .. },
        "q misaligned": try_split(&d, &d, ONE_WINDOW, (1, [n; 3]), None, &QkvSplit::new(1))
            => Error::Misaligned { what: "q", .. },
        "k of another device": try_split(&d, &other, ONE_WINDOW, (0, [n; 3]), None, &QkvSplit::new(1))
            => Error::WrongDevice { what: "k", .. },
    }
}
