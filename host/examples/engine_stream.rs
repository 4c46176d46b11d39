//! An engine's view of wavefuse: its own memory (allocated with cudarc,
//! not wavefuse), its own non-blocking stream, and a chain of wavefuse
//! kernels queued on that stream with no synchronisation between them.
//! The result is checked against the CPU emulator.
//!
//! ```sh
//! cargo run --release -p wavefuse --example engine_stream   # needs a CUDA device
//! ```
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr};
use std::sync::Arc;
use wavefuse::{
    Choice, Device, GeluBias, GeluMode, View, ViewMut, Wave, add_layer_norm, bias_gelu, f16,
};

const ROWS: usize = 131_040;
const W: usize = 192;

fn halves(seed: u64, n: usize) -> Vec<f16> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            f16::from_f32(((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 4.0)
        })
        .collect()
}

/// A device address of an engine buffer (cudarc records its own event for
/// the access when the guard drops; the buffer is used on `s` only).
fn addr(b: &CudaSlice<f16>, s: &Arc<CudaStream>) -> u64 {
    b.device_ptr(s).0
}

/// The chain on wavefuse's emulator, as the reference.
fn reference(
    residual: &[f16],
    branch: &[f16],
    bias: &[f16],
) -> wavefuse::Result<(Vec<f16>, Vec<f16>)> {
    let cpu = Device::open(Choice::Cpu(Wave::W64))?;
    let rows = 4096; // a prefix: the emulator runs thread by thread
    let mut r = cpu.upload(&residual[..rows * W])?;
    let b = cpu.upload(&branch[..rows * W])?;
    let bias = cpu.upload(bias)?;
    let mut y = cpu.alloc::<f16>(rows * W)?;
    let mut g = cpu.alloc::<f16>(rows * W)?;
    add_layer_norm(
        &cpu,
        &mut r.view_mut(),
        &b.view(),
        &mut y.view_mut(),
        W,
        None,
        1e-5,
    )?;
    bias_gelu(
        &cpu,
        &y.view(),
        GeluBias::F16(&bias.view()),
        &mut g.view_mut(),
        W,
        GeluMode::Erf,
    )?;
    Ok((r.download()?, g.download()?))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // wavefuse on CUDA device 0 (a typed error where there is none).
    let dev = Device::open(Choice::Cuda(0))?;
    // The engine's side: a context (the device's primary one, which
    // wavefuse uses too), a stream and buffers, all cudarc's.
    let ctx = CudaContext::new(0)?;
    let stream = ctx.new_stream()?;
    let (residual, branch, bias) = (halves(1, ROWS * W), halves(2, ROWS * W), halves(3, W));
    let r_buf = stream.clone_htod(&residual)?;
    let b_buf = stream.clone_htod(&branch)?;
    let bias_buf = stream.clone_htod(&bias)?;
    let y_buf = stream.alloc_zeros::<f16>(ROWS * W)?;
    let g_buf = stream.alloc_zeros::<f16>(ROWS * W)?;

    // wavefuse launches on the engine's stream.
    // SAFETY: `stream` outlives `q` (both live to the end of main).
    let q = unsafe { dev.wrap_stream(stream.cu_stream().cast()) }?;
    // SAFETY: the cudarc buffers hold initialised halves, outlive the work
    // (read back below, on the same stream), and nothing else touches them.
    unsafe {
        let mut r = ViewMut::<f16>::from_raw(&dev, addr(&r_buf, &stream), ROWS * W)?;
        let b = View::<f16>::from_raw(&dev, addr(&b_buf, &stream), ROWS * W)?;
        let mut y = ViewMut::<f16>::from_raw(&dev, addr(&y_buf, &stream), ROWS * W)?;
        let yv = View::<f16>::from_raw(&dev, addr(&y_buf, &stream), ROWS * W)?;
        let bias_v = View::<f16>::from_raw(&dev, addr(&bias_buf, &stream), W)?;
        let mut g = ViewMut::<f16>::from_raw(&dev, addr(&g_buf, &stream), ROWS * W)?;
        // residual += branch (in place), y = LayerNorm(residual), g = GELU(y + bias)
        add_layer_norm(&q, &mut r, &b, &mut y, W, None, 1e-5)?;
        bias_gelu(&q, &yv, GeluBias::F16(&bias_v), &mut g, W, GeluMode::Erf)?;
    }
    // The engine reads the results on its stream: ordered after the kernels.
    let r_out = stream.clone_dtoh(&r_buf)?;
    let g_out = stream.clone_dtoh(&g_buf)?;

    let (r_ref, g_ref) = reference(&residual, &branch, &bias)?;
    let r_same = r_ref
        .iter()
        .zip(&r_out)
        .all(|(a, b)| a.to_bits() == b.to_bits());
    // The NVIDIA kernels use hardware rsqrt/exp2/rcp: at most one f16 ulp
    // from the emulator.
    let g_worst = g_ref
        .iter()
        .zip(&g_out)
        .map(|(a, b)| (a.to_bits() as i32 - b.to_bits() as i32).abs())
        .max()
        .unwrap_or(0);
    println!(
        "{}: residual bit-identical to the emulator: {r_same}; GELU(LN) worst difference {g_worst} ulp over {} rows checked",
        dev.info().name,
        r_ref.len() / W
    );
    if !r_same || g_worst > 1 {
        return Err("results differ from the emulator".into());
    }
    Ok(())
}
