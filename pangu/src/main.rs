//! `pangu`: Pangu-Weather forecasts from npy fields.
//!
//! ```text
//! pangu random-weights --grid full|tiny|LATxLON --seed N --out w.safetensors [--inputs DIR]
//! pangu info w.safetensors
//! pangu convert --onnx pangu_weather_24.onnx --out 24h.safetensors [--interval 24h] [--dtype f16|f32]
//! pangu forecast --weights 24h=w24.safetensors [--weights 6h=w6.safetensors]
//!     --upper input_upper.npy --surface input_surface.npy --lead 168h --out DIR [--every 24h]
//! pangu bench --weights w.safetensors --upper U.npy --surface S.npy --json OUT
//! ```
use candle_core::{DType, Device, Tensor};
use clap::{Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use pangu::config::{self, BlockOrder, Depths, Geometry};
use pangu::convert;
use pangu::error::{Error, Result};
use pangu::fields::{self, Field, Kind};
use pangu::forecast;
use pangu::memory;
use pangu::model::{Build, Options, Pangu};
use pangu::weights::{self, Meta, Weights};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

#[derive(Parser)]
#[command(name = "pangu", about = "Pangu-Weather forecasts on candle + wavefuse")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(clap::Args, Clone)]
struct Run {
    /// `auto` (CUDA when present), `cuda` or `cpu`.
    #[arg(long, default_value = "auto")]
    device: String,
    /// `wavefuse` (fused kernels, f16) or `candle` (candle's own ops);
    /// default: wavefuse on CUDA, candle on the CPU.
    #[arg(long)]
    build: Option<String>,
    /// `f16`, `f32` or `f64` (candle build only); default: f16 on CUDA,
    /// f32 on the CPU.
    #[arg(long)]
    dtype: Option<String>,
    /// Row chunks of each post-norm block's MLP half (wavefuse build;
    /// 1: none). More chunks, lower peak device memory, same output.
    #[arg(long, default_value_t = pangu::model::DEFAULT_MLP_CHUNKS)]
    mlp_chunks: usize,
}

#[derive(Subcommand)]
enum Cmd {
    /// Writes seeded weights in the model's format (and, with --inputs,
    /// seeded input fields): a first try without the released weights.
    RandomWeights {
        /// The weight file to write.
        #[arg(long)]
        out: PathBuf,
        /// `full` (721 x 1440, the official grid), `tiny` (25 x 96) or
        /// `LATxLON` (longitudes a multiple of 96).
        #[arg(long, default_value = "full")]
        grid: String,
        /// Block order: post (the released model) or pre.
        #[arg(long, default_value = "post")]
        order: String,
        /// Seed of the generator.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// The model's interval, hours.
        #[arg(long, default_value_t = 24)]
        interval: u32,
        /// Blocks per layer (the released model's 2,6,6,2; fewer for
        /// quick checks).
        #[arg(long, default_value = "2,6,6,2")]
        depths: String,
        /// Channels of the first scale (the released model's 192; the
        /// candle build also runs smaller multiples of 32).
        #[arg(long, default_value_t = 192)]
        width: usize,
        /// Also write input_upper.npy and input_surface.npy here.
        #[arg(long)]
        inputs: Option<PathBuf>,
    },
    /// Lists a weight file: metadata, grid, interval, tensors and size,
    /// and whether the model accepts it.
    Info {
        /// The weight file.
        file: PathBuf,
    },
    /// Converts a released ONNX file (`pangu_weather_{1,3,6,24}.onnx`) to
    /// the model's weight file, mapping every initializer by the graph's
    /// structure.
    Convert {
        /// The ONNX file.
        #[arg(long)]
        onnx: PathBuf,
        /// The weight file to write (appears complete or not at all).
        #[arg(long)]
        out: PathBuf,
        /// The model's interval, e.g. 24h (default: from a file named
        /// pangu_weather_N.onnx).
        #[arg(long)]
        interval: Option<String>,
        /// `f32` (as in the file) or `f16` (the learned weights; the
        /// statistics and constant fields stay f32).
        #[arg(long, default_value = "f32")]
        dtype: String,
        /// Blocks per layer, when layers 1 and 2 do not split in halves.
        #[arg(long)]
        depths: Option<String>,
        /// Also list every initializer and the tensor it became.
        #[arg(long)]
        list: bool,
        /// No progress bar.
        #[arg(long)]
        quiet: bool,
    },
    /// Runs a forecast to --lead with the models given.
    Forecast {
        /// `INTERVAL=FILE`, e.g. `24h=pangu_weather_24.safetensors`;
        /// repeat for more models.
        #[arg(long = "weights", required = true)]
        weights: Vec<String>,
        /// Upper-air fields `[5, 13, lat, lon]` f32.
        #[arg(long)]
        upper: PathBuf,
        /// Surface fields `[4, lat, lon]` f32.
        #[arg(long)]
        surface: PathBuf,
        /// Lead time, e.g. `168h` or `7d`.
        #[arg(long)]
        lead: String,
        /// Output folder (created).
        #[arg(long)]
        out: PathBuf,
        /// Write the steps whose lead is a multiple of this (e.g. 24h;
        /// the last step is always written). Default: every step.
        #[arg(long)]
        every: Option<String>,
        #[command(flatten)]
        run: Run,
        /// Also write the summary as JSON here.
        #[arg(long)]
        json: Option<PathBuf>,
        /// No progress bar.
        #[arg(long)]
        quiet: bool,
    },
    /// Times the GPU-resident step (fields on the device in and out).
    Bench {
        /// The weight file.
        #[arg(long)]
        weights: PathBuf,
        /// Upper-air fields.
        #[arg(long)]
        upper: PathBuf,
        /// Surface fields.
        #[arg(long)]
        surface: PathBuf,
        #[command(flatten)]
        run: Run,
        /// Untimed steps first.
        #[arg(long, default_value_t = 5)]
        warmup: usize,
        /// Timed steps.
        #[arg(long, default_value_t = 20)]
        steps: usize,
        /// Also write one step's output here (the model-regression gate
        /// reads it) and time one step's device-to-host copy plus write.
        #[arg(long)]
        write_dir: Option<PathBuf>,
        /// JSON record.
        #[arg(long)]
        json: Option<PathBuf>,
    },
}

fn main() {
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::RandomWeights {
            out,
            grid,
            order,
            seed,
            interval,
            depths,
            width,
            inputs,
        } => random_weights(
            &out,
            &grid,
            &order,
            seed,
            interval,
            &depths,
            width,
            inputs.as_deref(),
        ),
        Cmd::Info { file } => info(&file),
        Cmd::Convert {
            onnx,
            out,
            interval,
            dtype,
            depths,
            list,
            quiet,
        } => convert(
            &onnx,
            &out,
            interval.as_deref(),
            &dtype,
            depths.as_deref(),
            list,
            quiet,
        ),
        Cmd::Forecast {
            weights,
            upper,
            surface,
            lead,
            out,
            every,
            run,
            json,
            quiet,
        } => run_forecast(
            &weights,
            &upper,
            &surface,
            &lead,
            &out,
            every.as_deref(),
            &run,
            json.as_deref(),
            quiet,
        ),
        Cmd::Bench {
            weights,
            upper,
            surface,
            run,
            warmup,
            steps,
            write_dir,
            json,
        } => bench(
            &weights,
            &upper,
            &surface,
            &run,
            warmup,
            steps,
            write_dir.as_deref(),
            json.as_deref(),
        ),
    };
    if let Err(e) = r {
        eprintln!("pangu: error: {e}");
        std::process::exit(1);
    }
}

