//! The candle ops against f64 oracles (or exact candle equivalents) on the
//! CPU emulator, and on CUDA (when the `cuda` feature is built and a GPU
//! opens; required when `WAVEFUSE_REQUIRE` names cuda) against the
//! emulator's results. Every case reads fresh random inputs, uses operands
//! at non-zero aligned offsets of larger storages where the op allows,
//! and checks the storage around them is untouched. Then the operand rule
//! and the errors: each names the op and the argument.
mod support;

use candle_core::{DType, Device, IndexOp, Tensor};
use half::{bf16, f16};
use support::{Rng, agrees, cuda, f64s, halves_of, max_ulps};
use wavefuse_candle::{Affine, AttnTables, GeluMode, Plan};
use wavefuse_shared::window::{Grid3, Shift3, Window3, WindowPlan};

const EPS: f32 = 1e-5;

fn ln64(x: &[f64], g: Option<(&[f64], &[f64])>) -> Vec<f64> {
    let n = x.len() as f64;
    let mean = x.iter().sum::<f64>() / n;
    let var = x.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n;
    let r = 1.0 / (var + f64::from(EPS)).sqrt();
    x.iter()
        .enumerate()
        .map(|(i, v)| {
            let y = (v - mean) * r;
            match g {
                Some((g, b)) => y * g[i] + b[i],
                None => y,
            }
        })
        .collect()
}

/// Rows of `x` `[rows, w]` through the f64 LayerNorm.
fn ln_rows(x: &[f64], w: usize, g: Option<(&[f64], &[f64])>) -> Vec<f64> {
    x.chunks(w).flat_map(|r| ln64(r, g)).collect()
}

/// `t` placed at row `pad` of a `[pad + rows + pad, w]` storage filled with
/// a guard value: returns (the storage, the view of `t` in it).
fn embedded(t: &Tensor, pad: usize, dev: &Device) -> (Tensor, Tensor) {
    let (rows, w) = t.dims2().expect("2-d");
    let guard = Tensor::full(f16::from_f32(-7.25), (pad, w), dev).expect("guard");
    let whole = Tensor::cat(&[&guard, &t.to_device(dev).expect("dev"), &guard], 0).expect("cat");
    let view = whole.narrow(0, pad, rows).expect("narrow");
    (whole, view)
}

/// The guard rows of an [`embedded`] storage are untouched.
fn guards_intact(whole: &Tensor, pad: usize) {
    let rows = whole.dim(0).expect("rows");
    for r in (0..pad).chain(rows - pad..rows) {
        let v = halves_of(&whole.i(r).expect("row"));
        assert!(
            v.iter().all(|&h| h == f16::from_f32(-7.25)),
            "guard row {r} written"
        );
    }
}

/// `a` within `ulp` f16 ulps of `b`, element by element (the index and
/// values of the worst one on failure).
fn close(a: &[f16], b: &[f16], ulp: f64, what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    let (mut worst, mut at) = (0.0, 0);
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        let e = support::ulps(*x, y.to_f64());
        if e > worst {
            (worst, at) = (e, i);
        }
    }
    assert!(
        worst <= ulp,
        "{what}: {worst} ulp at {at} ({} vs {})",
        a[at],
        b[at]
    );
}

fn devices() -> Vec<Device> {
    let mut d = vec![Device::Cpu];
    d.extend(cuda());
    d
}

/// Runs `case` on every device; checks the CPU result with `oracle` and
/// every other device's against the CPU's.
fn on_devices(name: &str, case: impl Fn(&Device) -> Vec<Tensor>, oracle: impl Fn(&[Vec<f16>])) {
    let mut cpu: Option<Vec<Vec<f16>>> = None;
    for dev in devices() {
        let outs: Vec<Vec<f16>> = case(&dev).iter().map(halves_of).collect();
        match &cpu {
            None => {
                oracle(&outs);
                cpu = Some(outs);
            }
            Some(c) => {
                for (i, (a, b)) in outs.iter().zip(c).enumerate() {
                    agrees(&format!("{name} output {i} on {dev:?}"), a, b);
                }
            }
        }
    }
}

#[test]
fn layer_norm_plain_and_affine() {
    for (seed, rows, w) in [(1u64, 37, 192), (2, 5, 384), (3, 3, 768)] {
        let mut rng = Rng(seed);
        let x = rng.halves(&[rows, w], 3.0, 0.7);
        let g = rng.halves(&[w], 0.5, 1.0);
        let b = rng.halves(&[w], 0.5, 0.0);
        let (xs, gs, bs) = (f64s(&x), f64s(&g), f64s(&b));
        on_devices(
            "layer_norm",
            |dev| {
                let (whole, xv) = embedded(&x, 8, dev);
                let a =
                    Affine::new(&g.to_device(dev).unwrap(), &b.to_device(dev).unwrap()).unwrap();
                let y0 = wavefuse_candle::layer_norm(&xv, None, EPS).unwrap();
                let y1 = wavefuse_candle::layer_norm(&xv, Some(&a), EPS).unwrap();
                guards_intact(&whole, 8);
                assert_eq!(y1.dims(), &[rows, w]);
                vec![y0, y1]
            },
            |o| {
                let e0 = max_ulps(&o[0], &ln_rows(&xs, w, None));
                let e1 = max_ulps(&o[1], &ln_rows(&xs, w, Some((&gs, &bs))));
                // One rounding of an f32 computation: within 1 ulp of f64.
                assert!(e0 <= 1.0 && e1 <= 1.0, "w {w}: {e0} / {e1} ulp");
            },
        );
    }
}

