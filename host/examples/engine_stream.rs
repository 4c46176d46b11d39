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

/// Each stage on wavefuse's emulator, as the reference, over a prefix of
/// the rows (the emulator runs thread by thread): add+LayerNorm from the
/// inputs, and bias+GELU from the `y` the GPU computed (its one-ulp
/// differences from the emulator would otherwise be amplified where
/// `y + bias` cancels).
fn reference(
    residual: &[f16],
    branch: &[f16],
    bias: &[f16],
    gpu_y: &[f16],
) -> wavefuse::Result<(Vec<f16>, Vec<f16>, Vec<f16>)> {
    let cpu = Device::open(Choice::Cpu(Wave::W64))?;
    let n = 4096 * W;
    let mut r = cpu.upload(&residual[..n])?;
    let b = cpu.upload(&branch[..n])?;
    let bias = cpu.upload(bias)?;
    let mut y = cpu.alloc::<f16>(n)?;
    add_layer_norm(
        &cpu,
        &mut r.view_mut(),
        &b.view(),
        &mut y.view_mut(),
        W,
        None,
        1e-5,
    )?;
    let gy = cpu.upload(&gpu_y[..n])?;
    let mut g = cpu.alloc::<f16>(n)?;
    bias_gelu(
        &cpu,
        &gy.view(),
        GeluBias::F16(&bias.view()),
        &mut g.view_mut(),
        W,
        GeluMode::Erf,
    )?;
    Ok((r.download()?, y.download()?, g.download()?))
}

/// The largest distance in f16 ulps between two outputs of the same sign
/// (the kernels' contract keeps signs: their differences are roundings).
fn worst_ulps(a: &[f16], b: &[f16]) -> i32 {
    a.iter()
        .zip(b)
        .map(|(a, b)| (a.to_bits() as i32 - b.to_bits() as i32).abs())
        .max()
        .unwrap_or(0)
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
    let y_out = stream.clone_dtoh(&y_buf)?;
    let g_out = stream.clone_dtoh(&g_buf)?;

    let (r_ref, y_ref, g_ref) = reference(&residual, &branch, &bias, &y_out)?;
    let r_same = r_ref
        .iter()
        .zip(&r_out)
        .all(|(a, b)| a.to_bits() == b.to_bits());
    // The NVIDIA kernels use hardware rsqrt/exp2/rcp: at most one f16 ulp
    // from the emulator, stage by stage.
    let (y_worst, g_worst) = (worst_ulps(&y_ref, &y_out), worst_ulps(&g_ref, &g_out));
    println!(
        "{}: residual bit-identical to the emulator: {r_same}; LayerNorm within {y_worst} ulp, bias+GELU within {g_worst} ulp of the emulator ({} rows checked)",
        dev.info().name,
        r_ref.len() / W
    );
    if !r_same || y_worst > 1 || g_worst > 1 {
        return Err("results differ from the emulator".into());
    }
    Ok(())
}
