//! One `Device` used from several threads at once, on every backend
//! present: the API is `Send + Sync`, every op takes `&Device`, and each
//! launch is queued on the device's one in-order stream. Threads share the
//! device, a read-only source buffer and a gather plan, each writes its own
//! outputs; every output must equal, bit for bit, the same op run alone.
mod common;

use common::rows::ln_rows;
use common::{Rng, devices};
use half::f16;
use wavefuse::{
    Device, DeviceBuffer, GatherPlan, GeluBias, GeluMode, Stream, WindowTable, bias_gelu, gather,
    layer_norm, layer_norm_gather,
};

const W: usize = 384;
const ROWS: usize = 97;
const THREADS: usize = 6;
const ROUNDS: usize = 8;

#[test]
fn api_types_are_send_and_sync() {
    fn both<T: Send + Sync>() {}
    both::<Device>();
    both::<Stream>();
    both::<DeviceBuffer<f16>>();
    both::<GatherPlan>();
    both::<WindowTable>();
    both::<wavefuse::Error>();
}

/// Shared inputs of every thread.
struct Shared {
    x: DeviceBuffer<f16>,
    bias: DeviceBuffer<f16>,
    plan: GatherPlan,
}

/// Outputs of one thread's round: LayerNorm, gathered LayerNorm, gather,
/// bias + GELU of the thread's own input.
fn one_round(dev: &Device, s: &Shared, own: &DeviceBuffer<f16>) -> Vec<Vec<f16>> {
    let n = ROWS * W;
    let mut y = dev.alloc::<f16>(n).expect("alloc");
    layer_norm(dev, &s.x.view(), &mut y.view_mut(), W, None, 1e-5).expect("layer_norm");
    let mut g = dev.alloc::<f16>(s.plan.len() * W).expect("alloc");
    layer_norm_gather(dev, &s.plan, &s.x.view(), &mut g.view_mut(), W, None, 1e-5)
        .expect("layer_norm_gather");
    let mut c = dev.alloc::<f16>(s.plan.len() * W).expect("alloc");
    gather(dev, &s.plan, &own.view(), &mut c.view_mut(), W).expect("gather");
    let mut z = dev.alloc::<f16>(n).expect("alloc");
    bias_gelu(
        dev,
        &own.view(),
        GeluBias::F16(&s.bias.view()),
        &mut z.view_mut(),
        W,
        GeluMode::Erf,
    )
    .expect("bias_gelu");
    [y, g, c, z]
        .iter()
        .map(|b| b.download().expect("download"))
        .collect()
}

#[test]
fn one_device_from_several_threads_at_once() {
    for dev in devices() {
        let mut rng = Rng(0x7EAD);
        let table: Vec<i32> = (0..2 * ROWS)
            .map(|_| {
                if rng.below(5) == 0 {
                    -1
                } else {
                    rng.below(ROWS as u64) as i32
                }
            })
            .collect();
        let shared = Shared {
            x: dev
                .upload(&ln_rows(&mut rng, ROWS, W, false))
                .expect("upload"),
            bias: dev.upload(&rng.halves(W, 0.5, 0.0)).expect("upload"),
            plan: GatherPlan::new(&dev, &table, ROWS).expect("plan"),
        };
        let own: Vec<Vec<f16>> = (0..THREADS)
            .map(|_| rng.halves(ROWS * W, 2.0, 0.0))
            .collect();
        // Each thread's results when it runs alone.
        let alone: Vec<Vec<Vec<f16>>> = own
            .iter()
            .map(|o| one_round(&dev, &shared, &dev.upload(o).expect("upload")))
            .collect();
        std::thread::scope(|s| {
            for (t, o) in own.iter().enumerate() {
                let (dev, shared, want) = (&dev, &shared, &alone[t]);
                s.spawn(move || {
                    let mine = dev.upload(o).expect("upload");
                    for round in 0..ROUNDS {
                        let got = one_round(dev, shared, &mine);
                        for (k, (a, b)) in got.iter().zip(want).enumerate() {
                            let same = a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
                            assert!(
                                same,
                                "{}: thread {t} round {round} output {k} differs from the same op run alone",
                                dev.info().name
                            );
                        }
                    }
                });
            }
        });
    }
}