#[test]
fn add_layer_norm_in_place_and_to() {
    let (rows, w) = (29, 384);
    let mut rng = Rng(11);
    let r = rng.halves(&[rows, w], 2.0, 0.5);
    let br = rng.halves(&[rows, w], 1.0, 0.0);
    let g = rng.halves(&[w], 0.5, 1.0);
    let b = rng.halves(&[w], 0.5, 0.0);
    // The rounded sum, exactly.
    let sum: Vec<f16> = halves_of(&r)
        .iter()
        .zip(halves_of(&br))
        .map(|(a, c)| f16::from_f32(a.to_f32() + c.to_f32()))
        .collect();
    let sum64: Vec<f64> = sum.iter().map(|v| v.to_f64()).collect();
    let (gs, bs) = (f64s(&g), f64s(&b));
    on_devices(
        "add_layer_norm",
        |dev| {
            let a = Affine::new(&g.to_device(dev).unwrap(), &b.to_device(dev).unwrap()).unwrap();
            let branch = br.to_device(dev).unwrap();
            let (whole, res) = embedded(&r, 16, dev);
            let y = wavefuse_candle::add_layer_norm(&res, &branch, Some(&a), EPS).unwrap();
            guards_intact(&whole, 16);
            let (whole2, res2) = embedded(&r, 8, dev);
            let y0 = wavefuse_candle::add_layer_norm(&res2, &branch, None, EPS).unwrap();
            let untouched = r.to_device(dev).unwrap();
            let (s, y2) =
                wavefuse_candle::add_layer_norm_to(&untouched, &branch, Some(&a), EPS).unwrap();
            assert_eq!(
                halves_of(&untouched),
                halves_of(&r),
                "add_layer_norm_to wrote its input"
            );
            guards_intact(&whole2, 8);
            vec![res, y, res2, y0, s, y2]
        },
        |o| {
            assert_eq!(o[0], sum, "residual in place");
            assert_eq!(o[2], sum, "residual in place (no affine)");
            assert_eq!(o[4], sum, "residual out of place");
            let want = ln_rows(&sum64, w, Some((&gs, &bs)));
            assert!(max_ulps(&o[1], &want) <= 1.0);
            assert!(max_ulps(&o[5], &want) <= 1.0);
            assert!(max_ulps(&o[3], &ln_rows(&sum64, w, None)) <= 1.0);
        },
    );
}

/// A small shifted plan with padding along latitude and longitude.
fn small_plan() -> WindowPlan {
    WindowPlan::new(
        Grid3 { z: 2, h: 11, w: 22 },
        Window3 { z: 2, h: 6, w: 12 },
        Shift3 { z: 1, h: 3, w: 6 },
    )
    .unwrap()
}

/// The window partition of `x` `[N, C]` by candle's own ops: zero pad at
/// the end of each axis, roll by `-shift`, windows in `(z, h, w)`-major
/// order, tokens in `(z, h, w)` order inside a window.
fn candle_partition(x: &Tensor, p: &WindowPlan) -> Tensor {
    let (g, pd, w, s) = (p.grid(), p.padded_grid(), p.window(), p.shift());
    let c = x.dim(1).unwrap();
    x.reshape((g.z, g.h, g.w, c))
        .and_then(|x| x.pad_with_zeros(0, 0, pd.z - g.z))
        .and_then(|x| x.pad_with_zeros(1, 0, pd.h - g.h))
        .and_then(|x| x.pad_with_zeros(2, 0, pd.w - g.w))
        .and_then(|x| x.roll(-(s.z as i32), 0))
        .and_then(|x| x.roll(-(s.h as i32), 1))
        .and_then(|x| x.roll(-(s.w as i32), 2))
        .and_then(|x| x.reshape((pd.z / w.z, w.z, pd.h / w.h, w.h, pd.w / w.w, w.w * c)))
        .and_then(|x| x.permute((0, 2, 4, 1, 3, 5)))
        .and_then(|x| x.contiguous())
        .and_then(|x| x.reshape((p.n_tokens_out(), c)))
        .unwrap()
}

