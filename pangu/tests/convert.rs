//! `pangu convert` on ONNX files the project makes (`tests/fixtures/onnx`,
//! written by `benches/pangu_onnx.py`): the network arranged as the
//! released files are, exported by torch.onnx.export and run by
//! onnxruntime on the CPU.
//!
//! - The converted fixture, run by `pangu forecast`, gives onnxruntime's
//!   recorded output.
//! - A variant with other names, another node order and the decomposed
//!   LayerNorm converts and runs to its recorded output: the mapping is by
//!   structure.
//! - A full-depth fixture's 223 initializers map to the roles of the
//!   public name table, value by value.
//! - Damaged graphs are refused by name and leave no file behind.
use pangu::config::Geometry;
use pangu::convert::{self, OutDtype};
use pangu::onnx::{self, proto};
use prost::Message;
use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};

mod common;
use common::{ok, pangu, s};

const LAT: usize = 9;
const LON: usize = 96;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/onnx")
}

/// A fresh folder for one test.
fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("pangu-convert-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The fixture `name` (`net`, `variant`, `full`) as ONNX bytes.
fn fixture(name: &str) -> Vec<u8> {
    let gz = std::fs::read(fixtures().join(format!("{name}.onnx.gz"))).unwrap();
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(gz.as_slice())
        .read_to_end(&mut out)
        .unwrap();
    out
}

fn read_npy(path: &Path) -> Vec<f32> {
    let bytes = std::fs::read(path).unwrap();
    npyz::NpyFile::new(bytes.as_slice())
        .unwrap()
        .into_vec::<f32>()
        .unwrap()
}

/// The formulaic statistics' std per channel (the fixture's model
/// normalises with them): `[5 * 13]` then `[4]`.
fn channel_std() -> (Vec<f64>, Vec<f64>) {
    let [_, (_, us), _, (_, ss)] = pangu::weights::statistics();
    (us, ss)
}

/// The largest difference, in units of each channel's std, between
/// `pangu forecast`'s output in `dir` (lead `hours`) and the recorded
/// onnxruntime output `<name>_ort_*.npy`.
fn error_vs_ort(dir: &Path, hours: u32, name: &str) -> f64 {
    let (us, ss) = channel_std();
    let plane = LAT * LON;
    let mut worst = 0f64;
    for (kind, std) in [("upper", &us), ("surface", &ss)] {
        let got = read_npy(&dir.join(format!("output_{kind}_{hours:03}h.npy")));
        let want = read_npy(&fixtures().join(format!("{name}_ort_{kind}.npy")));
        assert_eq!(got.len(), want.len(), "{kind}");
        assert_eq!(got.len(), std.len() * plane, "{kind}");
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            let e = f64::from(g - w).abs() / std[i / plane];
            assert!(e.is_finite(), "{kind} at {i}: {g} vs {w}");
            worst = worst.max(e);
        }
    }
    worst
}

/// Converts `onnx` and runs one step on the fixture's inputs with the
/// candle build on the CPU (f32): the error against onnxruntime.
fn convert_and_forecast(dir: &Path, onnx: &Path, hours: u32, dtype: &str, name: &str) -> f64 {
    let w = dir.join(format!("w-{dtype}.safetensors"));
    let out = dir.join(format!("out-{dtype}"));
    let h = format!("{hours}h");
    ok(&[
        "convert",
        "--onnx",
        s(onnx),
        "--out",
        s(&w),
        "--interval",
        &h,
        "--dtype",
        dtype,
        "--quiet",
    ]);
    let upper = fixtures().join("input_upper.npy");
    let surface = fixtures().join("input_surface.npy");
    ok(&[
        "forecast",
        "--weights",
        &format!("{h}={}", s(&w)),
        "--upper",
        s(&upper),
        "--surface",
        s(&surface),
        "--lead",
        &h,
        "--out",
        s(&out),
        "--device",
        "cpu",
        "--build",
        "candle",
        "--dtype",
        "f32",
        "--quiet",
    ]);
    error_vs_ort(&out, hours, name)
}

/// Both run the same graph in f32 with different summation orders; the
/// measured difference is 1.6e-5 channel stds, two f32 ulps of a 1e5 m2/s2
/// geopotential over its std of 1000. The bound leaves a factor of six;
/// a wrong mapping, layout or constant gives errors of order 1.
const F32_BOUND: f64 = 1e-4;