fn convert(
    onnx: &Path,
    out: &Path,
    interval: Option<&str>,
    dtype: &str,
    depths: Option<&str>,
    list: bool,
    quiet: bool,
) -> Result<()> {
    let dtype = match dtype {
        "f32" => convert::OutDtype::F32,
        "f16" => convert::OutDtype::F16,
        _ => {
            return Err(Error::invalid(
                "dtype",
                format!("`{dtype}`: expected f32 or f16"),
            ));
        }
    };
    let opts = convert::Options {
        interval_hours: interval
            .map(|s| forecast::parse_hours("interval", s))
            .transpose()?,
        dtype,
        depths: depths.map(Depths::parse).transpose()?,
        progress: !quiet,
    };
    let t = Instant::now();
    let r = convert::convert(onnx, out, &opts)?;
    let m = &r.meta;
    if list {
        use std::io::Write;
        let mut o = std::io::stdout().lock();
        for x in r.constants.iter().chain(&r.mapped) {
            // A closed pipe (`| head`) ends the listing, not the program.
            if writeln!(o, "{:<40} -> {}", x.onnx, x.name).is_err() {
                return Ok(());
            }
        }
    }
    println!(
        "{} -> {}: {} initializers and {} constants mapped; opset {}, LayerNorm {}",
        onnx.display(),
        out.display(),
        r.mapped.len(),
        r.constants.len(),
        r.opset,
        r.norm_form
    );
    let (lat, lon) = m.grid.unwrap_or_default();
    println!(
        "  {}h model, {lat} x {lon}, width {}, depths {}, {}; {:.1} MB in {:.2} s",
        m.interval_hours.unwrap_or_default(),
        m.width,
        m.depths.name(),
        match dtype {
            convert::OutDtype::F32 => "f32",
            convert::OutDtype::F16 => "f16 weights",
        },
        r.bytes as f64 / 1e6,
        t.elapsed().as_secs_f64()
    );
    Ok(())
}