#[test]
fn gathers_match_candle_partition() {
    let p = small_plan();
    let w = 192;
    let n = p.n_tokens_in();
    let mut rng = Rng(21);
    let x = rng.halves(&[n, w], 2.0, 0.3);
    let d = rng.halves(&[n, w], 1.0, 0.0);
    let g = rng.halves(&[w], 0.5, 1.0);
    let b = rng.halves(&[w], 0.5, 0.0);
    let table = p.partition_table();
    on_devices(
        "gathers",
        |dev| {
            let plan = Plan::new(&table, n, dev).unwrap();
            let rev = Plan::new(&p.reverse_table(), p.n_tokens_out(), dev).unwrap();
            assert!(plan.is_partition() && !rev.is_partition());
            let a = Affine::new(&g.to_device(dev).unwrap(), &b.to_device(dev).unwrap()).unwrap();
            let (whole, xv) = embedded(&x, 8, dev);
            let gx = wavefuse_candle::gather(&xv, &plan).unwrap();
            let back = wavefuse_candle::gather(&gx, &rev).unwrap();
            let lg = wavefuse_candle::layer_norm_gather(&xv, &plan, Some(&a), EPS).unwrap();
            let ln = wavefuse_candle::layer_norm(&xv, Some(&a), EPS).unwrap();
            let ln_then_gather = wavefuse_candle::gather(&ln, &plan).unwrap();
            guards_intact(&whole, 8);
            let res = x.to_device(dev).unwrap().copy().unwrap();
            let branch = d.to_device(dev).unwrap();
            let alg = wavefuse_candle::add_layer_norm_gather(&res, &branch, &plan, Some(&a), EPS)
                .unwrap();
            let res2 = x.to_device(dev).unwrap().copy().unwrap();
            let y2 = wavefuse_candle::add_layer_norm(&res2, &branch, Some(&a), EPS).unwrap();
            let y2g = wavefuse_candle::gather(&y2, &plan).unwrap();
            vec![gx, back, lg, ln_then_gather, res, alg, res2, y2g]
        },
        |o| {
            // The window partition by candle's own pad / roll / permute.
            let want = candle_partition(&x, &p);
            assert_eq!(o[0], halves_of(&want), "gather = partition");
            assert_eq!(o[1], halves_of(&x), "reverse gather = unpartition");
            // Fused and unfused give the same bits; padding rows are +0.
            assert_eq!(o[2], o[3], "layer_norm_gather = gather(layer_norm)");
            for (t, &src) in table.iter().enumerate() {
                if src < 0 {
                    assert!(
                        o[2][t * w..(t + 1) * w].iter().all(|v| v.to_bits() == 0),
                        "pad row {t}"
                    );
                }
            }
            assert_eq!(o[4], o[6], "residual updated like add_layer_norm");
            // The same numerics in another reduction order: 1 ulp at most.
            close(
                &o[5],
                &o[7],
                1.0,
                "add_layer_norm_gather vs gather(add_layer_norm)",
            );
        },
    );
}

#[test]
fn head_merge_gather_matches_transpose() {
    // 32-channel tokens [w, h, t] -> [w, t, h]: the attention's head merge.
    let (windows, heads, t) = (3, 6, 144);
    let mut rng = Rng(31);
    let o = rng.halves(&[windows, heads, t, 32], 1.0, 0.0);
    let mut table = Vec::new();
    for w in 0..windows {
        for ti in 0..t {
            for h in 0..heads {
                table.push(((w * heads + h) * t + ti) as i32);
            }
        }
    }
    on_devices(
        "head_merge",
        |dev| {
            let plan = Plan::new(&table, table.len(), dev).unwrap();
            let src = o
                .to_device(dev)
                .unwrap()
                .reshape((windows * heads * t, 32))
                .unwrap();
            vec![wavefuse_candle::gather(&src, &plan).unwrap()]
        },
        |out| {
            let want = o.transpose(1, 2).unwrap().contiguous().unwrap();
            assert_eq!(out[0], halves_of(&want));
        },
    );
}

fn gelu64(v: f64, tanh: bool) -> f64 {
    if tanh {
        let k = (2.0 / std::f64::consts::PI).sqrt();
        0.5 * v * (1.0 + (k * (v + 0.044715 * v * v * v)).tanh())
    } else {
        0.5 * v * (1.0 + libm::erf(v / std::f64::consts::SQRT_2))
    }
}

#[test]
fn bias_gelu_f16_and_bf16_bias() {
    let (rows, c) = (17, 768);
    let mut rng = Rng(41);
    let x = rng.halves(&[rows, c], 4.0, 0.0);
    let b = rng.halves(&[c], 1.0, 0.0);
    let bb = b.to_dtype(DType::BF16).unwrap();
    let xs = halves_of(&x);
    on_devices(
        "bias_gelu",
        |dev| {
            let (whole, xv) = embedded(&x, 8, dev);
            let (b, bb) = (b.to_device(dev).unwrap(), bb.to_device(dev).unwrap());
            let v = vec![
                wavefuse_candle::bias_gelu(&xv, &b, GeluMode::Erf).unwrap(),
                wavefuse_candle::bias_gelu(&xv, &b, GeluMode::Tanh).unwrap(),
                wavefuse_candle::bias_gelu(&xv, &bb, GeluMode::Erf).unwrap(),
            ];
            guards_intact(&whole, 8);
            v
        },
        |o| {
            let bs: Vec<f16> = halves_of(&b);
            let bbs: Vec<bf16> = bb.to_vec1().unwrap();
            for (k, tanh, bf) in [(0, false, false), (1, true, false), (2, false, true)] {
                let want: Vec<f64> = xs
                    .iter()
                    .enumerate()
                    .map(|(i, xv)| {
                        let s = if bf {
                            xv.to_f64() + bbs[i % c].to_f64()
                        } else {
                            f16::from_f32(xv.to_f32() + bs[i % c].to_f32()).to_f64()
                        };
                        gelu64(s, tanh)
                    })
                    .collect();
                // Within 1 ulp of the f64 GELU of the rounded sum (the bf16
                // case's f32 sum can differ from this exact one by 2^-24
                // relative).
                let e = max_ulps(&o[k], &want);
                assert!(e <= 1.01, "case {k}: {e} ulp");
            }
        },
    );
}

