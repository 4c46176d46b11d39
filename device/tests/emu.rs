//! The emulator's execution model: real exchanges, real barriers, waves
//! that run ahead of each other between barriers, poisoned workgroup
//! memory, and partial or divergent collectives reported instead of
//! papered over.
use std::sync::atomic::{AtomicU32, Ordering};
use wavefuse_device::emu::{EmuError, LaunchConfig, launch};
use wavefuse_device::gpu;

fn cfg(block: u32, wave: u32) -> LaunchConfig {
    LaunchConfig {
        grid: (3, 2),
        block,
        wave,
        shared_bytes: 1024,
    }
}

#[test]
fn butterfly_exchanges_values_between_lanes() {
    for wave in [32, 64] {
        let bad = AtomicU32::new(0);
        launch(&cfg(128, wave), &|| {
            let t = gpu::thread_id();
            for mask in [1, 2, 4, 8, 16] {
                if gpu::shfl_xor_u32(t, mask) != t ^ mask {
                    bad.fetch_add(1, Ordering::Relaxed);
                }
            }
            // group_sum over 32 lanes of the lane index within the group.
            let s = gpu::group_sum::<32>((t % 32) as f32);
            if s != 496.0 {
                bad.fetch_add(1, Ordering::Relaxed);
            }
            assert_eq!(gpu::wave_size(), wave);
        })
        .expect("clean launch");
        assert_eq!(bad.load(Ordering::Relaxed), 0, "wave{wave}");
    }
}

#[test]
fn indexed_exchange_reads_the_named_lane() {
    for wave in [32, 64] {
        let bad = AtomicU32::new(0);
        launch(&cfg(128, wave), &|| {
            let lane = gpu::thread_id() % wave;
            // Each lane reads a different, non-butterfly source.
            let src = (lane * 7 + 3) % wave;
            if gpu::shfl_idx_u32(lane * 10, src) != src * 10 {
                bad.fetch_add(1, Ordering::Relaxed);
            }
        })
        .expect("clean launch");
        assert_eq!(bad.load(Ordering::Relaxed), 0, "wave{wave}");
    }
}

#[test]
fn indexed_exchange_past_the_wave_or_mixed_with_xor_is_divergent() {
    let past = launch(&cfg(64, 32), &|| {
        gpu::shfl_idx_u32(1, gpu::thread_id() % 32 + 1);
    });
    assert!(
        matches!(past, Err(EmuError::DivergentCollective { .. })),
        "{past:?}"
    );
    let mixed = launch(&cfg(64, 64), &|| {
        if gpu::thread_id() < 8 {
            gpu::shfl_xor_u32(1, 1);
        } else {
            gpu::shfl_idx_u32(1, 0);
        }
    });
    assert!(
        matches!(mixed, Err(EmuError::DivergentCollective { .. })),
        "{mixed:?}"
    );
}

#[test]
fn barrier_orders_workgroup_memory() {
    let bad = AtomicU32::new(0);
    launch(&cfg(256, 64), &|| {
        let m = gpu::workgroup_mem::<u32>();
        let t = gpu::thread_id();
        // SAFETY: 256 u32 fit in the 1024-byte launch-sized memory.
        unsafe { m.add(t as usize).write(t * 3 + gpu::block_id()) };
        gpu::barrier();
        let o = 255 - t;
        // SAFETY: as above; written before the barrier by thread `o`.
        let v = unsafe { m.add(o as usize).read() };
        if v != o * 3 + gpu::block_id() {
            bad.fetch_add(1, Ordering::Relaxed);
        }
    })
    .expect("clean launch");
    assert_eq!(bad.load(Ordering::Relaxed), 0);
}