/// `full`, `tiny` or `LATxLON`.
fn parse_grid(s: &str) -> Result<(usize, usize)> {
    match s {
        "full" => Ok((config::OFFICIAL_LAT, config::OFFICIAL_LON)),
        "tiny" => Ok((25, 96)),
        _ => s
            .split_once('x')
            .and_then(|(a, b)| Some((a.parse().ok()?, b.parse().ok()?)))
            .ok_or_else(|| {
                Error::invalid(
                    "--grid",
                    format!("`{s}`: expected full, tiny or LATxLON such as 25x96"),
                )
            }),
    }
}

#[allow(clippy::too_many_arguments)]
fn random_weights(
    out: &Path,
    grid: &str,
    order: &str,
    seed: u64,
    interval: u32,
    depths: &str,
    width: usize,
    inputs: Option<&Path>,
) -> Result<()> {
    let (lat, lon) = parse_grid(grid)?;
    let g = Geometry::new(lat, lon)?;
    let order = BlockOrder::parse(order)?;
    let depths = Depths::parse(depths)?;
    let width = config::check_width(width)?;
    let t = Instant::now();
    let meta = Meta {
        order,
        interval_hours: Some(interval),
        grid: Some((lat, lon)),
        depths,
        width,
    };
    let tensors = weights::seeded_tensors(&g, &meta, seed);
    weights::write_file(out, &tensors, &meta)?;
    let n: usize = tensors.iter().map(|(_, _, v)| v.len()).sum();
    println!(
        "{}: {} tensors, {n} values, {} order, {interval}h, {lat} x {lon}, width {width}, seed {seed} ({:.1} s)",
        out.display(),
        tensors.len(),
        order.name(),
        t.elapsed().as_secs_f64()
    );
    if let Some(dir) = inputs {
        std::fs::create_dir_all(dir).map_err(Error::io(dir))?;
        let (u, s) = weights::seeded_inputs(&g, seed);
        fields::write(
            &dir.join("input_upper.npy"),
            &Field {
                shape: vec![5, 13, lat, lon],
                data: u,
            },
        )?;
        fields::write(
            &dir.join("input_surface.npy"),
            &Field {
                shape: vec![4, lat, lon],
                data: s,
            },
        )?;
        println!("{}: input_upper.npy, input_surface.npy", dir.display());
    }
    Ok(())
}

fn pick_device(run: &Run) -> Result<(Device, Build, DType)> {
    let device = match run.device.as_str() {
        "cpu" => Device::Cpu,
        "cuda" => Device::new_cuda(0)?,
        "auto" => Device::cuda_if_available(0)?,
        d => {
            return Err(Error::invalid(
                "--device",
                format!("`{d}`: expected auto, cuda or cpu"),
            ));
        }
    };
    let build = match run.build.as_deref() {
        None if device.is_cuda() => Build::Wavefuse,
        None => Build::Candle,
        Some("wavefuse") => Build::Wavefuse,
        Some("candle") => Build::Candle,
        Some(b) => {
            return Err(Error::invalid(
                "--build",
                format!("`{b}`: expected wavefuse or candle"),
            ));
        }
    };
    let dtype = match (run.dtype.as_deref(), build) {
        (None, Build::Wavefuse) => DType::F16,
        (None, Build::Candle) if device.is_cuda() => DType::F16,
        (None, Build::Candle) => DType::F32,
        (Some("f16"), _) => DType::F16,
        (Some("f32"), Build::Candle) => DType::F32,
        (Some("f64"), Build::Candle) => DType::F64,
        (Some(d), _) => {
            return Err(Error::invalid(
                "--dtype",
                format!(
                    "`{d}` with the {} build (wavefuse: f16; candle: f16, f32, f64)",
                    build.name()
                ),
            ));
        }
    };
    Ok((device, build, dtype))
}