/// The Linear bias add through tiles of the bias + mask-add kernel is
/// candle's f16 broadcast add, bit for bit, at both stage widths.
#[test]
fn bias_add_matches_candle() {
    for (seed, rows, w) in [(81u64, 480, 192), (82, 96, 384)] {
        let mut rng = Rng(seed);
        let x = rng.halves(&[rows, w], 3.0, 0.0);
        let b = rng.halves(&[w], 1.0, 0.0);
        on_devices(
            "bias_add",
            |dev| {
                let op = wavefuse_candle::BiasAdd::new(&b.to_device(dev).unwrap(), rows).unwrap();
                let (whole, xv) = embedded(&x, 8, dev);
                op.add_(&xv).unwrap();
                guards_intact(&whole, 8);
                let e = op.add_(&xv.t().unwrap()).unwrap_err().to_string();
                assert!(e.contains("not contiguous"), "{e}");
                vec![xv]
            },
            |o| assert_eq!(o[0], halves_of(&x.broadcast_add(&b).unwrap())),
        );
    }
    // No tile side fits 7 rows of 192.
    let b = Tensor::zeros(192, DType::F16, &Device::Cpu).unwrap();
    let e = wavefuse_candle::BiasAdd::new(&b, 7)
        .unwrap_err()
        .to_string();
    assert!(e.contains("no tile side"), "{e}");
}

/// `bias_gelu` with a zero bias is the GELU of its input rounded once,
/// on every device (what follows the stage's first MLP Linear, whose bias
/// is in the GEMM's epilogue): within the GELU kernel's one ulp of the
/// correctly rounded exact GELU, and bit-identical to the bf16-bias path
/// (which adds the bias in f32, no f16 rounding before the GELU).
#[test]
fn bias_gelu_with_a_zero_bias_is_the_gelu() {
    let mut rng = Rng(29);
    let x = rng.halves(&[64, 776], 4.0, 0.0);
    let xs = f64s(&x);
    for dev in devices() {
        let xd = x.to_device(&dev).unwrap();
        let zero = Tensor::zeros(776, DType::F16, &dev).unwrap();
        let y = halves_of(&wavefuse_candle::bias_gelu(&xd, &zero, GeluMode::Erf).unwrap());
        let yb = halves_of(
            &wavefuse_candle::bias_gelu(&xd, &zero.to_dtype(DType::BF16).unwrap(), GeluMode::Erf)
                .unwrap(),
        );
        assert_eq!(y, yb, "{dev:?}: f16 and bf16 zero bias");
        let want: Vec<f64> = xs.iter().map(|&v| gelu64(v, false)).collect();
        let worst = max_ulps(&y, &want);
        assert!(worst <= 1.0, "{dev:?}: {worst} ulp from gelu(x)");
    }
}

