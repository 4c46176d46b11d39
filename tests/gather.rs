//! Token gather through a validated table, on every backend present.
//!
//! Outputs must be bit-exact: source tokens copied bit for bit (NaN
//! payloads and signed zeros included), padding tokens `+0.0`, and no
//! element left holding POISON.
mod common;
mod fused;

use common::{POISON, Rng, devices};
use fused::{TABLE_KINDS, table};
use half::f16;
use proptest::prelude::*;
use wavefuse::{Device, Error, GatherPlan, gather};

/// Dedicated widths first, then widths served by the generic vector loop.
const WIDTHS: [usize; 9] = [192, 384, 768, 8, 16, 24, 136, 1000, 1536];

/// Random bit patterns: every f16 value, NaNs (with payloads) and Infs
/// included, except the POISON pattern.
fn bits(rng: &mut Rng, n: usize) -> Vec<f16> {
    (0..n)
        .map(|_| {
            let b = rng.next_u64() as u16;
            f16::from_bits(if b == POISON.to_bits() { 0x7e00 } else { b })
        })
        .collect()
}

/// Runs one gather on `dev` and checks every output element bit for bit.
fn check(dev: &Device, width: usize, tbl: &[i32], src: &[f16]) -> Result<(), String> {
    let n_src = src.len() / width;
    let plan = GatherPlan::new(dev, tbl, n_src).map_err(|e| e.to_string())?;
    let s = dev.upload(src).map_err(|e| e.to_string())?;
    let mut out = dev
        .upload(&vec![POISON; tbl.len() * width])
        .map_err(|e| e.to_string())?;
    gather(dev, &plan, &s.view(), &mut out.view_mut(), width).map_err(|e| e.to_string())?;
    let got = out.download().map_err(|e| e.to_string())?;
    for (t, &i) in tbl.iter().enumerate() {
        for c in 0..width {
            let g = got[t * width + c].to_bits();
            let w = if i < 0 {
                0
            } else {
                src[i as usize * width + c].to_bits()
            };
            if g != w {
                return Err(format!(
                    "token {t} (idx {i}) col {c}: got {g:#06x}, want {w:#06x}"
                ));
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, .. ProptestConfig::default() })]

    #[test]
    fn copies_tokens_bit_for_bit(
        seed in any::<u64>(),
        wi in 0usize..WIDTHS.len(),
        n_src in prop_oneof![1usize..4, 1usize..200],
        n_out in prop_oneof![1usize..4, 7usize..10, 30usize..34, 60usize..140],
        kind in 0u8..TABLE_KINDS,
    ) {
        let width = WIDTHS[wi];
        let mut rng = Rng(seed);
        let src = bits(&mut rng, n_src * width);
        let tbl = table(&mut rng, kind, n_out, n_src);
        for dev in devices() {
            let r = check(&dev, width, &tbl, &src);
            prop_assert!(r.is_ok(), "{} width {width}: {}", dev.info().name, r.err().unwrap_or_default());
        }
    }
}

#[test]
fn window_partition_sized_tables_every_width() {
    // Several full blocks plus a remainder, padding runs and a permutation.
    let mut rng = Rng(0x6A7);
    for &w in &WIDTHS {
        let n_src = 300;
        let src = bits(&mut rng, n_src * w);
        let tbl = table(&mut rng, 4, 517, n_src);
        for dev in devices() {
            check(&dev, w, &tbl, &src).unwrap_or_else(|e| panic!("{} w {w}: {e}", dev.info().name));
        }
    }
}

#[test]
fn plan_reports_its_shape() {
    let d = cpu();
    let p = GatherPlan::new(&d, &[2, -1, 0, -1, -1], 3).expect("valid");
    assert_eq!((p.len(), p.n_src(), p.pads()), (5, 3, 3));
    assert!(!p.is_empty());
    assert_eq!(p.table().len(), 5);
}

// ---- one test per bad input: each is rejected before any launch ----

fn cpu() -> Device {
    Device::open(wavefuse::Choice::Cpu(wavefuse::Wave::W64)).expect("cpu backend")
}

#[test]
fn plan_rejects_out_of_range_entry() {
    let d = cpu();
    let e = GatherPlan::new(&d, &[0, 1, 3], 3);
    assert!(
        matches!(&e, Err(Error::BadParameter { what: "table", value, .. }) if value.contains("table[2] = 3")),
        "{e:?}"
    );
}

#[test]
fn plan_rejects_negative_entry_other_than_pad() {
    let d = cpu();
    let e = GatherPlan::new(&d, &[0, -2], 3);
    assert!(
        matches!(&e, Err(Error::BadParameter { what: "table", value, .. }) if value.contains("table[1] = -2")),
        "{e:?}"
    );
}