#[test]
fn the_converted_fixture_forecasts_what_onnxruntime_computes() {
    let dir = scratch("chain");
    let onnx = dir.join("pangu_weather_24.onnx");
    std::fs::write(&onnx, fixture("net")).unwrap();
    // The interval comes from the file's name.
    let w = dir.join("w.safetensors");
    let said = ok(&["convert", "--onnx", s(&onnx), "--out", s(&w), "--quiet"]);
    assert!(
        said.contains("24h model, 9 x 96, width 32, depths 2,2,2,2"),
        "{said}"
    );
    assert!(said.contains("119 initializers"), "{said}");
    let info = ok(&["info", s(&w)]);
    assert!(info.contains("24"), "{info}");
    let e = convert_and_forecast(&dir, &onnx, 24, "f32", "net");
    eprintln!("net, f32 weights: max error vs onnxruntime {e:.2e} channel stds");
    assert!(e < F32_BOUND, "{e}");
    // f16 weights: each weight rounded to 11 significant bits (relative
    // 2^-12); through 8 blocks the output moves by about 1e-3 stds.
    let e16 = convert_and_forecast(&dir, &onnx, 24, "f16", "net");
    eprintln!("net, f16 weights: max error vs onnxruntime {e16:.2e} channel stds");
    assert!(e16 < 2e-2, "{e16}");
    assert!(e16 > e, "f16 weights should move the output: {e16} vs {e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_variant_with_other_names_order_and_layernorm_maps_by_structure() {
    let dir = scratch("variant");
    let onnx = dir.join("variant.onnx");
    let bytes = fixture("variant");
    // Nothing of the released names survives in the variant.
    let m = onnx::decode("variant", bytes.clone().into()).unwrap();
    let g = m.graph.as_ref().unwrap();
    assert!(
        g.initializer
            .iter()
            .all(|t| !t.name.contains("b1.") && !t.name.contains("onnx::"))
    );
    assert!(g.node.iter().all(|n| n.op_type != "LayerNormalization"));
    std::fs::write(&onnx, &bytes).unwrap();
    let e = convert_and_forecast(&dir, &onnx, 6, "f32", "variant");
    eprintln!("variant, f32 weights: max error vs onnxruntime {e:.2e} channel stds");
    assert!(e < F32_BOUND, "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Runs `pangu args`, which must fail with `needle` in its message.
fn fails(args: &[&str], needle: &str) {
    let o = pangu(args);
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && e.contains(needle), "{args:?}: {e}");
}

/// One csv line split at commas outside quotes.
fn csv_fields(line: &str) -> Vec<String> {
    let mut out = vec![String::new()];
    let mut quoted = false;
    for ch in line.chars() {
        match ch {
            '"' => quoted = !quoted,
            ',' if !quoted => out.push(String::new()),
            c => out.last_mut().unwrap().push(c),
        }
    }
    out
}

/// The public table's role -> the weight file's tensor.
fn tensor_of_role(role: &str) -> String {
    let fixed = [
        ("embed.upper.weight", "patch_embed.conv.weight"),
        ("embed.upper.bias", "patch_embed.conv.bias"),
        ("embed.surface.weight", "patch_embed.conv_surface.weight"),
        ("embed.surface.bias", "patch_embed.conv_surface.bias"),
        ("down.linear.weight", "downsample.reduction.weight"),
        ("down.norm.gamma", "downsample.norm.weight"),
        ("down.norm.beta", "downsample.norm.bias"),
        ("up.linear1.weight", "upsample.linear1.weight"),
        ("up.linear2.weight", "upsample.linear2.weight"),
        ("up.norm.gamma", "upsample.norm.weight"),
        ("up.norm.beta", "upsample.norm.bias"),
        ("recover.upper.weight", "patch_recovery.conv.weight"),
        ("recover.upper.bias", "patch_recovery.conv.bias"),
        (
            "recover.surface.weight",
            "patch_recovery.conv_surface.weight",
        ),
        ("recover.surface.bias", "patch_recovery.conv_surface.bias"),
    ];
    if let Some((_, t)) = fixed.iter().find(|(r, _)| *r == role) {
        return t.to_string();
    }
    // layer{l}.block{j}.{part}
    let mut it = role.splitn(3, '.');
    let l = it.next().unwrap().strip_prefix("layer").unwrap();
    let j = it.next().unwrap().strip_prefix("block").unwrap();
    let part = match it.next().unwrap() {
        "norm1.gamma" => "norm1.weight",
        "norm1.beta" => "norm1.bias",
        "norm2.gamma" => "norm2.weight",
        "norm2.beta" => "norm2.bias",
        "qkv.weight" => "attn.qkv.weight",
        "qkv.bias" => "attn.qkv.bias",
        "proj.weight" => "attn.proj.weight",
        "proj.bias" => "attn.proj.bias",
        "earth_bias" => "attn.earth_specific_bias",
        "fc1.weight" => "mlp.fc1.weight",
        "fc1.bias" => "mlp.fc1.bias",
        "fc2.weight" => "mlp.fc2.weight",
        "fc2.bias" => "mlp.fc2.bias",
        p => panic!("unknown role part {p}"),
    };
    format!("layers.{l}.blocks.{j}.{part}")
}

#[test]
fn a_full_depth_graph_maps_every_role_of_the_public_table() {
    let dir = scratch("full");
    let onnx = dir.join("full.onnx");
    std::fs::write(&onnx, fixture("full")).unwrap();
    let out = dir.join("full.safetensors");
    let opts = convert::Options {
        interval_hours: Some(24),
        dtype: OutDtype::F32,
        depths: None,
        progress: false,
    };
    let r = convert::convert(&onnx, &out, &opts).unwrap();
    assert_eq!(r.meta.depths.0, [2, 6, 6, 2]);
    let table = std::fs::read_to_string(fixtures().join("released-initializers.csv")).unwrap();
    let rows: Vec<Vec<String>> = table.lines().skip(1).map(csv_fields).collect();
    assert_eq!(rows.len(), 223);
    assert_eq!(r.mapped.len(), 223, "every initializer maps");
    let by_onnx: HashMap<&str, &str> = r
        .mapped
        .iter()
        .map(|m| (m.onnx.as_str(), m.name.as_str()))
        .collect();
    let bytes = std::fs::read(&out).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut seen = HashMap::new();
    for (k, row) in rows.iter().enumerate() {
        let (name, role, shape) = (&row[0], &row[1], &row[2]);
        let tensor = tensor_of_role(role);
        assert!(
            seen.insert(tensor.clone(), k).is_none(),
            "{role}: two roles, one tensor"
        );
        // Names the exporter derives from the modules match the table
        // exactly; `onnx::*` ids are the exporter's own and only the
        // values below tie them to their role.
        if name.starts_with("b1.") {
            assert_eq!(
                by_onnx.get(name.as_str()).copied(),
                Some(tensor.as_str()),
                "{name} ({role})"
            );
        }
        let t = st
            .tensor(&tensor)
            .unwrap_or_else(|e| panic!("{tensor}: {e}"));
        let n: usize = t.shape().iter().product();
        let want_n: usize = shape
            .split(',')
            .map(|d| d.trim().parse::<usize>().unwrap())
            .product();
        // Same element count as the released file's tensor for this role at
        // width 32 is not expected; the count is the fixture's, the value
        // is the row's.
        assert!(n > 0 && want_n > 0);
        let values: Vec<f32> = t
            .data()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        assert!(
            values.iter().all(|&v| v == k as f32),
            "{role} -> {tensor}: holds {:?}.., expected row {k}",
            &values[..4.min(values.len())]
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Decodes the `net` fixture, lets `damage` change it, writes it, and
/// converts it: the error text. Asserts that nothing is left behind.
fn refused(case: &str, damage: impl FnOnce(&mut proto::GraphProto)) -> String {
    let dir = scratch(&format!("refuse-{case}"));
    let mut m = onnx::decode("net", fixture("net").into()).unwrap();
    damage(m.graph.as_mut().unwrap());
    let onnx = dir.join("pangu_weather_24.onnx");
    std::fs::write(&onnx, m.encode_to_vec()).unwrap();
    let out = dir.join("w.safetensors");
    let o = pangu(&["convert", "--onnx", s(&onnx), "--out", s(&out), "--quiet"]);
    assert!(!o.status.success(), "{case}: converted");
    let left: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        left,
        vec!["pangu_weather_24.onnx".to_string()],
        "{case}: files left"
    );
    std::fs::remove_dir_all(&dir).unwrap();
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn init_named<'a>(g: &'a mut proto::GraphProto, name: &str) -> &'a mut proto::TensorProto {
    g.initializer.iter_mut().find(|t| t.name == name).unwrap()
}

fn constant_named<'a>(g: &'a mut proto::GraphProto, name: &str) -> &'a mut proto::TensorProto {
    let n = g.node.iter_mut().find(|n| n.name == name).unwrap();
    n.attribute[0].t.as_mut().unwrap()
}

/// Replaces a FLOAT tensor's values.
fn set_values(t: &mut proto::TensorProto, v: &[f32]) {
    t.raw_data = v
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect::<Vec<u8>>()
        .into();
}

/// The name of the Constant node whose output the first `op` node reads
/// at `slot`.
fn constant_read_by(g: &proto::GraphProto, op: &str, slot: usize) -> String {
    let v = &g.node.iter().find(|n| n.op_type == op).unwrap().input[slot];
    let n = g.node.iter().find(|n| n.output.first() == Some(v)).unwrap();
    assert_eq!(n.op_type, "Constant");
    n.name.clone()
}

/// The initializer a node reads at `slot`, found by the node's name.
fn input_of(g: &proto::GraphProto, node: &str, slot: usize) -> String {
    g.node.iter().find(|n| n.name == node).unwrap().input[slot].clone()
}

#[test]
fn damaged_graphs_are_refused_by_name_and_leave_nothing() {
    // The unchanged fixture converts (so each refusal below is the damage's).
    let dir = scratch("intact");
    let onnx = dir.join("pangu_weather_24.onnx");
    std::fs::write(&onnx, fixture("net")).unwrap();
    ok(&[
        "convert",
        "--onnx",
        s(&onnx),
        "--out",
        s(&dir.join("w.safetensors")),
        "--quiet",
    ]);
    std::fs::remove_dir_all(&dir).unwrap();

    // A missing initializer: the node that reads it is named, and the value.
    let e = refused("missing", |g| {
        g.initializer.retain(|t| t.name != "b1.a14.weight")
    });
    assert!(
        e.contains("b1.a14.weight") && e.contains("LayerNormalization"),
        "{e}"
    );

    // An extra initializer nothing reads.
    let e = refused("unread", |g| {
        let mut t = g.initializer[0].clone();
        t.name = "extra.weight".into();
        g.initializer.push(t);
    });
    assert!(
        e.contains("`extra.weight`") && e.contains("read by no node"),
        "{e}"
    );

    // An extra initializer read by a node of no known role.
    let e = refused("unknown", |g| {
        let mut t = init_named(g, "b1.a13.bias").clone();
        t.name = "extra.scale".into();
        g.initializer.push(t);
        let n = g.node.iter_mut().find(|n| n.op_type == "Softmax").unwrap();
        let x = n.input[0].clone();
        n.input[0] = "scaled".into();
        g.node.insert(
            0,
            proto::NodeProto {
                input: vec![x, "extra.scale".into()],
                output: vec!["scaled".into()],
                name: "/extra/Mul".into(),
                op_type: "Mul".into(),
                ..Default::default()
            },
        );
    });
    assert!(
        e.contains("`extra.scale`") && e.contains("/extra/Mul"),
        "{e}"
    );

    // A MatMul weight stored [out, in] (transposed, data and shape).
    let e = refused("transposed", |g| {
        let name = input_of(g, "/b1/a12/MatMul", 1);
        let t = init_named(g, &name);
        let (r, c) = (t.dims[0] as usize, t.dims[1] as usize);
        let v = onnx::f32_values(t).unwrap();
        let mut tv = vec![0f32; v.len()];
        for i in 0..r {
            for j in 0..c {
                tv[j * r + i] = v[i * c + j];
            }
        }
        t.dims = vec![c as i64, r as i64];
        set_values(t, &tv);
    });
    assert!(
        e.contains("stored [out, in]") && e.contains("onnx::MatMul_"),
        "{e}"
    );

    // A wrong-shaped Constant: the upper-air mean as [13, 1, 5, 1].
    let e = refused("constant", |g| {
        let node = constant_read_by(g, "Sub", 1);
        constant_named(g, &node).dims = vec![13, 1, 5, 1];
    });
    assert!(
        e.contains("/b1/Constant_") && e.contains("[13, 1, 5, 1]") && e.contains("mean"),
        "{e}"
    );

    // Another LayerNorm epsilon.
    let e = refused("epsilon", |g| {
        let n = g
            .node
            .iter_mut()
            .find(|n| n.op_type == "LayerNormalization")
            .unwrap();
        n.attribute
            .iter_mut()
            .find(|a| a.name == "epsilon")
            .unwrap()
            .f = 1e-6;
    });
    assert!(
        e.contains("epsilon") && e.contains("LayerNormalization node"),
        "{e}"
    );

    // The tanh GELU instead of erf.
    let e = refused("gelu", |g| {
        g.node
            .iter_mut()
            .find(|n| n.op_type == "Erf")
            .unwrap()
            .op_type = "Tanh".into();
    });
    assert!(e.contains("GELU") && e.contains("Tanh"), "{e}");

    // A weight that is not f32.
    let e = refused("dtype", |g| {
        let t = init_named(g, "b1.a13.bias");
        t.data_type = 10;
        let n = t.raw_data.len() / 2;
        t.raw_data = t.raw_data.slice(..n);
    });
    assert!(e.contains("b1.a13.bias") && e.contains("FLOAT"), "{e}");

    // A weight with data outside the file.
    let e = refused("external", |g| {
        let t = init_named(g, "b1.a13.bias");
        t.data_location = 1;
        t.raw_data = Default::default();
    });
    assert!(e.contains("b1.a13.bias") && e.contains("external"), "{e}");

    // A non-finite weight.
    let e = refused("nan", |g| {
        let t = init_named(g, "b1.a14.weight");
        let mut v = onnx::f32_values(t).unwrap();
        v[3] = f32::NAN;
        set_values(t, &v);
    });
    assert!(e.contains("norm1.weight") && e.contains("NaN"), "{e}");

    // Normalisation and de-normalisation statistics that differ.
    let e = refused("stats", |g| {
        let node = constant_read_by(g, "Div", 1);
        let t = constant_named(g, &node);
        let mut v = onnx::f32_values(t).unwrap();
        v[0] *= 1.01;
        set_values(t, &v);
    });
    assert!(
        e.contains("differ at variable") && e.contains("/b1/Constant_"),
        "{e}"
    );

    // A block without its earth-specific bias (the Add removed, its
    // reader rewired).
    let e = refused("earth", |g| {
        let rank5: Vec<String> = g
            .initializer
            .iter()
            .filter(|t| t.dims.len() == 5)
            .map(|t| t.name.clone())
            .collect();
        let k = g
            .node
            .iter()
            .position(|n| n.op_type == "Add" && rank5.contains(&n.input[1]))
            .unwrap();
        let n = g.node.remove(k);
        g.initializer.retain(|t| t.name != n.input[1]);
        for m in g.node.iter_mut() {
            for x in m.input.iter_mut() {
                if *x == n.output[0] {
                    *x = n.input[0].clone();
                }
            }
        }
    });
    assert!(e.contains("layer 0 block 0's earth-specific bias"), "{e}");
}

#[test]
fn interval_and_output_arguments_are_checked() {
    let dir = scratch("args");
    let named = dir.join("pangu_weather_6.onnx");
    std::fs::write(&named, fixture("variant")).unwrap();
    let out = dir.join("w.safetensors");
    fails(
        &[
            "convert",
            "--onnx",
            s(&named),
            "--out",
            s(&out),
            "--interval",
            "24h",
            "--quiet",
        ],
        "file name says 6h",
    );
    let plain = dir.join("model.onnx");
    std::fs::write(&plain, fixture("variant")).unwrap();
    fails(
        &["convert", "--onnx", s(&plain), "--out", s(&out), "--quiet"],
        "--interval",
    );
    fails(
        &[
            "convert",
            "--onnx",
            s(&plain),
            "--out",
            s(&plain),
            "--interval",
            "6h",
            "--quiet",
        ],
        "overwrite the input",
    );
    assert!(!out.exists());
    // The graph gives layers 1 and 2 only together; a --depths that
    // disagrees with the graph is refused.
    fails(
        &[
            "convert",
            "--onnx",
            s(&named),
            "--out",
            s(&out),
            "--depths",
            "1,2,1,1",
            "--quiet",
        ],
        "layers 1 and 2 together",
    );
    let said = ok(&["convert", "--onnx", s(&named), "--out", s(&out), "--quiet"]);
    assert!(
        said.contains("6h model") && said.contains("depths 1,1,1,1"),
        "{said}"
    );
    let w = pangu::weights::Weights::read(&out, &Geometry::new(LAT, LON).unwrap()).unwrap();
    assert_eq!(w.meta.interval_hours, Some(6));
    assert_eq!(
        convert::interval_from_name(Path::new("a/pangu_weather_24.onnx")),
        Some(24)
    );
    assert_eq!(
        convert::interval_from_name(Path::new("pangu_weather.onnx")),
        None
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