/// The f16 spacing at `v` (the subnormal spacing below the normal range).
fn ulp16(v: f64) -> f64 {
    let a = v.abs().max(f16::MIN_POSITIVE.to_f64());
    2f64.powf(a.log2().floor() - 10.0)
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// `x W^T + b` in f64 from the f16 operands, `[rows, out]`, with the sum
/// of the terms' magnitudes of each output.
fn linear64(x: &[f64], w: &[f64], b: &[f64], inp: usize) -> Vec<(f64, f64)> {
    let out = b.len();
    x.chunks(inp)
        .flat_map(|r| {
            (0..out).map(move |o| {
                let ws = &w[o * inp..(o + 1) * inp];
                let v = r.iter().zip(ws).map(|(a, c)| a * c).sum::<f64>() + b[o];
                let m = r.iter().zip(ws).map(|(a, c)| (a * c).abs()).sum::<f64>() + b[o].abs();
                (v, m)
            })
        })
        .collect()
}

/// The bias-epilogue Linear (and the same GEMM without a bias) against the
/// f64 oracle on every device, each
/// device on its own (cuBLAS and the CPU's f32 GEMM sum in different
/// orders): every output within half an f16 ulp of the exact `x W^T + b`
/// plus twice the f32 accumulator's own bound (`(in + 2) 2^-24` times the
/// sum of the terms' magnitudes: it only matters where the sum cancels), and
/// at least 99% of them its correctly rounded f16 value. The second bound
/// is what one rounding gives with an f32 accumulator (a sum of a few
/// hundred terms flips a rounding about once in a thousand outputs); a
/// GEMM output rounded before the bias is added (two roundings) gets about
/// 80% right.
/// Shapes: the stage's (in 192 and 384; 776 is more than the CPU f16
/// GEMM's depth block), odd sizes, and `x` at a 256-byte aligned offset of
/// a larger storage, whose guard rows stay untouched.
#[test]
fn linear_rounds_once_with_the_bias() {
    for (seed, rows, inp, out) in [
        (1u64, 200, 192, 576),
        (2, 131, 384, 96),
        (3, 64, 776, 40),
        (4, 37, 24, 10),
    ] {
        let mut rng = Rng(seed);
        let x = rng.halves(&[rows, inp], 2.0, 0.0);
        let a = 1.0 / (inp as f64).sqrt();
        let w = rng.halves(&[out, inp], a, 0.0);
        let b = rng.halves(&[out], 1.0, 0.0);
        let zero = vec![0.0; out];
        for (dev, bias) in devices()
            .into_iter()
            .flat_map(|d| [(d.clone(), true), (d, false)])
        {
            let want = if bias {
                linear64(&f64s(&x), &f64s(&w), &f64s(&b), inp)
            } else {
                linear64(&f64s(&x), &f64s(&w), &zero, inp)
            };
            // Guard rows before and after `x`: whole 256-byte units.
            let pad = 128 / gcd(inp, 128);
            let (whole, xv) = embedded(&x, pad, &dev);
            let wd = w.to_device(&dev).unwrap();
            let y = if bias {
                wavefuse_candle::linear(&xv, &wd, &b.to_device(&dev).unwrap()).unwrap()
            } else {
                wavefuse_candle::linear_no_bias(&xv, &wd).unwrap()
            };
            assert_eq!(y.dims(), &[rows, out]);
            guards_intact(&whole, pad);
            let got = halves_of(&y);
            let mut worst = 0f64;
            for (i, (g, &(v, m))) in got.iter().zip(&want).enumerate() {
                // Twice the accumulator's bound: a rounding that crosses a
                // power of two can add it once more.
                let bound = 0.5 * ulp16(v) + 2.0 * (inp + 2) as f64 * 2f64.powi(-24) * m;
                let e = (g.to_f64() - v).abs();
                worst = worst.max(e / bound);
                assert!(
                    e <= bound,
                    "{dev:?} [{rows},{inp},{out}] at {i}: {g} vs exact {v} (bound {bound:.3e})"
                );
            }
            let exact = got
                .iter()
                .zip(&want)
                .filter(|(g, (v, _))| g.to_bits() == f16::from_f64(*v).to_bits())
                .count() as f64
                / got.len() as f64;
            eprintln!(
                "linear [{rows}, {inp}] x [{out}, {inp}] (bias: {bias}) on {dev:?}: worst error \
                 {worst:.3} of the bound, {:.2}% correctly rounded",
                100.0 * exact
            );
            assert!(
                exact >= 0.99,
                "{dev:?} [{rows},{inp},{out}]: {exact} correctly rounded"
            );
        }
    }
}

/// The Linear's operand rule and errors, and empty inputs.
#[test]
fn linear_operands() {
    for dev in devices() {
        let mut rng = Rng(5);
        let x = rng.halves(&[8, 192], 1.0, 0.0).to_device(&dev).unwrap();
        let w = rng.halves(&[64, 192], 0.1, 0.0).to_device(&dev).unwrap();
        let b = rng.halves(&[64], 0.1, 0.0).to_device(&dev).unwrap();
        let err = |r: candle_core::Result<Tensor>| r.map(|_| ()).unwrap_err().to_string();
        let e = err(wavefuse_candle::linear(
            &x.to_dtype(DType::F32).unwrap(),
            &w,
            &b,
        ));
        assert!(
            e.contains("wavefuse-linear") && e.contains("`x` is F32, expected F16"),
            "{e}"
        );
        let e = err(wavefuse_candle::linear(&x, &w.t().unwrap(), &b));
        assert!(e.contains("`w` is not contiguous"), "{e}");
        // Row 1 of x starts 384 bytes in: not on cuBLASLt's 256-byte grid.
        let e = err(wavefuse_candle::linear(&x.narrow(0, 1, 4).unwrap(), &w, &b));
        assert!(e.contains("`x`") && e.contains("256-byte"), "{e}");
        // Row 2 starts 768 bytes in: fine.
        let y = wavefuse_candle::linear(&x.narrow(0, 2, 4).unwrap(), &w, &b).unwrap();
        assert_eq!(y.dims(), &[4, 64]);
        let e = err(wavefuse_candle::linear(
            &x,
            &w.narrow(1, 0, 96).unwrap().contiguous().unwrap(),
            &b,
        ));
        assert!(e.contains("`w` is [64, 96], expected [out, 192]"), "{e}");
        let e = err(wavefuse_candle::linear(
            &x,
            &w,
            &b.narrow(0, 0, 32).unwrap(),
        ));
        assert!(e.contains("`b` is [32], expected [64]"), "{e}");
        let e = err(wavefuse_candle::linear(&x.flatten_all().unwrap(), &w, &b));
        assert!(e.contains("`x` is [1536], expected [rows, in]"), "{e}");
        let y = wavefuse_candle::linear(&x.narrow(0, 0, 0).unwrap(), &w, &b).unwrap();
        assert_eq!(y.dims(), &[0, 64]);
        // Without a bias: the same rules for `x` and `w`.
        let e = err(wavefuse_candle::linear_no_bias(&x, &w.t().unwrap()));
        assert!(e.contains("`w` is not contiguous"), "{e}");
        let e = err(wavefuse_candle::linear_no_bias(
            &x.narrow(0, 1, 4).unwrap(),
            &w,
        ));
        assert!(e.contains("`x`") && e.contains("256-byte"), "{e}");
        let e = err(wavefuse_candle::linear_no_bias(
            &x,
            &w.narrow(1, 0, 96).unwrap().contiguous().unwrap(),
        ));
        assert!(e.contains("`w` is [64, 96], expected [out, 192]"), "{e}");
        let y = wavefuse_candle::linear_no_bias(&x.narrow(0, 0, 0).unwrap(), &w).unwrap();
        assert_eq!(y.dims(), &[0, 64]);
    }
}

#[test]
fn qkv_split_matches_candle() {
    let (windows, heads, t) = (2, 6, 144);
    let c = heads * 32;
    let mut rng = Rng(51);
    let qkv = rng.halves(&[windows * t, 3 * c], 2.0, 0.0);
    let bias = rng.halves(&[3 * c], 0.5, 0.0);
    let scale = (32f64).powf(-0.5) as f32;
    on_devices(
        "qkv_split",
        |dev| {
            let (whole, x) = embedded(&qkv, 8, dev);
            let (q, k, v) = wavefuse_candle::qkv_split(
                &x,
                Some(&bias.to_device(dev).unwrap()),
                heads,
                t,
                scale,
            )
            .unwrap();
            let (q0, k0, v0) = wavefuse_candle::qkv_split(&x, None, heads, t, scale).unwrap();
            guards_intact(&whole, 8);
            assert_eq!(q.dims(), &[windows, heads, t, 32]);
            vec![q, k, v, q0, k0, v0]
        },
        |o| {
            let sum = qkv.broadcast_add(&bias).unwrap();
            let per_head = |x: &Tensor, i: usize| {
                x.reshape((windows, t, 3, heads, 32))
                    .unwrap()
                    .permute((2, 0, 3, 1, 4))
                    .unwrap()
                    .get(i)
                    .unwrap()
                    .contiguous()
                    .unwrap()
            };
            // k and v are the rounded sums, exactly (candle's f16 add rounds
            // the f32 sum once too); q is scaled in f32 and rounded once.
            assert_eq!(o[1], halves_of(&per_head(&sum, 1)));
            assert_eq!(o[2], halves_of(&per_head(&sum, 2)));
            assert_eq!(o[4], halves_of(&per_head(&qkv, 1)));
            let q_want: Vec<f64> = halves_of(&per_head(&sum, 0))
                .iter()
                .map(|v| v.to_f64() * f64::from(scale))
                .collect();
            // One rounding of the product (the f32 product's own rounding
            // can move a near-midpoint case by 2^-13 ulp).
            assert!(max_ulps(&o[0], &q_want) <= 0.501, "q");
            let q0_want: Vec<f64> = halves_of(&per_head(&qkv, 0))
                .iter()
                .map(|v| v.to_f64() * f64::from(scale))
                .collect();
            assert!(max_ulps(&o[3], &q0_want) <= 0.501);
        },
    );
}

/// Scores `[windows, heads, 144, 144]`, bias `[types, heads, 144, 144]`
/// and the tables of a shifted plan; returns (scores, bias, the f64 sums
/// `s + mask + bias` per element).
fn attn_inputs(p: &WindowPlan, heads: usize, seed: u64) -> (Tensor, Tensor, Vec<f64>) {
    let (w, t, types) = (p.n_windows(), p.tokens_per_window(), p.n_window_types());
    let mut rng = Rng(seed);
    let s = rng.halves(&[w, heads, t, t], 4.0, 0.0);
    let b = rng.halves(&[types, heads, t, t], 2.0, 0.0);
    let (ss, bs) = (f64s(&s), f64s(&b));
    let ty = p.window_type_table();
    let m = p.mask_slots();
    let mut z = Vec::with_capacity(ss.len());
    for wi in 0..w {
        for h in 0..heads {
            for i in 0..t * t {
                let k = (wi * heads + h) * t * t + i;
                let bias = bs[(ty[wi] as usize * heads + h) * t * t + i];
                let mask = if p.is_shifted() {
                    f64::from(m.slot_masks[m.window_to_slot[wi] as usize * t * t + i])
                } else {
                    0.0
                };
                z.push(ss[k] + mask + bias);
            }
        }
    }
    (s, b, z)
}

#[test]
fn bias_mask_softmax_and_add() {
    let heads = 2;
    for p in [
        small_plan(),
        WindowPlan::new(
            Grid3 { z: 2, h: 11, w: 22 },
            Window3 { z: 2, h: 6, w: 12 },
            Shift3 { z: 0, h: 0, w: 0 },
        )
        .unwrap(),
    ] {
        let t = p.tokens_per_window();
        let (s, b, z) = attn_inputs(&p, heads, 61);
        on_devices(
            "bias_mask_softmax",
            |dev| {
                let tables = AttnTables::from_plan(&p, dev).unwrap();
                assert_eq!(tables.has_mask(), p.is_shifted());
                let (sd, bd) = (s.to_device(dev).unwrap(), b.to_device(dev).unwrap());
                let probs = wavefuse_candle::bias_mask_softmax(&sd, &bd, &tables).unwrap();
                let inplace = sd.copy().unwrap();
                wavefuse_candle::bias_mask_softmax_(&inplace, &bd, &tables).unwrap();
                let added = sd.copy().unwrap();
                wavefuse_candle::bias_mask_add(&added, &bd, &tables).unwrap();
                assert_eq!(halves_of(&sd), halves_of(&s), "scores read only");
                vec![probs, inplace, added]
            },
            |o| {
                assert_eq!(o[0], o[1], "in place = out of place");
                let mut want = Vec::with_capacity(z.len());
                for row in z.chunks(t) {
                    let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let e: Vec<f64> = row.iter().map(|v| (v - m).exp()).collect();
                    let sum: f64 = e.iter().sum();
                    want.extend(e.iter().map(|v| v / sum));
                }
                // The contract: within 1 ulp of the f64 softmax of the f32
                // sums, which are within 2^-24 relative of these exact ones
                // (a 1e-6 relative move of a probability: 0.01 ulp is
                // slack enough).
                let e = max_ulps(&o[0], &want);
                assert!(e <= 1.01, "softmax {e} ulp");
                // bias_mask_add: the sum rounded once (its f32 adds move a
                // near-midpoint case by a hair).
                let e = max_ulps(&o[2], &z);
                assert!(e <= 0.51, "bias_mask_add {e} ulp");
            },
        );
    }
}

/// The fused window attention against the unfused wavefuse chain on the
/// emulator (both within their contracts of the exact attention; see the
/// stage test's f64 oracle) and on CUDA against the emulator: the matrix
/// units accumulate in their own order, so a few f16 ulps of the O(1)
/// outputs, not bits.
#[test]
fn window_attention_matches_unfused_chain() {
    let p = small_plan();
    let heads = 6;
    let (w, t, c) = (p.n_windows(), p.tokens_per_window(), heads * 32);
    let mut rng = Rng(91);
    let qkv = rng.halves(&[w * t, 3 * c], 2.0, 0.0);
    let qb = rng.halves(&[3 * c], 0.5, 0.0);
    let eb = rng.halves(&[p.n_window_types(), heads, t, t], 2.0, 0.0);
    let scale = (32f64).powf(-0.5) as f32;
    let mut cpu: Option<Vec<f64>> = None;
    for dev in devices() {
        let tables = AttnTables::from_plan(&p, &dev).unwrap();
        let (x, b, e) = (
            qkv.to_device(&dev).unwrap(),
            qb.to_device(&dev).unwrap(),
            eb.to_device(&dev).unwrap(),
        );
        let (whole, xv) = embedded(&x, 8, &dev);
        let o =
            wavefuse_candle::window_attention(&xv, Some(&b), &e, &tables, heads, scale).unwrap();
        guards_intact(&whole, 8);
        assert_eq!(o.dims(), &[w * t, c]);
        let got = f64s(&o);
        match &cpu {
            None => {
                let (q, k, v) = wavefuse_candle::qkv_split(&x, Some(&b), heads, t, scale).unwrap();
                let s = q.matmul(&k.t().unwrap()).unwrap();
                wavefuse_candle::bias_mask_softmax_(&s, &e, &tables).unwrap();
                let want = s
                    .matmul(&v)
                    .unwrap()
                    .transpose(1, 2)
                    .unwrap()
                    .contiguous()
                    .unwrap();
                let (max, rms) = errors(&got, &f64s(&want));
                assert!(max < 4e-3 && rms < 4e-4, "vs unfused: max {max} rms {rms}");
                cpu = Some(got);
            }
            Some(c) => {
                let (max, rms) = errors(&got, c);
                assert!(
                    max < 4e-3 && rms < 2e-4,
                    "{dev:?} vs emulator: max {max} rms {rms}"
                );
            }
        }
    }
}

#[test]
fn operand_rule_and_errors_name_op_and_argument() {
    for dev in devices() {
        let mut rng = Rng(71);
        let x = rng.halves(&[16, 192], 1.0, 0.0).to_device(&dev).unwrap();
        let err = |r: candle_core::Result<Tensor>| r.map(|_| ()).unwrap_err().to_string();
        // Non-contiguous: a transposed view.
        let xt = rng
            .halves(&[192, 16], 1.0, 0.0)
            .to_device(&dev)
            .unwrap()
            .t()
            .unwrap();
        let e = err(wavefuse_candle::layer_norm(&xt, None, EPS));
        assert!(
            e.contains("wavefuse-layer_norm") && e.contains("`x`") && e.contains("contiguous"),
            "{e}"
        );
        // Contiguous but off the 16-byte grid: element offset 1.
        let flat = x.flatten_all().unwrap();
        let off = flat
            .narrow(0, 1, 8 * 192)
            .unwrap()
            .reshape((8, 192))
            .unwrap();
        let e = err(wavefuse_candle::layer_norm(&off, None, EPS));
        assert!(
            e.contains("`x`") && e.contains("16-byte") && e.contains(".force_contiguous()"),
            "{e}"
        );
        // ... which .force_contiguous() fixes.
        assert!(wavefuse_candle::layer_norm(&off.force_contiguous().unwrap(), None, EPS).is_ok());
        // Dtype.
        let e = err(wavefuse_candle::layer_norm(
            &x.to_dtype(DType::F32).unwrap(),
            None,
            EPS,
        ));
        assert!(
            e.contains("wavefuse-layer_norm") && e.contains("`x` is F32, expected F16"),
            "{e}"
        );
        // A width without a kernel: wavefuse's error, prefixed with the op.
        let x100 = rng.halves(&[4, 104], 1.0, 0.0).to_device(&dev).unwrap();
        let e = err(wavefuse_candle::layer_norm(&x100, None, EPS));
        assert!(
            e.starts_with("wavefuse-layer_norm") && e.contains("width 104 not supported"),
            "{e}"
        );
        // Shapes.
        let g = Tensor::ones(384, DType::F16, &dev).unwrap();
        let a = Affine::new(&g, &g).unwrap();
        let e = err(wavefuse_candle::layer_norm(&x, Some(&a), EPS));
        assert!(e.contains("`affine` is [2, 384], expected [2, 192]"), "{e}");
        let r = x.copy().unwrap();
        let e = err(wavefuse_candle::add_layer_norm(
            &r,
            &x.narrow(0, 0, 8).unwrap(),
            None,
            EPS,
        ));
        assert!(
            e.contains("wavefuse-add_layer_norm") && e.contains("`branch`"),
            "{e}"
        );
        let e = err(wavefuse_candle::bias_gelu(&x, &g, GeluMode::Erf));
        assert!(
            e.contains("wavefuse-bias_gelu") && e.contains("`bias` is [384], expected [192]"),
            "{e}"
        );
        let e = err(wavefuse_candle::bias_gelu(
            &x,
            &g.narrow(0, 0, 192).unwrap().to_dtype(DType::F32).unwrap(),
            GeluMode::Erf,
        ));
        assert!(e.contains("`bias` is F32, expected F16"), "{e}");
        let plan = Plan::new(&[0, -1, 1], 2, &dev).unwrap();
        let e = err(wavefuse_candle::gather(&x, &plan));
        assert!(
            e.contains("wavefuse-gather") && e.contains("`src` is [16, 192], expected [2, width]"),
            "{e}"
        );
        let e = err(wavefuse_candle::add_layer_norm_gather(
            &r, &x, &plan, None, EPS,
        ));
        assert!(e.contains("`residual`"), "{e}");
        // A table entry out of range is caught when the plan is built.
        let e = Plan::new(&[0, 5], 2, &dev).unwrap_err().to_string();
        assert!(e.contains("table[1] = 5"), "{e}");
        let e = wavefuse_candle::qkv_split(&x, None, 6, 144, 0.1)
            .map(|_| ())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("wavefuse-qkv_split") && e.contains("`qkv` is [16, 192]"),
            "{e}"
        );
        let p = small_plan();
        let tables = AttnTables::from_plan(&p, &dev).unwrap();
        let s = Tensor::zeros((p.n_windows(), 2, 144, 144), DType::F16, &dev).unwrap();
        let bias = Tensor::zeros((p.n_window_types() + 1, 2, 144, 144), DType::F16, &dev).unwrap();
        let e = err(wavefuse_candle::bias_mask_softmax(&s, &bias, &tables));
        assert!(
            e.contains("wavefuse-bias_mask_softmax") && e.contains("`bias` is"),
            "{e}"
        );
        // In-place with the destination aliased by a source: candle's error.
        let e = wavefuse_candle::add_layer_norm(&r, &r, None, EPS)
            .unwrap_err()
            .to_string();
        assert!(e.contains("shares storage"), "{e}");
    }
}

