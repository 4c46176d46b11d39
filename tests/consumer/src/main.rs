//! Opens the best backend (`Choice::Auto`: CUDA, then HIP, then the CPU
//! emulator on a machine with no GPU), runs one LayerNorm and checks it
//! against an f64 reference: 1 f16 ulp.
use std::process::ExitCode;
use wavefuse::{Choice, Device, f16, layer_norm};

const WIDTH: usize = 192;
const ROWS: usize = 5;

fn main() -> ExitCode {
    match run() {
        Ok(worst) if worst <= 1.0 => {
            println!("consumer: layer_norm within {worst:.2} f16 ulp of f64");
            ExitCode::SUCCESS
        }
        Ok(worst) => {
            eprintln!("consumer: layer_norm off by {worst:.2} f16 ulp");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("consumer: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The worst error in f16 ulps of the reference.
fn run() -> Result<f64, wavefuse::Error> {
    let dev = Device::open(Choice::Auto)?;
    let info = dev.info();
    println!(
        "consumer: {:?} backend, {} ({})",
        info.backend, info.name, info.code_object
    );
    let x: Vec<f16> = (0..ROWS * WIDTH)
        .map(|i| f16::from_f32(((i * 37) % 101) as f32 / 10.0 - 5.0))
        .collect();
    let xd = dev.upload(&x)?;
    let mut y = dev.alloc::<f16>(ROWS * WIDTH)?;
    layer_norm(&dev, &xd.view(), &mut y.view_mut(), WIDTH, None, 1e-5)?;
    let y = y.download()?;
    let mut worst = 0f64;
    for (xr, yr) in x.chunks(WIDTH).zip(y.chunks(WIDTH)) {
        let v: Vec<f64> = xr.iter().map(|h| f64::from(h.to_f32())).collect();
        let mean = v.iter().sum::<f64>() / WIDTH as f64;
        let var = v.iter().map(|a| (a - mean) * (a - mean)).sum::<f64>() / WIDTH as f64;
        for (a, got) in v.iter().zip(yr) {
            let want = (a - mean) / (var + 1e-5).sqrt();
            let ulp = 2f64.powi(want.abs().max(2f64.powi(-14)).log2().floor() as i32 - 10);
            worst = worst.max((f64::from(got.to_f32()) - want).abs() / ulp);
        }
    }
    Ok(worst)
}