/// Reads and checks both field files; returns them and their geometry.
fn read_fields(upper: &Path, surface: &Path) -> Result<(Field, Field, Geometry)> {
    let u = fields::read(upper, Kind::Upper, "--upper")?;
    let s = fields::read(surface, Kind::Surface, "--surface")?;
    let (ug, sg) = (Kind::Upper.grid(&u.shape), Kind::Surface.grid(&s.shape));
    let (Some((lat, lon)), Some(sgrid)) = (ug, sg) else {
        return Err(Error::invalid("--upper", "unreadable grid"));
    };
    if sgrid != (lat, lon) {
        return Err(Error::Shape {
            what: format!("--surface ({})", surface.display()),
            got: s.shape.clone(),
            want: format!("[4, {lat}, {lon}] (the grid of --upper)"),
        });
    }
    let g = Geometry::new(lat, lon)?;
    Ok((u, s, g))
}

fn upload(f: &Field, device: &Device, dtype: DType) -> Result<Tensor> {
    Ok(
        Tensor::from_slice(&f.data, f.shape.as_slice(), &Device::Cpu)?
            .to_dtype(dtype)?
            .to_device(device)?,
    )
}

/// The median of sorted `v` (the mean of the middle two for an even
/// count); 0 when empty.
fn median(v: &[f64]) -> f64 {
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

fn mib(b: u64) -> f64 {
    b as f64 / (1024.0 * 1024.0)
}

#[allow(clippy::too_many_arguments)]
fn run_forecast(
    specs: &[String],
    upper: &Path,
    surface: &Path,
    lead: &str,
    out: &Path,
    every: Option<&str>,
    run: &Run,
    json: Option<&Path>,
    quiet: bool,
) -> Result<()> {
    // Everything is checked before anything is loaded on the device or
    // written.
    let lead = forecast::parse_hours("--lead", lead)?;
    let every = every
        .map(|e| forecast::parse_hours("--every", e))
        .transpose()?;
    let mut files: BTreeMap<u32, PathBuf> = BTreeMap::new();
    for s in specs {
        let Some((k, f)) = s.split_once('=') else {
            return Err(Error::invalid(
                "--weights",
                format!("`{s}`: expected INTERVAL=FILE, e.g. 24h=w.safetensors"),
            ));
        };
        let h = forecast::parse_hours("--weights", k)?;
        if files.insert(h, PathBuf::from(f)).is_some() {
            return Err(Error::invalid("--weights", format!("two models for {h}h")));
        }
    }
    let plan = forecast::schedule(lead, &files.keys().copied().collect::<Vec<_>>())?;
    let (fu, fs, g) = read_fields(upper, surface)?;
    let (device, build, dtype) = pick_device(run)?;
    let mut checked = BTreeMap::new();
    for (&h, f) in files.iter().filter(|(h, _)| plan.contains(h)) {
        let w = Weights::read(f, &g)?;
        if let Some(mh) = w.meta.interval_hours
            && mh != h
        {
            return Err(Error::invalid(
                "--weights",
                format!("{}: a {mh}h model given as {h}h", f.display()),
            ));
        }
        checked.insert(h, w);
    }
    let leads = forecast::written_leads(&plan, every);
    let mut inputs = vec![
        ("--upper", upper.to_path_buf()),
        ("--surface", surface.to_path_buf()),
    ];
    inputs.extend(files.values().map(|f| ("--weights", f.clone())));
    prepare_out(out, &leads, &inputs)?;
    let t_load = Instant::now();
    let mut models = BTreeMap::new();
    for (h, w) in checked {
        models.insert(h, Pangu::load(&w, g, &device, opts(run, build, dtype))?);
    }
    let fd = models
        .values()
        .next()
        .map(|m| m.field_dtype())
        .unwrap_or(DType::F32);
    let (u, s) = (upload(&fu, &device, fd)?, upload(&fs, &device, fd)?);
    device.synchronize()?;
    let load_s = t_load.elapsed().as_secs_f64();
    memory::reset_peak(&device)?;
    let bar = if quiet {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(plan.len() as u64)
    };
    bar.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} steps {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.set_message(format!("to +{lead}h"));
    let outputs = forecast::Outputs {
        dir: out,
        every,
        background: true,
    };
    let r = forecast::rollout(&models, &plan, u, s, outputs, |st| {
        bar.set_message(format!(
            "+{}h ({}h model) {:.3} s",
            st.lead, st.interval, st.seconds
        ));
        bar.inc(1);
    })?;
    bar.finish_and_clear();
    let peak = memory::peak(&device)?;
    let used = memory::device_used(&device)?;
    let mut times: Vec<f64> = r.steps.iter().map(|s| s.seconds).collect();
    println!(
        "forecast +{lead}h: {} steps ({}), {} build, {:?}, {} x {}",
        r.steps.len(),
        plan.iter()
            .map(|h| format!("{h}h"))
            .collect::<Vec<_>>()
            .join(" "),
        build.name(),
        dtype,
        g.lat,
        g.lon
    );
    for st in &r.steps {
        let (pu, ps) = forecast::output_paths(out, st.lead);
        let files = if st.written {
            format!("{}  {}", pu.display(), ps.display())
        } else {
            "(kept on the device)".into()
        };
        println!("  +{:>4}h  {:>8.3} s  {files}", st.lead, st.seconds);
    }
    times.sort_by(f64::total_cmp);
    let median = median(&times);
    println!(
        "load {load_s:.2} s; rollout {:.3} s ({median:.3} s per step median, writes {:.3} s overlapped)",
        r.total_seconds, r.write_seconds
    );
    match peak {
        Some(p) => println!(
            "peak device memory: {:.0} MiB allocated, {:.0} MiB reserved",
            mib(p.used),
            mib(p.reserved)
        ),
        None => println!("peak device memory: not tracked on the CPU"),
    }
    let written = r.steps.iter().filter(|s| s.written).count();
    println!("files written: {} in {}", 2 * written, out.display());
    if let Some((u, t)) = used {
        println!(
            "device memory in use now: {:.0} of {:.0} MiB",
            mib(u),
            mib(t)
        );
    }
    if let Some(j) = json {
        let steps: Vec<String> = r
            .steps
            .iter()
            .map(|s| {
                format!(
                    "{{\"lead_h\":{},\"interval_h\":{},\"s\":{}}}",
                    s.lead, s.interval, s.seconds
                )
            })
            .collect();
        let rec = format!(
            "{{\"kind\":\"pangu_forecast\",\"build\":\"{}\",\"dtype\":\"{:?}\",\"lat\":{},\"lon\":{},\"lead_h\":{lead},\"load_s\":{load_s},\"total_s\":{},\"write_s\":{},\"median_step_s\":{median},\"peak_used_bytes\":{},\"peak_reserved_bytes\":{},\"steps\":[{}]}}\n",
            build.name(),
            dtype,
            g.lat,
            g.lon,
            r.total_seconds,
            r.write_seconds,
            peak.map_or(0, |p| p.used),
            peak.map_or(0, |p| p.reserved),
            steps.join(",")
        );
        std::fs::write(j, rec).map_err(Error::io(j))?;
    }
    Ok(())
}

/// Makes `out` a writable folder for the files of `leads`, or refuses
/// before anything is computed: `out` an existing file, a folder that
/// cannot be created or written, or an output file that would overwrite
/// one of the `inputs` (argument, path). A folder this call created is
/// removed again when the write check fails.
fn prepare_out(out: &Path, leads: &[u32], inputs: &[(&str, PathBuf)]) -> Result<()> {
    if out.exists() && !out.is_dir() {
        return Err(Error::invalid(
            "--out",
            format!("{} is a file, not a folder", out.display()),
        ));
    }
    if out.is_dir() {
        let dir = out.canonicalize().map_err(Error::io(out))?;
        for &lead in leads {
            let (pu, ps) = forecast::output_paths(&dir, lead);
            for o in [pu, ps] {
                for (arg, p) in inputs {
                    if p.canonicalize().is_ok_and(|c| c == o) {
                        return Err(Error::invalid(
                            "--out",
                            format!(
                                "the output {} would overwrite the {arg} file {}",
                                o.display(),
                                p.display()
                            ),
                        ));
                    }
                }
            }
        }
    }
    let created = !out.exists();
    std::fs::create_dir_all(out).map_err(|e| {
        Error::invalid("--out", format!("{} cannot be created: {e}", out.display()))
    })?;
    let probe = out.join(format!(".pangu-write-check-{}", std::process::id()));
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)
        .and_then(|_| std::fs::remove_file(&probe));
    if let Err(e) = written {
        if created {
            let _ = std::fs::remove_dir(out);
        }
        return Err(Error::invalid(
            "--out",
            format!("{} cannot be written: {e}", out.display()),
        ));
    }
    Ok(())
}