#[test]
fn plans_are_per_device() {
    let Some(gpu) = cuda() else { return };
    let plan = Plan::new(&[0, 1], 2, &Device::Cpu).unwrap();
    let x = Tensor::zeros((2, 192), DType::F16, &gpu).unwrap();
    let e = wavefuse_candle::gather(&x, &plan).unwrap_err().to_string();
    assert!(e.contains("the plan is for Cpu"), "{e}");
}

fn errors(a: &[f64], b: &[f64]) -> (f64, f64) {
    let mut max = 0f64;
    let mut sq = 0.0;
    for (x, y) in a.iter().zip(b) {
        let d = (x - y).abs();
        max = max.max(if d.is_nan() { f64::INFINITY } else { d });
        sq += d * d;
    }
    (max, (sq / a.len() as f64).sqrt())
}

/// The ulp measure every check here uses never lets a NaN or a wrong
/// infinity pass.
#[test]
fn ulps_counts_nan_and_infinities() {
    use support::ulps;
    let one = f16::from_f32(1.0);
    assert_eq!(ulps(f16::NAN, 1.0), f64::INFINITY);
    assert_eq!(ulps(one, f64::NAN), f64::INFINITY);
    assert_eq!(ulps(f16::NAN, f64::NAN), 0.0);
    assert_eq!(ulps(f16::INFINITY, f64::INFINITY), 0.0);
    assert_eq!(ulps(f16::INFINITY, 65504.0), f64::INFINITY);
    assert_eq!(ulps(one, f64::NEG_INFINITY), f64::INFINITY);
    assert_eq!(ulps(one, 1.0), 0.0);
}

