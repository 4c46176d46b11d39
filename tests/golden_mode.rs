//! Golden mode end to end: `.npy` inputs in, the harness binary's `check`
//! subcommand on the emulator, `.npy` outputs compared with the oracles,
//! every element, in f16 ulps (the suite's own tolerances: LayerNorm by
//! `check_ln_row`, softmax and the q scale within one ulp, copies bit for
//! bit).
use half::f16;
use npyz::WriterBuilder;
use std::path::{Path, PathBuf};
use std::process::Command;
use wavefuse_suite::check::{check_ln_row, ulp_err};
use wavefuse_suite::oracle;
use wavefuse_suite::rng::Rng;

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("wavefuse-golden-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

fn save<T: npyz::Serialize + npyz::AutoSerialize + Copy>(p: &Path, shape: &[u64], data: &[T]) {
    let mut buf = Vec::new();
    let mut w = npyz::WriteOptions::<T>::new()
        .default_dtype()
        .shape(shape)
        .writer(&mut buf)
        .begin_nd()
        .expect("npy header");
    w.extend(data.iter().copied()).expect("npy data");
    w.finish().expect("npy finish");
    std::fs::write(p, buf).expect("write npy");
}

fn load(p: &Path) -> (Vec<u64>, Vec<f16>) {
    let bytes = std::fs::read(p).expect("read npy");
    let f = npyz::NpyFile::new(&bytes[..]).expect("npy");
    let shape = f.shape().to_vec();
    (shape, f.into_vec::<f16>().expect("f16 data"))
}

/// The harness binary: cargo's build of it, or `WAVEFUSE_SUITE_BIN` where
/// the test runs from the GPU bundle (away from the build tree).
fn suite_bin() -> PathBuf {
    std::env::var_os("WAVEFUSE_SUITE_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_wavefuse-suite")))
}

