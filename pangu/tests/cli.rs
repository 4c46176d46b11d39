//! `pangu` as a user runs it, on a small grid (9 x 96) with seeded
//! weights of reduced depth and width, on the CPU: a forecast end to end,
//! a rollout against single steps, the writer thread against a synchronous
//! write, and every bad input refused before anything is computed or
//! written.
use candle_core::{Device, Tensor};
use pangu::config::{BlockOrder, Depths, Geometry};
use pangu::fields::{self, Kind};
use pangu::forecast::{self, Outputs};
use pangu::model::{Build, Options, Pangu};
use pangu::weights::{self, Meta, Weights};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

mod common;
use common::{ok, pangu, s};

const LAT: usize = 9;
const LON: usize = 96;

/// A fresh folder for one test.
fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("pangu-cli-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

struct Setup {
    dir: PathBuf,
    w24: PathBuf,
    w6: PathBuf,
    upper: PathBuf,
    surface: PathBuf,
}

/// Seeded 24 h and 6 h models and seeded inputs, made once by the command.
fn setup() -> &'static Setup {
    static SETUP: OnceLock<Setup> = OnceLock::new();
    SETUP.get_or_init(|| {
        let dir = scratch("setup");
        let (w24, w6) = (dir.join("w24.safetensors"), dir.join("w6.safetensors"));
        let small = ["--grid", "9x96", "--depths", "1,1,1,1", "--width", "32"];
        let out = ok(&[
            &["random-weights", "--out", s(&w24), "--inputs", s(&dir)][..],
            &small,
        ]
        .concat());
        assert!(out.contains("9 x 96") && out.contains("width 32"), "{out}");
        ok(&[
            &[
                "random-weights",
                "--out",
                s(&w6),
                "--interval",
                "6",
                "--seed",
                "2",
            ][..],
            &small,
        ]
        .concat());
        Setup {
            upper: dir.join("input_upper.npy"),
            surface: dir.join("input_surface.npy"),
            dir,
            w24,
            w6,
        }
    })
}

fn forecast_args<'a>(st: &'a Setup, out: &'a Path, lead: &'a str) -> Vec<&'a str> {
    vec![
        "forecast",
        "--weights",
        s(&st.w24),
        "--upper",
        s(&st.upper),
        "--surface",
        s(&st.surface),
        "--lead",
        lead,
        "--out",
        s(out),
        "--device",
        "cpu",
        "--quiet",
    ]
}