#[test]
fn a_missing_barrier_shows_in_one_of_the_wave_orders() {
    // Each wave writes its slot, exchanges within the wave (lock-step
    // scheduling would let every wave write before any read), then reads
    // the other wave's slot with no barrier between: one wave runs ahead
    // of the other, first the last wave (before the first barrier), then
    // the first (after it), so the read misses the write in both halves.
    let (stale, fresh) = (AtomicU32::new(0), AtomicU32::new(0));
    launch(&cfg(64, 32), &|| {
        let m = gpu::workgroup_mem::<u32>();
        let (t, w) = (gpu::thread_id(), gpu::thread_id() / 32);
        for round in 0..2u32 {
            if t % 32 == 0 {
                // SAFETY: two u32 of the 1024-byte memory.
                unsafe { m.add(w as usize).write(round + 1) };
            }
            gpu::shfl_xor_u32(0, 1);
            // SAFETY: as above.
            let v = unsafe { m.add(1 - w as usize).read() };
            if t % 32 == 0 {
                let c = if v == round + 1 { &fresh } else { &stale };
                c.fetch_add(1 << (8 * (w + 2 * round)), Ordering::Relaxed);
            }
            gpu::barrier();
        }
    })
    .expect("clean launch");
    // Per workgroup (6): round 0, wave 1 ran first and read stale (wave 0
    // fresh); round 1, wave 0 first and stale.
    let (s, f) = (stale.load(Ordering::Relaxed), fresh.load(Ordering::Relaxed));
    assert_eq!((s, f), (6 << 8 | 6 << 16, 6 | 6 << 24), "{s:#x} {f:#x}");
}

#[test]
fn odd_workgroups_find_finite_poison() {
    // All ones (NaN) in even workgroups, 0x3555 (f16 0.333) in odd ones:
    // a kernel whose NaN handling repairs a read of unwritten memory
    // still sees a wrong finite value half the time.
    let seen = [AtomicU32::new(0), AtomicU32::new(0)];
    launch(&cfg(32, 32), &|| {
        // SAFETY: the first u32 of the 1024-byte memory, never written.
        let v = unsafe { gpu::workgroup_mem::<u32>().read() };
        let b = gpu::block_id() + 3 * gpu::block_id_y();
        let want = if b.is_multiple_of(2) {
            u32::MAX
        } else {
            0x3555_3555
        };
        if gpu::thread_id() == 0 && v == want {
            seen[(b % 2) as usize].fetch_add(1, Ordering::Relaxed);
        }
    })
    .expect("clean launch");
    assert_eq!(seen.map(|c| c.load(Ordering::Relaxed)), [3, 3]);
}

#[test]
fn early_return_before_exchange_is_a_partial_collective() {
    let e = launch(&cfg(64, 32), &|| {
        if gpu::thread_id() % 32 == 5 {
            return;
        }
        gpu::shfl_xor_u32(1, 1);
    });
    assert!(
        matches!(e, Err(EmuError::PartialCollective { exited: 1, .. })),
        "{e:?}"
    );
}

#[test]
fn lanes_at_different_exchanges_are_divergent() {
    let e = launch(&cfg(64, 64), &|| {
        let m = if gpu::thread_id() < 8 { 1 } else { 2 };
        gpu::shfl_xor_u32(1, m);
    });
    assert!(
        matches!(e, Err(EmuError::DivergentCollective { .. })),
        "{e:?}"
    );
}

#[test]
fn barrier_missed_by_exited_threads_is_reported() {
    let e = launch(&cfg(128, 64), &|| {
        if gpu::thread_id() >= 64 {
            return;
        }
        gpu::barrier();
    });
    assert!(
        matches!(e, Err(EmuError::PartialBarrier { exited: 64, .. })),
        "{e:?}"
    );
}

#[test]
fn traps_are_reported_not_hung() {
    let e = launch(&cfg(64, 32), &|| {
        if gpu::block_id() == 1 && gpu::thread_id() == 3 {
            gpu::trap();
        }
    });
    assert!(matches!(e, Err(EmuError::Trap { thread: 3, .. })), "{e:?}");
}

#[test]
fn malformed_launches_are_rejected() {
    assert!(matches!(
        launch(&cfg(48, 32), &|| {}),
        Err(EmuError::BadConfig(_))
    ));
    assert!(matches!(
        launch(&cfg(64, 16), &|| {}),
        Err(EmuError::BadConfig(_))
    ));
}