fn check(kernel: &str, d: &Path, args: &[&str]) {
    let mut c = Command::new(suite_bin());
    c.args(["check", kernel, "--backend", "cpu", "--out-dir"])
        .arg(d)
        .args(args);
    let out = c.output().expect("run wavefuse-suite");
    assert!(
        out.status.success(),
        "{kernel}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn halves(n: usize, seed: u32) -> Vec<f16> {
    (0..n)
        .map(|i| {
            f16::from_f32(
                (((i as u32).wrapping_mul(2654435761) ^ seed) % 2000) as f32 / 250.0 - 4.0,
            )
        })
        .collect()
}

/// Rows of width `w`: centred ones and ones with a large offset and a
/// small spread (mean 2048, sigma about 1), alternating.
fn ln_input(rows: usize, w: usize, seed: u64) -> Vec<f16> {
    let mut rng = Rng(seed);
    (0..rows)
        .flat_map(|r| {
            if r % 2 == 0 {
                rng.halves(w, 2.0, 0.25)
            } else {
                rng.halves(w, 1.0, 2048.0)
            }
        })
        .collect()
}

#[test]
fn layer_norm_from_npy() {
    let (rows, w) = (6usize, 384usize);
    let x = ln_input(rows, w, 1);
    let mut rng = Rng(11);
    let (g, b) = (rng.halves(w, 0.5, 1.0), rng.halves(w, 0.5, 0.0));
    for affine in [false, true] {
        let d = dir(if affine { "ln-affine" } else { "ln" });
        save(&d.join("x.npy"), &[rows as u64, w as u64], &x);
        save(&d.join("g.npy"), &[w as u64], &g);
        save(&d.join("b.npy"), &[w as u64], &b);
        let arg = |k: &str, f: &str| format!("{k}={}", d.join(f).display());
        let (xa, ga, ba) = (
            arg("x", "x.npy"),
            arg("gamma", "g.npy"),
            arg("beta", "b.npy"),
        );
        let mut args = vec!["--in", xa.as_str(), "--eps", "1e-6"];
        if affine {
            args.extend(["--in", ga.as_str(), "--in", ba.as_str()]);
        }
        check("layer_norm", &d, &args);
        let (shape, y) = load(&d.join("y.npy"));
        assert_eq!(shape, vec![rows as u64, w as u64]);
        for r in 0..rows {
            let (gs, bs) = if affine {
                (Some(g.as_slice()), Some(b.as_slice()))
            } else {
                (None, None)
            };
            check_ln_row(&y[r * w..(r + 1) * w], &x[r * w..(r + 1) * w], gs, bs, 1e-6)
                .unwrap_or_else(|e| panic!("affine {affine} row {r}: {e}"));
        }
    }
}

#[test]
fn gather_from_npy() {
    let d = dir("gather");
    let src = halves(4 * 192, 2);
    let idx: Vec<i32> = vec![3, -1, 0, 0, 2];
    save(&d.join("src.npy"), &[4, 192], &src);
    save(&d.join("idx.npy"), &[5], &idx);
    let (s, i) = (
        format!("src={}", d.join("src.npy").display()),
        format!("idx={}", d.join("idx.npy").display()),
    );
    check("gather", &d, &["--in", &s, "--in", &i]);
    let (shape, out) = load(&d.join("out.npy"));
    assert_eq!(shape, vec![5, 192]);
    for (t, &k) in idx.iter().enumerate() {
        let row = &out[t * 192..(t + 1) * 192];
        if k < 0 {
            assert!(row.iter().all(|v| v.to_bits() == 0));
        } else {
            assert_eq!(row, &src[k as usize * 192..(k as usize + 1) * 192]);
        }
    }
}

#[test]
fn qkv_split_from_npy() {
    let d = dir("qkv");
    let heads = 2;
    let c = heads * 32;
    let x = halves(144 * 3 * c, 3);
    save(&d.join("qkv.npy"), &[144, 3 * c as u64], &x);
    let a = format!("qkv={}", d.join("qkv.npy").display());
    check("qkv_split", &d, &["--in", &a, "--heads", "2"]);
    // out[0, h, t, d] = x[t, part * C + h*32 + d]; q scaled by 32^-0.5
    // (rounded to f32) and rounded once; k and v bit copies.
    let scale = 0.176_776_695_296_636_87_f64 as f32;
    for (part, name) in ["q", "k", "v"].into_iter().enumerate() {
        let (shape, o) = load(&d.join(format!("{name}.npy")));
        assert_eq!(shape, vec![1, 2, 144, 32]);
        for h in 0..heads {
            for t in 0..144 {
                for dd in 0..32 {
                    let got = o[(h * 144 + t) * 32 + dd];
                    let xv = x[t * 3 * c + part * c + h * 32 + dd];
                    if part == 0 {
                        let e = ulp_err(got, xv.to_f64() * f64::from(scale));
                        assert!(e <= 1.0, "q[{h},{t},{dd}] = {got}: {e} ulp");
                        assert_eq!(got, f16::from_f32(xv.to_f32() * scale), "q contract");
                    } else {
                        assert_eq!(got.to_bits(), xv.to_bits(), "{name}[{h},{t},{dd}]");
                    }
                }
            }
        }
    }
}

#[test]
fn bias_mask_softmax_from_npy() {
    let d = dir("softmax");
    let (w, h, t) = (2usize, 1usize, 144usize);
    let s = halves(w * h * t * t, 4);
    let bias = halves(h * t * t, 5);
    save(
        &d.join("s.npy"),
        &[w as u64, h as u64, t as u64, t as u64],
        &s,
    );
    save(&d.join("b.npy"), &[1, h as u64, t as u64, t as u64], &bias);
    save(&d.join("ty.npy"), &[w as u64], &[0i32, 0]);
    let arg = |k: &str, f: &str| format!("{k}={}", d.join(f).display());
    let (a1, a2, a3) = (
        arg("scores", "s.npy"),
        arg("bias", "b.npy"),
        arg("types", "ty.npy"),
    );
    check(
        "bias_mask_softmax",
        &d,
        &["--in", &a1, "--in", &a2, "--in", &a3],
    );
    let (shape, p) = load(&d.join("probs.npy"));
    assert_eq!(shape, vec![w as u64, h as u64, t as u64, t as u64]);
    for row in 0..w * h * t {
        // The contract's f32 sum (no mask here), then softmax in f64.
        let z: Vec<f64> = (0..t)
            .map(|j| f64::from(s[row * t + j].to_f32() + bias[(row % t) * t + j].to_f32()))
            .collect();
        let want = oracle::softmax_row(&z);
        for (j, (g, wv)) in p[row * t..(row + 1) * t].iter().zip(&want).enumerate() {
            let e = ulp_err(*g, *wv);
            assert!(e <= 1.0, "row {row} col {j}: {g} vs {wv} ({e:.2} ulp)");
        }
    }
}

#[test]
fn window_attention_from_npy() {
    let d = dir("attn");
    let (w, h, t) = (2usize, 2usize, 144usize);
    let c = h * 32;
    let x: Vec<f16> = halves(w * t * 3 * c, 6)
        .iter()
        .map(|v| f16::from_f32(v.to_f32() / 4.0))
        .collect();
    let bias = halves(h * t * t, 7);
    save(&d.join("x.npy"), &[(w * t) as u64, 3 * c as u64], &x);
    save(&d.join("b.npy"), &[1, h as u64, t as u64, t as u64], &bias);
    save(&d.join("ty.npy"), &[w as u64], &[0i32, 0]);
    let arg = |k: &str, f: &str| format!("{k}={}", d.join(f).display());
    let (a1, a2, a3) = (
        arg("qkv", "x.npy"),
        arg("bias", "b.npy"),
        arg("types", "ty.npy"),
    );
    check(
        "window_attention",
        &d,
        &["--in", &a1, "--in", &a2, "--in", &a3, "--heads", "2"],
    );
    let (shape, out) = load(&d.join("out.npy"));
    assert_eq!(shape, vec![(w * t) as u64, c as u64]);
    let part = |win: usize, head: usize, p: usize| -> Vec<Vec<f64>> {
        (0..t)
            .map(|tok| {
                (0..32)
                    .map(|dd| x[(win * t + tok) * 3 * c + p * c + head * 32 + dd].to_f64())
                    .collect()
            })
            .collect()
    };
    for (win, head, i) in [(0usize, 0usize, 0usize), (1, 1, 143), (1, 0, 77)] {
        let (q, k, v) = (part(win, head, 0), part(win, head, 1), part(win, head, 2));
        let b: Vec<f64> = (0..t)
            .map(|j| bias[(head * t + i) * t + j].to_f64())
            .collect();
        let scale = (1.0 / 32f64.sqrt()) as f32 as f64;
        let want =
            oracle::attention_row(&q[i], &k, &v, scale, &vec![0.0; t], &b).expect("finite row");
        for dd in 0..32 {
            let g = out[(win * t + i) * c + head * 32 + dd].to_f64();
            assert!(
                (g - want.out[dd]).abs() <= want.tol[dd],
                "window {win} head {head} row {i} ch {dd}: {g} vs {}",
                want.out[dd]
            );
        }
    }
}

#[test]
fn bad_inputs_are_reported_not_panicked() {
    let d = dir("bad");
    let out = Command::new(suite_bin())
        .args([
            "check",
            "layer_norm",
            "--backend",
            "cpu",
            "--in",
            "x=/nonexistent.npy",
            "--out-dir",
        ])
        .arg(&d)
        .output()
        .expect("run");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("nonexistent"));
}