/// `pangu info`: what a weight file holds and whether the model takes it.
fn info(file: &Path) -> Result<()> {
    let bytes = std::fs::read(file).map_err(Error::io(file))?;
    let st = safetensors::SafeTensors::deserialize(&bytes).map_err(|e| Error::Format {
        file: file.display().to_string(),
        why: format!("not a safetensors file: {e}"),
    })?;
    let (_, md) = safetensors::SafeTensors::read_metadata(&bytes).map_err(|e| Error::Format {
        file: file.display().to_string(),
        why: e.to_string(),
    })?;
    println!("{}: {:.1} MiB", file.display(), mib(bytes.len() as u64));
    let meta = md.metadata().clone().unwrap_or_default();
    let mut keys: Vec<_> = meta.iter().collect();
    keys.sort();
    for (k, v) in keys {
        println!("  {k} = {v}");
    }
    let mut names: Vec<_> = st.tensors();
    names.sort_by(|a, b| a.0.cmp(&b.0));
    let mut values = 0usize;
    for (name, view) in &names {
        let n: usize = view.shape().iter().product();
        values += n;
        println!("  {name:<48} {:?} {:?}", view.dtype(), view.shape());
    }
    println!("{} tensors, {values} values", names.len());
    let grid = meta
        .get("lat")
        .zip(meta.get("lon"))
        .and_then(|(a, b)| Some((a.parse::<usize>().ok()?, b.parse::<usize>().ok()?)));
    match grid {
        Some((lat, lon)) => {
            let g = Geometry::new(lat, lon)?;
            let w = Weights::read(file, &g)?;
            println!(
                "accepted: {lat} x {lon} grid, interval {}, {} order, depths {}, width {}",
                w.meta
                    .interval_hours
                    .map_or("not recorded".into(), |h| format!("{h}h")),
                w.meta.order.name(),
                w.meta.depths.name(),
                w.meta.width
            );
        }
        None => println!("no grid in the metadata: checked against the fields at forecast time"),
    }
    Ok(())
}

