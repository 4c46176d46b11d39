//! Outputs: a table on stdout, JSON lines and an SVG chart.
use crate::bench::Record;
use serde::Serialize;
use std::fmt::Write as _;
use std::path::Path;
use wavefuse::DeviceInfo;

#[derive(Serialize)]
struct Env<'a> {
    device: &'a str,
    arch: &'a str,
    code_object: &'a str,
    backend: String,
    driver: &'a str,
    module_load_ms: f64,
    harness: &'static str,
    unix_time: u64,
    rustc: &'static str,
}

#[derive(Serialize)]
struct Line<'a> {
    #[serde(flatten)]
    env: &'a Env<'a>,
    #[serde(flatten)]
    rec: &'a Record,
}

pub fn write_all(dir: &Path, info: &DeviceInfo, recs: &[Record]) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let env = Env {
        device: &info.name,
        arch: &info.arch,
        code_object: &info.code_object,
        backend: format!("{:?}", info.backend),
        driver: &info.driver,
        module_load_ms: info.load_ms,
        harness: env!("CARGO_PKG_VERSION"),
        unix_time: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        rustc: "nightly-2026-05-20",
    };
    let mut jl = String::new();
    for r in recs {
        let line =
            serde_json::to_string(&Line { env: &env, rec: r }).map_err(std::io::Error::other)?;
        jl.push_str(&line);
        jl.push('\n');
    }
    std::fs::write(dir.join("results.jsonl"), jl)?;
    std::fs::write(dir.join("chart.svg"), svg(info, recs))?;
    Ok(())
}

/// The results table; "checked" counts the output elements compared with
/// the f64 oracle (every element of every input set).
pub fn print_table(info: &DeviceInfo, recs: &[Record]) {
    println!("# {} ({}, {})", info.name, info.code_object, info.driver);
    println!(
        "| {:<22} | {:<16} | {:>9} | {:>9} | {:>8} | {:>9} | {:>7} | {:>8} | {:>7} | {:>11} |",
        "kernel",
        "shape",
        "median us",
        "p10-p90",
        "GB/s",
        "copy us",
        "% copy",
        "cold us",
        "max ulp",
        "checked"
    );
    println!("|{}|", ["-"; 10].map(|_| "----------").join("|"));
    for r in recs {
        println!(
            "| {:<22} | {:<16} | {:>9.1} | {:>4.0}-{:<4.0} | {:>8.0} | {:>9.1} | {:>6.1}% | {:>8.0} | {:>7.2} | {:>11} |",
            r.variant,
            r.shape,
            r.median_us,
            r.p10_us,
            r.p90_us,
            r.gbps,
            r.copy_median_us,
            r.pct_of_copy,
            r.cold_first_launch_us,
            r.max_err_ulp,
            r.checked_outputs
        );
    }
}

/// Bars of achieved GB/s with each case's copy roofline as a tick.
fn svg(info: &DeviceInfo, recs: &[Record]) -> String {
    let (w, row, left) = (900.0, 26.0, 300.0);
    let h = 60.0 + row * recs.len() as f64;
    let max = recs
        .iter()
        .map(|r| r.gbps.max(r.copy_gbps))
        .fold(1.0, f64::max)
        * 1.05;
    let x = |g: f64| left + (w - left - 20.0) * g / max;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        s,
        r#"<text x="10" y="20" font-size="14">wavefuse on {} — achieved GB/s (bar) vs same-byte device copy (black tick)</text>"#,
        info.name
    );
    for (i, r) in recs.iter().enumerate() {
        let y = 40.0 + row * i as f64;
        let _ = writeln!(
            s,
            r#"<text x="10" y="{}">{} {}</text>"#,
            y + 14.0,
            r.variant,
            r.shape
        );
        let _ = writeln!(
            s,
            r##"<rect x="{left}" y="{y}" width="{:.1}" height="18" fill="#4a7fb5"/>"##,
            x(r.gbps) - left
        );
        let cx = x(r.copy_gbps);
        let _ = writeln!(
            s,
            r#"<line x1="{cx:.1}" x2="{cx:.1}" y1="{}" y2="{}" stroke="black" stroke-width="3"/>"#,
            y - 2.0,
            y + 20.0
        );
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{}" fill="white">{:.0} GB/s ({:.0}% of copy)</text>"#,
            left + 4.0,
            y + 14.0,
            r.gbps,
            r.pct_of_copy
        );
    }
    s.push_str("</svg>\n");
    s
}