#[test]
fn soak_subcommand_keeps_memory_flat() {
    // A few launches on the emulator (the GPU bundle runs 10^6 on CUDA):
    // the subcommand runs, checks the outputs and finds device memory flat.
    let out = Command::new(suite_bin())
        .args([
            "soak",
            "--backend",
            "cpu",
            "--launches",
            "30",
            "--only",
            "gather",
        ])
        .output()
        .expect("run wavefuse-suite soak");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The quick cases whose name holds "gather": the plain, LayerNorm and
    // add+LayerNorm gathers at two shapes, and the two affine forms.
    assert!(text.contains("0 of 8 outputs wrong"), "{text}");
}

/// A raw npy file: `descr`, memory order, the shape as written, data bytes.
fn raw_npy(descr: &str, fortran: bool, shape: &str, data: &[u8]) -> Vec<u8> {
    let mut h = format!(
        "{{'descr': '{descr}', 'fortran_order': {}, 'shape': {shape}, }}",
        if fortran { "True" } else { "False" }
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

/// Runs `check` with `args`; returns its stderr after asserting that it
/// failed.
fn refused(kernel: &str, out: &Path, args: &[&str]) -> String {
    let o = Command::new(suite_bin())
        .args(["check", kernel, "--backend", "cpu", "--out-dir"])
        .arg(out)
        .args(args)
        .output()
        .expect("run wavefuse-suite");
    let e = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(!o.status.success(), "{kernel} {args:?} was accepted: {e}");
    e
}

#[test]
fn hostile_npy_files_and_names_are_refused_and_nothing_is_written() {
    let d = dir("hostile");
    let x = halves(4 * 192, 3);
    let bytes: Vec<u8> = x.iter().flat_map(|h| h.to_le_bytes()).collect();
    let good = d.join("good.npy");
    std::fs::write(&good, raw_npy("<f2", false, "(4, 192)", &bytes)).unwrap();
    let put = |name: &str, v: Vec<u8>| -> String {
        let p = d.join(name);
        std::fs::write(&p, v).unwrap();
        format!("x={}", p.display())
    };
    let f32s: Vec<u8> = x.iter().flat_map(|h| h.to_f32().to_le_bytes()).collect();
    let mut huge_header = raw_npy("<f2", false, "(4, 192)", &[]);
    huge_header[8..10].copy_from_slice(&u16::MAX.to_le_bytes());
    let cases = [
        (
            put(
                "overflow.npy",
                raw_npy("<f2", false, "(4294967296, 4294967296, 192)", &[]),
            ),
            "more elements",
        ),
        (
            put(
                "wrap.npy",
                raw_npy("<f2", false, "(4294967296, 4294967296, 1)", &[]),
            ),
            "more elements",
        ),
        (
            put(
                "trunc.npy",
                raw_npy("<f2", false, "(4, 192)", &bytes[..bytes.len() - 2]),
            ),
            "truncated",
        ),
        (
            put(
                "trail.npy",
                raw_npy("<f2", false, "(4, 192)", &[&bytes[..], &[0u8; 6]].concat()),
            ),
            "6 trailing bytes",
        ),
        (
            put("f32.npy", raw_npy("<f4", false, "(4, 192)", &f32s)),
            "dtype <f4, expected <f2",
        ),
        (
            put("big.npy", raw_npy(">f2", false, "(4, 192)", &bytes)),
            "dtype >f2",
        ),
        (
            put("fortran.npy", raw_npy("<f2", true, "(4, 192)", &bytes)),
            "Fortran",
        ),
        (put("header.npy", huge_header), "not an npy file"),
    ];
    let out = d.join("out");
    for (arg, needle) in &cases {
        let e = refused("layer_norm", &out, &["--in", arg]);
        assert!(e.contains(needle), "{arg}: `{needle}` not in {e}");
        assert!(!out.exists(), "{arg}: the output folder was created");
    }
    let g = format!("x={}", good.display());
    let gamma = format!("gamma={}", good.display());
    for (kernel, args, needle) in [
        (
            "layer_norm",
            vec![g.as_str(), "--in", "xx=a.npy"],
            "unknown input `xx`",
        ),
        (
            "layer_norm",
            vec![g.as_str(), "--in", gamma.as_str()],
            "--in gamma needs --in beta",
        ),
        ("layer_norm", vec![gamma.as_str()], "needs --in x"),
        ("gather", vec![g.as_str()], "needs --in src"),
        (
            "layer_norm",
            vec![g.as_str(), "--in", g.as_str()],
            "--in x given twice",
        ),
        ("no_such_kernel", vec![g.as_str()], "unknown kernel"),
    ] {
        let mut a = vec!["--in"];
        a.extend(args);
        let e = refused(kernel, &out, &a);
        assert!(e.contains(needle), "{kernel} {a:?}: `{needle}` not in {e}");
        assert!(!out.exists());
    }
    // The good file runs, and only its output appears.
    check("layer_norm", &out, &["--in", &g]);
    let mut names: Vec<_> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["y.npy"]);
}
