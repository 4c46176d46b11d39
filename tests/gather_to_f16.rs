//! Gather of rows of four `f32` into rows of four halves, on every backend
//! present: each output is the source value rounded to nearest even
//! (`half::f16::from_f32`, a software rounding apart from the kernels':
//! core's `as f16` on the emulator and gfx9, `cvt.rn.f16x2.f32` on NVIDIA),
//! NaN stays NaN, padding rows are `+0.0`, and no element keeps POISON.
#[macro_use]
mod common;
mod fused;

use common::{POISON, Rng, cpu, devices};
use fused::{TABLE_KINDS, table};
use half::f16;
use proptest::prelude::*;
use wavefuse::{Device, Error, GATHER_F32_ROW, GatherPlan, gather_to_f16};

const R: usize = GATHER_F32_ROW;

/// Floats that probe the rounding: any bit pattern (NaN, Inf, f32
/// subnormals), halfway cases between adjacent halves (ties to even), the
/// overflow boundary (65504 stays, 65520 and up become infinity), the f16
/// subnormal range, and ordinary values.
fn floats(rng: &mut Rng, n: usize) -> Vec<f32> {
    (0..n)
        .map(|_| {
            let u = rng.next_u64();
            match u % 6 {
                0 => f32::from_bits((u >> 32) as u32),
                1 => {
                    // Midway between two adjacent halves, either sign.
                    let h = f16::from_bits((u >> 20) as u16 & 0x7bff);
                    let next = f16::from_bits(h.to_bits() + 1);
                    let m = (h.to_f64() + next.to_f64()) / 2.0;
                    (if u & 1 == 0 { m } else { -m }) as f32
                }
                2 => [65504.0, 65519.99, 65520.0, 65536.0, 1e30, -65520.0][(u >> 8) as usize % 6],
                3 => ((u >> 16) as u32 as f32 / u32::MAX as f32) * 1.2e-4,
                4 => [
                    0.0,
                    -0.0,
                    f32::INFINITY,
                    f32::NEG_INFINITY,
                    f32::NAN,
                    5.96e-8,
                ][(u >> 8) as usize % 6],
                _ => (((u >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0) as f32 * 300.0,
            }
        })
        .collect()
}

/// One gather on `dev`, every output checked against the rounding of its
/// source value.
fn check(dev: &Device, tbl: &[i32], src: &[f32]) -> Result<(), String> {
    let n_src = src.len() / R;
    let e = |e: wavefuse::Error| e.to_string();
    let plan = GatherPlan::new(dev, tbl, n_src).map_err(e)?;
    let s = dev.upload(src).map_err(e)?;
    let mut out = dev.upload(&vec![POISON; tbl.len() * R]).map_err(e)?;
    gather_to_f16(dev, &plan, &s.view(), &mut out.view_mut()).map_err(e)?;
    let got = out.download().map_err(e)?;
    for (t, &i) in tbl.iter().enumerate() {
        for c in 0..R {
            let g = got[t * R + c];
            let (ok, want) = if i < 0 {
                (g.to_bits() == 0, f16::ZERO)
            } else {
                let w = f16::from_f32(src[i as usize * R + c]);
                (
                    if w.is_nan() {
                        g.is_nan()
                    } else {
                        g.to_bits() == w.to_bits()
                    },
                    w,
                )
            };
            if !ok {
                return Err(format!(
                    "row {t} (idx {i}) col {c}: got {:#06x}, want {:#06x}",
                    g.to_bits(),
                    want.to_bits()
                ));
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, .. ProptestConfig::default() })]

    #[test]
    fn rounds_each_gathered_value_to_nearest_even(
        seed in any::<u64>(),
        n_src in prop_oneof![1usize..4, 1usize..300],
        n_out in prop_oneof![1usize..4, 250usize..270, 500usize..700],
        kind in 0u8..TABLE_KINDS,
    ) {
        let mut rng = Rng(seed);
        let src = floats(&mut rng, n_src * R);
        let tbl = table(&mut rng, kind, n_out, n_src);
        for dev in devices() {
            let r = check(&dev, &tbl, &src);
            prop_assert!(r.is_ok(), "{}: {}", dev.info().name, r.err().unwrap_or_default());
        }
    }
}

/// The embedding's shape of table: many workgroups, a padded tail.
#[test]
fn patch_sized_table() {
    let mut rng = Rng(7);
    let n_src = 2000;
    let src = floats(&mut rng, n_src * R);
    let tbl: Vec<i32> = (0..5000)
        .map(|t| {
            if t % 7 == 6 {
                -1
            } else {
                ((t * 13) % n_src) as i32
            }
        })
        .collect();
    for dev in devices() {
        check(&dev, &tbl, &src).unwrap_or_else(|e| panic!("{}: {e}", dev.info().name));
    }
}

/// `gather_to_f16` with a plan of `table` over `n_src` rows, `src` of
/// `src.1` floats at offset `src.0`, `out` of `out.1` halves at `out.0`.
fn try_gather(
    d: &Device,
    (table, n_src): (&[i32], usize),
    src: (usize, usize),
    out: (usize, usize),
) -> wavefuse::Result<()> {
    let p = GatherPlan::new(d, table, n_src)?;
    let s = d.upload(&vec![1.0f32; src.0 + src.1])?;
    let mut o = d.upload(&vec![POISON; out.0 + out.1])?;
    gather_to_f16(
        d,
        &p,
        &s.slice(src.0..src.0 + src.1).expect("in range"),
        &mut o.slice_mut(out.0..out.0 + out.1).expect("in range"),
    )?;
    panic!("accepted: {:?}", o.download());
}

#[test]
fn rejects_bad_arguments_before_any_launch() {
    let (d, other) = (cpu(), cpu());
    let plan_of_other = GatherPlan::new(&other, &[0], 1).expect("valid");
    let s = d.upload(&[1.0f32; 4]).expect("upload");
    let mut o = d.upload(&[POISON; 4]).expect("upload");
    rejects! {
        "ragged src": try_gather(&d, (&[0], 2), (0, 6), (0, 4))
            => Error::RaggedRows { what: "src", .. },
        "src rows": try_gather(&d, (&[0], 2), (0, 12), (0, 4))
            => Error::LengthMismatch { what: "src (tokens)", got: 3, expected: 2, .. },
        "out rows": try_gather(&d, (&[0, -1, 1], 2), (0, 8), (0, 8))
            => Error::LengthMismatch { what: "out (tokens)", got: 2, expected: 3, .. },
        "src misaligned": try_gather(&d, (&[0], 1), (1, 4), (0, 4))
            => Error::Misaligned { what: "src", .. },
        "out misaligned": try_gather(&d, (&[0], 1), (0, 4), (4, 4))
            => Error::Misaligned { what: "out", .. },
        "plan of another device": gather_to_f16(&d, &plan_of_other, &s.view(), &mut o.view_mut())
            => Error::WrongDevice { what: "plan", .. },
    }
    assert!(
        o.download()
            .expect("download")
            .iter()
            .all(|v| v.to_bits() == POISON.to_bits())
    );
}

#[test]
fn empty_table_is_a_no_op() {
    for dev in devices() {
        let p = GatherPlan::new(&dev, &[], 0).expect("empty plan");
        let s = dev.upload::<f32>(&[]).expect("upload");
        let mut o = dev.upload::<f16>(&[]).expect("upload");
        gather_to_f16(&dev, &p, &s.view(), &mut o.view_mut()).expect("no-op");
    }
}
