//! Host-side costs that sit on an engine's critical path: argument checks,
//! plan building (window planner + gather-table validation and upload) and
//! the CPU-side cost of issuing a launch (the launch calls alone, never the
//! device's work). Device time is the harness's job.
use criterion::{Criterion, criterion_group, criterion_main};
use std::hint::black_box;
use std::time::{Duration, Instant};
use wavefuse::{BackendKind, Choice, Device, GatherPlan, Wave, f16, layer_norm};
use wavefuse_shared::window::{Grid3, Shift3, Window3, WindowPlan};

fn checks(c: &mut Criterion) {
    let dev = Device::open(Choice::Cpu(Wave::W64)).expect("cpu");
    let x = dev.upload(&vec![f16::ONE; 192 * 64]).expect("upload");
    let mut y = dev.alloc::<f16>(192 * 64).expect("alloc");
    // eps is checked last: a NaN eps runs every other check, then rejects
    // before the launch.
    c.bench_function("layer_norm argument checks (rejected before launch)", |b| {
        b.iter(|| {
            black_box(layer_norm(&dev, &x.view(), &mut y.view_mut(), 192, None, f32::NAN).is_err())
        })
    });
}

fn plans(c: &mut Criterion) {
    let grid = Grid3 {
        z: 8,
        h: 91,
        w: 180,
    };
    let window = Window3 { z: 2, h: 6, w: 12 };
    let shift = Shift3 { z: 1, h: 3, w: 6 };
    c.bench_function(
        "WindowPlan::new + partition_table (8x91x180, shifted)",
        |b| {
            b.iter(|| {
                let p = WindowPlan::new(black_box(grid), window, shift).expect("plan");
                black_box(p.partition_table())
            })
        },
    );
    let table = WindowPlan::new(grid, window, shift)
        .expect("plan")
        .partition_table();
    let dev = Device::open(Choice::Cpu(Wave::W64)).expect("cpu");
    c.bench_function(
        "GatherPlan::new (validate + upload 138240 entries, CPU backend)",
        |b| b.iter(|| black_box(GatherPlan::new(&dev, &table, 131_040).expect("plan").len())),
    );
}

/// Launches per timed batch: far below the driver's launch queue depth,
/// so no launch in a batch waits for the device.
const BATCH: u64 = 64;

fn launch_overhead(c: &mut Criterion) {
    // On a GPU: the CPU cost of the checks and the enqueue alone. Only the
    // launch calls are timed, in batches of BATCH that each start from an
    // empty queue (a synchronize outside the timed region), so the figure
    // never includes waiting for the device. On the emulator a launch runs
    // the kernel, so it is a whole emulated launch.
    let dev = Device::open(Choice::Auto).expect("a backend");
    let what = if dev.info().backend == BackendKind::Cpu {
        "emulated launch"
    } else {
        "enqueue, CPU time"
    };
    let x = dev.upload(&vec![f16::ONE; 192 * 32]).expect("upload");
    let mut y = dev.alloc::<f16>(192 * 32).expect("alloc");
    c.bench_function(
        &format!("layer_norm 32x192 {what} ({})", dev.info().name),
        |b| {
            b.iter_custom(|iters| {
                let mut timed = Duration::ZERO;
                let mut left = iters;
                while left > 0 {
                    let n = left.min(BATCH);
                    dev.synchronize().expect("synchronize");
                    let t = Instant::now();
                    for _ in 0..n {
                        layer_norm(&dev, &x.view(), &mut y.view_mut(), 192, None, 1e-5)
                            .expect("launch");
                    }
                    timed += t.elapsed();
                    left -= n;
                }
                dev.synchronize().expect("synchronize");
                timed
            })
        },
    );
}

criterion_group!(benches, checks, plans, launch_overhead);
criterion_main!(benches);