#[test]
fn plan_rejects_empty_table() {
    let d = cpu();
    let e = GatherPlan::new(&d, &[], 3);
    assert!(
        matches!(e, Err(Error::Empty { what: "table", .. })),
        "{e:?}"
    );
}

#[test]
fn plan_rejects_zero_sources() {
    let d = cpu();
    let e = GatherPlan::new(&d, &[-1], 0);
    assert!(
        matches!(e, Err(Error::BadParameter { what: "n_src", .. })),
        "{e:?}"
    );
}

#[test]
fn rejects_width_not_a_multiple_of_8() {
    let d = cpu();
    let p = GatherPlan::new(&d, &[0], 1).expect("valid");
    for w in [0usize, 12, 190] {
        let s = d.upload(&vec![f16::ONE; w.max(1)]).expect("upload");
        let mut o = d.alloc::<f16>(w.max(1)).expect("alloc");
        let e = gather(&d, &p, &s.view(), &mut o.view_mut(), w);
        assert!(
            matches!(e, Err(Error::BadParameter { what: "width", .. })),
            "{e:?}"
        );
    }
}

#[test]
fn rejects_ragged_src() {
    let d = cpu();
    let p = GatherPlan::new(&d, &[0], 2).expect("valid");
    let s = d.upload(&vec![f16::ONE; 200]).expect("upload");
    let mut o = d.alloc::<f16>(192).expect("alloc");
    let e = gather(&d, &p, &s.view(), &mut o.view_mut(), 192);
    assert!(
        matches!(e, Err(Error::RaggedRows { what: "src", .. })),
        "{e:?}"
    );
}

#[test]
fn rejects_src_with_wrong_token_count() {
    let d = cpu();
    let p = GatherPlan::new(&d, &[0], 2).expect("valid");
    let s = d.upload(&vec![f16::ONE; 3 * 192]).expect("upload");
    let mut o = d.alloc::<f16>(192).expect("alloc");
    let e = gather(&d, &p, &s.view(), &mut o.view_mut(), 192);
    assert!(
        matches!(
            e,
            Err(Error::LengthMismatch {
                what: "src (tokens)",
                got: 3,
                expected: 2,
                ..
            })
        ),
        "{e:?}"
    );
}

#[test]
fn rejects_out_with_wrong_token_count() {
    let d = cpu();
    let p = GatherPlan::new(&d, &[0, -1, 1], 2).expect("valid");
    let s = d.upload(&vec![f16::ONE; 2 * 192]).expect("upload");
    let mut o = d.alloc::<f16>(2 * 192).expect("alloc");
    let e = gather(&d, &p, &s.view(), &mut o.view_mut(), 192);
    assert!(
        matches!(
            e,
            Err(Error::LengthMismatch {
                what: "out (tokens)",
                got: 2,
                expected: 3,
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
    let e = gather(
        &d,
        &p,
        &s.slice(1..193).expect("in range"),
        &mut o.slice_mut(0..192).expect("in range"),
        192,
    );
    assert!(
        matches!(e, Err(Error::Misaligned { what: "src", .. })),
        "{e:?}"
    );
    let e = gather(
        &d,
        &p,
        &s.slice(0..192).expect("in range"),
        &mut o.slice_mut(1..193).expect("in range"),
        192,
    );
    assert!(
        matches!(e, Err(Error::Misaligned { what: "out", .. })),
        "{e:?}"
    );
    // The generic path checks alignment too (width 8: a 2-byte offset).
    let e = gather(
        &d,
        &p,
        &s.slice(1..9).expect("in range"),
        &mut o.slice_mut(0..8).expect("in range"),
        8,
    );
    assert!(
        matches!(e, Err(Error::Misaligned { what: "src", .. })),
        "{e:?}"
    );
}

#[test]
fn rejects_plan_of_another_device() {
    let (d1, d2) = (cpu(), cpu());
    let p = GatherPlan::new(&d2, &[0], 1).expect("valid");
    let s = d1.upload(&vec![f16::ONE; 192]).expect("upload");
    let mut o = d1.alloc::<f16>(192).expect("alloc");
    let e = gather(&d1, &p, &s.view(), &mut o.view_mut(), 192);
    assert!(
        matches!(e, Err(Error::WrongDevice { what: "plan", .. })),
        "{e:?}"
    );
}

#[test]
fn rejects_src_of_another_device() {
    let (d1, d2) = (cpu(), cpu());
    let p = GatherPlan::new(&d1, &[0], 1).expect("valid");
    let s = d2.upload(&vec![f16::ONE; 192]).expect("upload");
    let mut o = d1.alloc::<f16>(192).expect("alloc");
    let e = gather(&d1, &p, &s.view(), &mut o.view_mut(), 192);
    assert!(
        matches!(e, Err(Error::WrongDevice { what: "src", .. })),
        "{e:?}"
    );
}