fn files_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|r| {
            r.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

#[test]
fn forecast_with_two_models_writes_each_chosen_step() {
    let st = setup();
    let out = scratch("e2e").join("out");
    let w24 = format!("24h={}", s(&st.w24));
    let w6 = format!("6h={}", s(&st.w6));
    let mut args = forecast_args(st, &out, "54h");
    args[2] = &w24;
    args.extend(["--weights", &w6, "--every", "24h"]);
    let stdout = ok(&args);
    // 54 h = 24 + 24 + 6; --every 24h writes +24h and +48h, and the last.
    assert!(
        stdout.contains("forecast +54h: 3 steps (24h 24h 6h)"),
        "{stdout}"
    );
    assert!(stdout.contains("per step median"), "{stdout}");
    assert_eq!(
        files_in(&out),
        [
            "output_surface_024h.npy",
            "output_surface_048h.npy",
            "output_surface_054h.npy",
            "output_upper_024h.npy",
            "output_upper_048h.npy",
            "output_upper_054h.npy"
        ]
    );
    for lead in [24, 48, 54] {
        let (pu, ps) = forecast::output_paths(&out, lead);
        let u = fields::read(&pu, Kind::Upper, "out").unwrap();
        let f = fields::read(&ps, Kind::Surface, "out").unwrap();
        assert_eq!(
            (u.shape, f.shape),
            (vec![5, 13, LAT, LON], vec![4, LAT, LON])
        );
    }
    // The 24 h model given as a 6 h one is refused.
    let bad = format!("6h={}", s(&st.w24));
    let bad_out = scratch("e2e-bad").join("out");
    let mut args = forecast_args(st, &bad_out, "6h");
    args[2] = &bad;
    let e = String::from_utf8_lossy(&pangu(&args).stderr).into_owned();
    assert!(e.contains("a 24h model given as 6h"), "{e}");
}

#[test]
fn a_rollout_equals_its_single_steps_bit_for_bit() {
    let st = setup();
    let dir = scratch("rollout");
    let w = format!("24h={}", s(&st.w24));
    let three = dir.join("three");
    let mut args = forecast_args(st, &three, "72h");
    args[2] = &w;
    ok(&args);
    let (mut u, mut f) = (st.upper.clone(), st.surface.clone());
    for k in 1..=3u32 {
        let one = dir.join(format!("one{k}"));
        let args = [
            "forecast",
            "--weights",
            &w,
            "--upper",
            s(&u),
            "--surface",
            s(&f),
            "--lead",
            "24h",
            "--out",
            s(&one),
            "--device",
            "cpu",
            "--quiet",
        ];
        ok(&args);
        (u, f) = forecast::output_paths(&one, 24);
        let (ru, rf) = forecast::output_paths(&three, 24 * k);
        assert!(
            std::fs::read(&u).unwrap() == std::fs::read(&ru).unwrap()
                && std::fs::read(&f).unwrap() == std::fs::read(&rf).unwrap(),
            "step {k} of the rollout differs from {k} single steps"
        );
    }
}

#[test]
fn the_writer_thread_writes_what_a_synchronous_write_writes() {
    let st = setup();
    let g = Geometry::new(LAT, LON).unwrap();
    let w = Weights::read(&st.w24, &g).unwrap();
    let m = Pangu::load(
        &w,
        g,
        &Device::Cpu,
        Options::new(Build::Candle, candle_core::DType::F32),
    )
    .unwrap();
    let models = BTreeMap::from([(24, m)]);
    let u = fields::read(&st.upper, Kind::Upper, "u").unwrap();
    let f = fields::read(&st.surface, Kind::Surface, "s").unwrap();
    let dir = scratch("writer");
    let mut written = Vec::new();
    for background in [true, false] {
        let out = dir.join(format!("bg-{background}"));
        std::fs::create_dir_all(&out).unwrap();
        let (ut, ft) = (
            Tensor::from_slice(&u.data, u.shape.as_slice(), &Device::Cpu).unwrap(),
            Tensor::from_slice(&f.data, f.shape.as_slice(), &Device::Cpu).unwrap(),
        );
        let outputs = Outputs {
            dir: &out,
            every: None,
            background,
        };
        let r = forecast::rollout(&models, &[24, 24], ut, ft, outputs, |_| {}).unwrap();
        assert_eq!(r.steps.len(), 2);
        let bytes: Vec<Vec<u8>> = files_in(&out)
            .iter()
            .map(|n| std::fs::read(out.join(n)).unwrap())
            .collect();
        assert_eq!(bytes.len(), 4);
        written.push(bytes);
    }
    assert!(
        written[0] == written[1],
        "background and inline writes differ"
    );
}

/// A weight file's tensor: name, shape, values.
type Entry = (String, Vec<usize>, Vec<f32>);

/// An npy file: `descr`, memory order, shape, raw data.
fn npy(descr: &str, fortran: bool, shape: &[usize], data: &[u8]) -> Vec<u8> {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    let mut h = format!(
        "{{'descr': '{descr}', 'fortran_order': {}, 'shape': ({},), }}",
        if fortran { "True" } else { "False" },
        dims.join(", ")
    );
    while (10 + h.len() + 1) % 64 != 0 {
        h.push(' ');
    }
    h.push('\n');
    let mut v = b"\x93NUMPY\x01\x00".to_vec();
    v.extend((h.len() as u16).to_le_bytes());
    v.extend(h.as_bytes());
    v.extend(data);
    v
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

#[test]
fn bad_inputs_are_refused_by_name_before_anything_is_written() {
    let st = setup();
    let dir = scratch("bad");
    let g = Geometry::new(LAT, LON).unwrap();
    let u = fields::read(&st.upper, Kind::Upper, "u").unwrap();
    let f = fields::read(&st.surface, Kind::Surface, "s").unwrap();
    let put = |name: &str, bytes: Vec<u8>| -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, bytes).unwrap();
        p
    };
    let ushape = [5, 13, LAT, LON];
    let good = npy("<f4", false, &ushape, &f32_bytes(&u.data));
    // The test's npy writer makes files the reader takes as they are.
    let back = fields::read(&put("good.npy", good.clone()), Kind::Upper, "good").unwrap();
    assert!(back == u, "the test's npy writer");
    let mut trunc = good.clone();
    trunc.truncate(good.len() - 10);
    let mut trailing = good.clone();
    trailing.extend([0u8; 8]);
    let mut nan = u.data.clone();
    // T (variable 2) at 500 hPa (level 5), lat 3, lon 7.
    nan[((2 * 13 + 5) * LAT + 3) * LON + 7] = f32::NAN;
    let mut inf = f.data.clone();
    inf[(LAT + 4) * LON] = f32::INFINITY; // U10, lat 4, lon 0
    let big: Vec<u8> = u.data.iter().flat_map(|x| x.to_be_bytes()).collect();
    let f64s: Vec<u8> = u
        .data
        .iter()
        .flat_map(|&x| f64::from(x).to_le_bytes())
        .collect();
    let uppers = [
        (
            put(
                "shape.npy",
                npy(
                    "<f4",
                    false,
                    &[5, 12, LAT, LON],
                    &f32_bytes(&u.data[..5 * 12 * LAT * LON]),
                ),
            ),
            vec!["shape.npy", "[5, 12, 9, 96]", "[5, 13, lat, lon]"],
        ),
        (
            put(
                "overflow.npy",
                npy("<f4", false, &[5, 13, 1 << 31, 1 << 31], &[]),
            ),
            vec!["overflow.npy", "more elements than memory can hold"],
        ),
        (
            put("f64.npy", npy("<f8", false, &ushape, &f64s)),
            vec!["f64.npy", "<f8", "<f4"],
        ),
        (
            put("big.npy", npy(">f4", false, &ushape, &big)),
            vec!["big.npy", "big-endian"],
        ),
        (
            put(
                "fortran.npy",
                npy("<f4", true, &ushape, &f32_bytes(&u.data)),
            ),
            vec!["fortran.npy", "Fortran order"],
        ),
        (put("trunc.npy", trunc), vec!["trunc.npy", "truncated"]),
        (
            put("trailing.npy", trailing),
            vec!["trailing.npy", "8 trailing bytes"],
        ),
        (
            put("nan.npy", npy("<f4", false, &ushape, &f32_bytes(&nan))),
            vec!["nan.npy", "NaN", "T 500 hPa", "lat index 3, lon index 7"],
        ),
    ];
    let w24 = format!("24h={}", s(&st.w24));
    let run_case =
        |upper: &Path, surface: &Path, weights: &str, lead: &str, out: &Path, needles: &[&str]| {
            let o = pangu(&[
                "forecast",
                "--weights",
                weights,
                "--upper",
                s(upper),
                "--surface",
                s(surface),
                "--lead",
                lead,
                "--out",
                s(out),
                "--device",
                "cpu",
                "--quiet",
            ]);
            let e = String::from_utf8_lossy(&o.stderr);
            assert!(!o.status.success(), "accepted: {needles:?}");
            for n in needles {
                assert!(e.contains(n), "`{n}` not in: {e}");
            }
        };
    for (i, (upper, needles)) in uppers.iter().enumerate() {
        let out = dir.join(format!("out-upper-{i}"));
        run_case(upper, &st.surface, &w24, "24h", &out, needles);
        assert!(!out.exists(), "{needles:?}: {} was created", out.display());
    }
    let inf_s = put(
        "inf.npy",
        npy("<f4", false, &[4, LAT, LON], &f32_bytes(&inf)),
    );
    let out = dir.join("out-inf");
    run_case(
        &st.upper,
        &inf_s,
        &w24,
        "24h",
        &out,
        &["inf.npy", "inf", "U10, lat index 4, lon index 0"],
    );
    assert!(!out.exists());

    // Weight files: missing, a tensor misnamed, a tensor misshaped, another grid.
    let meta = Meta {
        order: BlockOrder::Post,
        interval_hours: Some(24),
        grid: Some((LAT, LON)),
        depths: Depths([1, 1, 1, 1]),
        width: 32,
    };
    let edited = |name: &str, edit: &dyn Fn(&mut Entry)| -> String {
        let mut t = weights::seeded_tensors(&g, &meta, 1);
        for e in t.iter_mut() {
            if e.0 == "patch_embed.conv.bias" {
                edit(e);
            }
        }
        let p = dir.join(name);
        weights::write_file(&p, &t, &meta).unwrap();
        format!("24h={}", s(&p))
    };
    let misnamed = edited("misnamed.safetensors", &|e| {
        e.0 = "patch_embed.conv.b".into()
    });
    let misshaped = edited("misshaped.safetensors", &|e| {
        e.1 = vec![16];
        e.2.truncate(16);
    });
    let other = dir.join("other.safetensors");
    ok(&[
        "random-weights",
        "--grid",
        "25x96",
        "--depths",
        "1,1,1,1",
        "--width",
        "32",
        "--out",
        s(&other),
    ]);
    let missing = format!("24h={}", s(&dir.join("nowhere.safetensors")));
    let other = format!("24h={}", s(&other));
    for (weights, needles) in [
        (&missing, vec!["nowhere.safetensors"]),
        (
            &misnamed,
            vec![
                "misnamed.safetensors",
                "`patch_embed.conv.bias` missing",
                "patch_embed.conv.b",
            ],
        ),
        (
            &misshaped,
            vec![
                "misshaped.safetensors",
                "patch_embed.conv.bias",
                "[16]",
                "[32]",
            ],
        ),
        (&other, vec!["other.safetensors", "25 x 96", "9 x 96"]),
    ] {
        let out = dir.join("out-weights");
        run_case(&st.upper, &st.surface, weights, "24h", &out, &needles);
        assert!(!out.exists(), "{needles:?}");
    }

    // A lead the models cannot reach names the intervals there are.
    let out = dir.join("out-lead");
    run_case(
        &st.upper,
        &st.surface,
        &w24,
        "30h",
        &out,
        &["--lead", "30h", "24h"],
    );
    assert!(!out.exists());

    // Output folders that cannot be made, or are a file.
    let file = put("a-file", vec![1, 2, 3]);
    run_case(
        &st.upper,
        &st.surface,
        &w24,
        "24h",
        &file.join("out"),
        &["--out", "cannot be created"],
    );
    run_case(
        &st.upper,
        &st.surface,
        &w24,
        "24h",
        &file,
        &["--out", "is a file"],
    );
    assert_eq!(std::fs::read(&file).unwrap(), [1, 2, 3]);

    // An output that would overwrite an input.
    let shared = dir.join("shared");
    std::fs::create_dir_all(&shared).unwrap();
    let clash = shared.join("output_upper_024h.npy");
    std::fs::copy(&st.upper, &clash).unwrap();
    run_case(
        &clash,
        &st.surface,
        &w24,
        "24h",
        &shared,
        &["--out", "would overwrite the --upper file"],
    );
    assert_eq!(files_in(&shared), ["output_upper_024h.npy"]);
    assert_eq!(
        std::fs::read(&clash).unwrap(),
        std::fs::read(&st.upper).unwrap()
    );
}

#[test]
fn info_lists_and_checks_a_weight_file() {
    let st = setup();
    let out = ok(&["info", s(&st.w6)]);
    for n in [
        "interval_hours = 6",
        "lat = 9",
        "width = 32",
        "patch_embed.conv.weight",
        "[32, 6, 2, 4, 4]",
        "accepted: 9 x 96 grid, interval 6h, post order, depths 1,1,1,1, width 32",
    ] {
        assert!(out.contains(n), "`{n}` not in: {out}");
    }
    let e = pangu(&["info", s(&st.dir.join("input_upper.npy"))]);
    assert!(!e.status.success());
    assert!(String::from_utf8_lossy(&e.stderr).contains("not a safetensors file"));
    let e = pangu(&[
        "random-weights",
        "--grid",
        "9by96",
        "--out",
        s(&st.dir.join("x")),
    ]);
    assert!(String::from_utf8_lossy(&e.stderr).contains("--grid"));
    assert!(!st.dir.join("x").exists());
}