/// `gather_to_f16`: f32 rows gathered through a plan and rounded once, as
/// candle's own `to_dtype(F16)` of the same rows (both round to nearest
/// even), padding rows zero; an f16 or ragged source is refused.
#[test]
fn gather_to_f16_rounds_as_candle() {
    let n_src = 300;
    let vals: Vec<f32> = (0..n_src * 4)
        .map(|i| ((i * 7919 % 1000) as f32 - 500.0) * 0.1237 + if i % 97 == 0 { 7e4 } else { 0.0 })
        .collect();
    let table: Vec<i32> = (0..500)
        .map(|t| {
            if t % 9 == 4 {
                -1
            } else {
                ((t * 31) % n_src) as i32
            }
        })
        .collect();
    let src = Tensor::from_slice(&vals, (n_src, 4), &Device::Cpu).unwrap();
    on_devices(
        "gather_to_f16",
        |dev| {
            let plan = Plan::new(&table, n_src, dev).unwrap();
            let s = src.to_device(dev).unwrap();
            let err = wavefuse_candle::gather_to_f16(&s.to_dtype(DType::F16).unwrap(), &plan);
            assert!(err.unwrap_err().to_string().contains("F16, expected F32"));
            let ragged = s.reshape((n_src * 2, 2)).unwrap();
            assert!(wavefuse_candle::gather_to_f16(&ragged, &plan).is_err());
            vec![wavefuse_candle::gather_to_f16(&s, &plan).unwrap()]
        },
        |o| {
            let vals = &vals;
            let want: Vec<f16> = table
                .iter()
                .flat_map(|&i| {
                    (0..4).map(move |c| {
                        if i < 0 {
                            f16::ZERO
                        } else {
                            f16::from_f32(vals[i as usize * 4 + c])
                        }
                    })
                })
                .collect();
            assert_eq!(o[0].len(), want.len());
            for (k, (g, w)) in o[0].iter().zip(&want).enumerate() {
                assert_eq!(g.to_bits(), w.to_bits(), "element {k}");
            }
        },
    );
}

/// Head counts and mask sizes whose products overflow are errors, not
/// panics or wrapped sizes.
#[test]
fn overflowing_sizes_are_refused() {
    let qkv = Tensor::zeros((144, 96), DType::F16, &Device::Cpu).unwrap();
    let e = wavefuse_candle::qkv_split(&qkv, None, usize::MAX / 64, 144, 1.0).unwrap_err();
    assert!(e.to_string().contains("heads"), "{e}");
    let e = AttnTables::new(
        &[0],
        1,
        Some((&[0], usize::MAX / 2, &[0.0])),
        144,
        &Device::Cpu,
    )
    .unwrap_err();
    assert!(e.to_string().contains("mask values"), "{e}");
}