/// Where a step's time goes, by kind of work.
fn category(step: &str) -> &'static str {
    match step {
        s if s.ends_with("_gemm") => "gemm",
        "window_attention" | "qkv_split" | "softmax" | "head_merge" => "attention",
        "partition"
        | "reverse_norm"
        | "norm"
        | "norm_partition"
        | "add_norm_partition"
        | "unpartition_add_norm"
        | "unpartition_norm"
        | "merge"
        | "merge_norm"
        | "split_norm" => "norms_gathers",
        "embed_layout" | "embed_concat" | "skip_concat" | "recover_layout" => "copies_layout",
        _ => "other",
    }
}

#[allow(clippy::too_many_arguments)]
fn bench(
    wfile: &Path,
    upper: &Path,
    surface: &Path,
    run: &Run,
    warmup: usize,
    steps: usize,
    write_dir: Option<&Path>,
    json: Option<&Path>,
) -> Result<()> {
    let (fu, fs, g) = read_fields(upper, surface)?;
    let (device, build, dtype) = pick_device(run)?;
    let w = Weights::read(wfile, &g)?;
    let m = Pangu::load(&w, g, &device, opts(run, build, dtype))?;
    let interval = w.meta.interval_hours.unwrap_or(24);
    drop(w);
    let fd = m.field_dtype();
    let (u, s) = (upload(&fu, &device, fd)?, upload(&fs, &device, fd)?);
    device.synchronize()?;
    let base = memory::device_used(&device)?;
    for _ in 0..warmup {
        m.forward(&u, &s)?;
    }
    device.synchronize()?;
    memory::reset_peak(&device)?;
    let mut samples = Vec::with_capacity(steps);
    let mut last = None;
    for _ in 0..steps {
        let t = Instant::now();
        let y = m.forward(&u, &s)?;
        device.synchronize()?;
        samples.push(t.elapsed().as_secs_f64() * 1e3);
        last = Some(y);
    }
    let peak = memory::peak(&device)?;
    let mut sorted = samples.clone();
    sorted.sort_by(f64::total_cmp);
    let median = sorted.get(sorted.len() / 2).copied().unwrap_or(0.0);
    // One probed step: device time and launches per probe point, and
    // per kind of work.
    let mut by_step: BTreeMap<&'static str, (f64, usize)> = BTreeMap::new();
    if build == Build::Wavefuse {
        m.probe().start(&device)?;
        m.forward(&u, &s)?;
        for (step, us) in m.probe().finish()? {
            let e = by_step.entry(step).or_default();
            e.0 += us / 1e3;
            e.1 += 1;
        }
    }
    let mut by_cat: BTreeMap<&'static str, f64> = BTreeMap::new();
    for (step, (ms, _)) in &by_step {
        *by_cat.entry(category(step)).or_default() += ms;
    }
    let mut copy_write = None;
    if let (Some(dir), Some((yu, ys))) = (write_dir, last.as_ref()) {
        std::fs::create_dir_all(dir).map_err(Error::io(dir))?;
        device.synchronize()?;
        let (c, w) = forecast::copy_and_write(dir, interval, yu, ys)?;
        copy_write = Some((c * 1e3, w * 1e3));
    }
    let write_ms = copy_write.map(|(c, w)| c + w);
    println!(
        "pangu step ({} build, {:?}, {} x {}): median {median:.2} ms of {steps} (after {warmup} warm-up)",
        build.name(),
        dtype,
        g.lat,
        g.lon
    );
    for (c, ms) in &by_cat {
        println!("  {c:<14} {ms:>9.2} ms");
    }
    if let Some(p) = peak {
        println!(
            "peak device memory in the timed steps: {:.0} MiB allocated, {:.0} MiB reserved",
            mib(p.used),
            mib(p.reserved)
        );
    }
    if let Some((c, w)) = copy_write {
        println!(
            "one step's device-to-host copy {c:.1} ms + npy write {w:.1} ms = {:.1} ms, alone",
            c + w
        );
    }
    if let Some(j) = json {
        let cats: Vec<String> = by_cat
            .iter()
            .map(|(c, ms)| format!("\"{c}\":{ms}"))
            .collect();
        let per_step: Vec<String> = by_step
            .iter()
            .map(|(st, (ms, n))| format!("\"{st}\":{{\"ms\":{ms},\"count\":{n}}}"))
            .collect();
        let raw: Vec<String> = samples.iter().map(|v| format!("{v}")).collect();
        let rec = format!(
            "{{\"kind\":\"pangu_step\",\"build\":\"{}\",\"dtype\":\"{:?}\",\"lat\":{},\"lon\":{},\"order\":\"{}\",\"mlp_chunks\":{},\"warmup\":{warmup},\"steps\":{steps},\"median_ms\":{median},\"samples_ms\":[{}],\"peak_used_bytes\":{},\"peak_reserved_bytes\":{},\"device_used_before_bytes\":{},\"breakdown_ms\":{{{}}},\"steps_ms\":{{{}}},\"d2h_write_ms\":{},\"d2h_ms\":{},\"write_ms\":{}}}\n",
            build.name(),
            dtype,
            g.lat,
            g.lon,
            m.order().name(),
            run.mlp_chunks.max(1),
            raw.join(","),
            peak.map_or(0, |p| p.used),
            peak.map_or(0, |p| p.reserved),
            base.map_or(0, |b| b.0),
            cats.join(","),
            per_step.join(","),
            write_ms.map_or("null".to_string(), |v| v.to_string()),
            copy_write.map_or("null".to_string(), |v| v.0.to_string()),
            copy_write.map_or("null".to_string(), |v| v.1.to_string())
        );
        std::fs::write(j, rec).map_err(Error::io(j))?;
    }
    Ok(())
}

/// The model options a run asks for.
fn opts(run: &Run, build: Build, dtype: DType) -> Options {
    Options {
        mlp_chunks: run.mlp_chunks.max(1),
        ..Options::new(build, dtype)
    }
}
