//! Token gather through a validated table, on every backend present.
//!
//! Outputs must be bit-exact: source tokens copied bit for bit (NaN
//! payloads and signed zeros included), padding tokens `+0.0`, and no
//! element left holding POISON.
#[macro_use]
mod common;
mod fused;

use common::{POISON, Rng, cpu, devices};
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

#[test]
fn empty_table_is_a_no_op() {
    for dev in devices() {
        for n_src in [0, 2] {
            let p = GatherPlan::new(&dev, &[], n_src).expect("empty plan");
            assert!(p.is_empty());
            let s = dev.upload(&vec![f16::ONE; n_src * 192]).expect("upload");
            let mut o = dev.alloc::<f16>(0).expect("alloc");
            for w in [192, 8] {
                let s = s.slice(0..n_src * w).expect("in range");
                gather(&dev, &p, &s, &mut o.view_mut(), w).expect("no-op");
            }
        }
    }
}

/// `gather` with a plan of `table` over `n_src` sources, `src` of
/// `src.1` elements at offset `src.0` (on `src_dev`), `out` likewise.
fn try_gather(
    d: &Device,
    src_dev: &Device,
    (table, n_src): (&[i32], usize),
    src: (usize, usize),
    out: (usize, usize),
    width: usize,
) -> wavefuse::Result<()> {
    let p = GatherPlan::new(d, table, n_src)?;
    let s = src_dev.upload(&vec![f16::ONE; src.0 + src.1])?;
    let mut o = d.upload(&vec![POISON; out.0 + out.1])?;
    gather(
        d,
        &p,
        &s.slice(src.0..src.0 + src.1).expect("in range"),
        &mut o.slice_mut(out.0..out.0 + out.1).expect("in range"),
        width,
    )?;
    panic!("accepted: {:?}", o.download());
}

#[test]
fn rejects_bad_arguments_before_any_launch() {
    let (d, other) = (cpu(), cpu());
    let plan_of_other = GatherPlan::new(&other, &[0], 1).expect("valid");
    let s = d.upload(&vec![f16::ONE; 192]).expect("upload");
    let mut o = d.upload(&vec![POISON; 192]).expect("upload");
    rejects! {
        "entry past n_src": GatherPlan::new(&d, &[0, 1, 3], 3)
            => Error::BadParameter { what: "table", .. },
        "entry below -1": GatherPlan::new(&d, &[0, -2], 3)
            => Error::BadParameter { what: "table", .. },
        "entry with no sources": GatherPlan::new(&d, &[0], 0)
            => Error::BadParameter { what: "table", .. },
        "width 0": try_gather(&d, &d, (&[0], 1), (0, 8), (0, 8), 0)
            => Error::BadParameter { what: "width", .. },
        "width 12": try_gather(&d, &d, (&[0], 1), (0, 12), (0, 12), 12)
            => Error::BadParameter { what: "width", .. },
        "width 190": try_gather(&d, &d, (&[0], 1), (0, 190), (0, 190), 190)
            => Error::BadParameter { what: "width", .. },
        "ragged src": try_gather(&d, &d, (&[0], 2), (0, 200), (0, 192), 192)
            => Error::RaggedRows { what: "src", .. },
        "src tokens": try_gather(&d, &d, (&[0], 2), (0, 3 * 192), (0, 192), 192)
            => Error::LengthMismatch { what: "src (tokens)", got: 3, expected: 2, .. },
        "out tokens": try_gather(&d, &d, (&[0, -1, 1], 2), (0, 384), (0, 384), 192)
            => Error::LengthMismatch { what: "out (tokens)", got: 2, expected: 3, .. },
        "src misaligned": try_gather(&d, &d, (&[0], 1), (1, 192), (0, 192), 192)
            => Error::Misaligned { what: "src", .. },
        "out misaligned": try_gather(&d, &d, (&[0], 1), (0, 192), (1, 192), 192)
            => Error::Misaligned { what: "out", .. },
        "src misaligned, generic path": try_gather(&d, &d, (&[0], 1), (1, 8), (0, 8), 8)
            => Error::Misaligned { what: "src", .. },
        "src of another device": try_gather(&d, &other, (&[0], 1), (0, 192), (0, 192), 192)
            => Error::WrongDevice { what: "src", .. },
        "plan of another device": gather(&d, &plan_of_other, &s.view(), &mut o.view_mut(), 192)
            => Error::WrongDevice { what: "plan", .. },
    }
    assert!(
        o.download()
            .expect("download")
            .iter()
            .all(|v| v.to_bits() == POISON.to_bits())
    );
}
