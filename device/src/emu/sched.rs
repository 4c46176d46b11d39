//! Per-workgroup scheduling of emulated threads.
use super::{
    Ctx, EmuError, LaunchConfig, MatrixOp, MatrixRegs, Op, Yielder, poison, poisoned_shared,
};
use core::cell::Cell;
use corosensei::stack::DefaultStack;
use corosensei::{Coroutine, CoroutineResult};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::vec::Vec;

/// Stack per emulated thread; kernels keep a few hundred bytes of locals.
const STACK_BYTES: usize = 64 * 1024;

#[derive(Clone, Copy)]
enum State {
    Ready(u32),
    Waiting(Op),
    Done,
}

/// Runs `kernel` once per thread of every workgroup of `cfg`.
///
/// Workgroups are independent (as on a GPU) and spread over the host's
/// cores. Returns the first error any workgroup reported.
pub fn launch(cfg: &LaunchConfig, kernel: &(dyn Fn() + Sync)) -> Result<(), EmuError> {
    if cfg.wave != 32 && cfg.wave != 64 {
        return Err(EmuError::BadConfig("wave must be 32 or 64"));
    }
    if cfg.block == 0 || !cfg.block.is_multiple_of(cfg.wave) || cfg.block > 1024 {
        return Err(EmuError::BadConfig(
            "block must be a non-zero multiple of the wave, at most 1024",
        ));
    }
    let total = u64::from(cfg.grid.0) * u64::from(cfg.grid.1);
    if total == 0 {
        return Ok(());
    }
    let workers = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .min(usize::try_from(total).unwrap_or(usize::MAX));
    let next = AtomicU64::new(0);
    let failed = AtomicBool::new(false);
    let first_err: Mutex<Option<EmuError>> = Mutex::new(None);
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| {
                let res = worker(cfg, kernel, total, &next, &failed);
                if let Err(e) = res {
                    failed.store(true, Ordering::Relaxed);
                    if let Ok(mut slot) = first_err.lock() {
                        slot.get_or_insert(e);
                    }
                }
            });
        }
    });
    match first_err.into_inner() {
        Ok(Some(e)) => Err(e),
        Ok(None) => Ok(()),
        Err(_) => Err(EmuError::BadConfig("emulator worker poisoned its lock")),
    }
}

fn worker(
    cfg: &LaunchConfig,
    kernel: &(dyn Fn() + Sync),
    total: u64,
    next: &AtomicU64,
    failed: &AtomicBool,
) -> Result<(), EmuError> {
    let mut stacks = Vec::with_capacity(cfg.block as usize);
    for _ in 0..cfg.block {
        stacks.push(DefaultStack::new(STACK_BYTES).map_err(|_| EmuError::Stack)?);
    }
    let mut shared = poisoned_shared(cfg.shared_bytes);
    loop {
        if failed.load(Ordering::Relaxed) {
            return Ok(());
        }
        let b = next.fetch_add(1, Ordering::Relaxed);
        if b >= total {
            return Ok(());
        }
        let gx = u64::from(cfg.grid.0);
        // Both fit in u32: b < grid.0 * grid.1.
        let block = ((b % gx) as u32, (b / gx) as u32);
        shared.fill(poison(b));
        run_block(cfg, block, kernel, &mut stacks, shared.as_mut_ptr().cast())?;
    }
}

fn run_block(
    cfg: &LaunchConfig,
    block: (u32, u32),
    kernel: &(dyn Fn() + Sync),
    stacks: &mut [DefaultStack],
    shared: *mut u8,
) -> Result<(), EmuError> {
    let n = cfg.block as usize;
    let ctxs: Vec<Ctx> = (0..cfg.block)
        .map(|thread| Ctx {
            thread,
            block,
            wave: cfg.wave,
            shared,
            yielder: Cell::new(core::ptr::null()),
        })
        .collect();
    let mut threads: Vec<Coroutine<u32, Op, (), &mut DefaultStack>> = ctxs
        .iter()
        .zip(stacks.iter_mut())
        .map(|(ctx, stack)| {
            // SAFETY: `ctx` and `kernel` outlive every coroutine: all are
            // finished or reset before this function returns.
            unsafe {
                Coroutine::with_stack_unchecked(stack, move |y: &Yielder, _: u32| {
                    ctx.yielder.set(y);
                    kernel();
                })
            }
        })
        .collect();
    let mut state = std::vec![State::Ready(0); n];
    let result = schedule(cfg, block, &ctxs, &mut threads, &mut state);
    for t in threads.iter_mut() {
        if !t.done() {
            // SAFETY: kernel code is no_std and allocation-free; nothing on a
            // suspended thread's stack needs Drop.
            unsafe { t.force_reset() };
        }
    }
    result
}

fn schedule(
    cfg: &LaunchConfig,
    block: (u32, u32),
    ctxs: &[Ctx],
    threads: &mut [Coroutine<u32, Op, (), &mut DefaultStack>],
    state: &mut [State],
) -> Result<(), EmuError> {
    let n = state.len();
    let wave = cfg.wave as usize;
    let waves = n / wave;
    // One wave at a time, each run until it waits at the workgroup barrier
    // (or exits) before the next starts, the last wave first in even
    // barrier phases and the first wave first in odd ones: a kernel that
    // reads workgroup memory another wave overwrites without a barrier
    // between them sees the overwritten data in one of the two orders,
    // which lock-step scheduling of the waves would hide.
    let mut phase = 0usize;
    loop {
        let pick = (0..waves)
            .map(|i| {
                if phase.is_multiple_of(2) {
                    waves - 1 - i
                } else {
                    i
                }
            })
            .find(|&w| {
                state[w * wave..(w + 1) * wave]
                    .iter()
                    .any(|s| matches!(s, State::Ready(_)))
            });
        if let Some(w) = pick {
            for t in w * wave..(w + 1) * wave {
                if let State::Ready(v) = state[t] {
                    super::CURRENT.with(|c| c.set(&ctxs[t]));
                    let r = threads[t].resume(v);
                    super::CURRENT.with(|c| c.set(core::ptr::null()));
                    state[t] = match r {
                        CoroutineResult::Yield(Op::Trap) => {
                            return Err(EmuError::Trap {
                                block,
                                thread: t as u32,
                            });
                        }
                        CoroutineResult::Yield(op) => State::Waiting(op),
                        CoroutineResult::Return(()) => State::Done,
                    };
                }
            }
            resolve_wave(cfg, block, w as u32, &mut state[w * wave..(w + 1) * wave])?;
            continue;
        }
        let mut at_barrier = 0u32;
        let mut exited = 0u32;
        for s in state.iter() {
            match s {
                State::Waiting(Op::Barrier) => at_barrier += 1,
                State::Done => exited += 1,
                _ => {}
            }
        }
        if exited as usize == n {
            return Ok(());
        }
        if at_barrier as usize == n {
            state.iter_mut().for_each(|s| *s = State::Ready(0));
            phase += 1;
        } else if at_barrier > 0 {
            return Err(EmuError::PartialBarrier { block, exited });
        } else {
            // Every lane waits at an exchange that did not complete (its
            // wave's resolve reported why) or has exited.
            for (w, lanes) in state.chunks_mut(wave).enumerate() {
                resolve_wave(cfg, block, w as u32, lanes)?;
            }
            if !state.iter().any(|s| matches!(s, State::Ready(_))) {
                return Err(EmuError::PartialBarrier { block, exited });
            }
        }
    }
}

/// Completes a lane exchange if the whole wave waits at it.
fn resolve_wave(
    cfg: &LaunchConfig,
    block: (u32, u32),
    w: u32,
    lanes: &mut [State],
) -> Result<bool, EmuError> {
    // The first waiting lane names the exchange (xor with its mask, or
    // indexed); every lane of the wave must wait at the same kind.
    let matrix = lanes.iter().find_map(|s| match s {
        State::Waiting(Op::Matrix { op, .. }) => Some(*op),
        _ => None,
    });
    if let Some(op) = matrix {
        return resolve_matrix(cfg, block, w, lanes, op);
    }
    let first = lanes.iter().find_map(|s| match s {
        State::Waiting(Op::ShflXor { mask, .. }) => Some(Some(*mask)),
        State::Waiting(Op::ShflIdx { .. }) => Some(None),
        _ => None,
    });
    let Some(xor_mask) = first else {
        return Ok(false);
    };
    let mut exited = 0;
    let mut values = [0u32; 64];
    let mut srcs = [0u32; 64];
    for (l, s) in lanes.iter().enumerate() {
        match (*s, xor_mask) {
            (State::Waiting(Op::ShflXor { value, mask: m }), Some(mask)) if m == mask => {
                values[l] = value;
                srcs[l] = l as u32 ^ mask;
            }
            (State::Waiting(Op::ShflIdx { value, src }), None) => {
                values[l] = value;
                srcs[l] = src;
            }
            (State::Done, _) => exited += 1,
            _ => return Err(EmuError::DivergentCollective { block, wave: w }),
        }
    }
    if exited > 0 {
        return Err(EmuError::PartialCollective {
            block,
            wave: w,
            exited,
        });
    }
    if srcs[..lanes.len()].iter().any(|&s| s >= cfg.wave) {
        return Err(EmuError::DivergentCollective { block, wave: w });
    }
    for (l, s) in lanes.iter_mut().enumerate() {
        *s = State::Ready(values[srcs[l] as usize]);
    }
    Ok(true)
}

/// Completes a matrix instruction if the whole wave waits at it.
fn resolve_matrix(
    cfg: &LaunchConfig,
    block: (u32, u32),
    w: u32,
    lanes: &mut [State],
    op: MatrixOp,
) -> Result<bool, EmuError> {
    let mut exited = 0;
    let mut ptrs = [core::ptr::null_mut::<MatrixRegs>(); 64];
    for (l, s) in lanes.iter().enumerate() {
        match *s {
            State::Waiting(Op::Matrix { op: o, regs }) if o == op => ptrs[l] = regs,
            State::Done => exited += 1,
            _ => return Err(EmuError::DivergentCollective { block, wave: w }),
        }
    }
    if exited > 0 {
        return Err(EmuError::PartialCollective {
            block,
            wave: w,
            exited,
        });
    }
    if op.lanes() != cfg.wave {
        return Err(EmuError::MatrixWave { block, wave: w, op });
    }
    let n = lanes.len();
    let mut regs = [MatrixRegs::default(); 64];
    for l in 0..n {
        // SAFETY: each pointer is a suspended lane's own `MatrixRegs`,
        // which lives on its coroutine stack until the lane resumes.
        regs[l] = unsafe { ptrs[l].read() };
    }
    super::matrix::resolve(op, &mut regs[..n]);
    for l in 0..n {
        // SAFETY: as above; no lane runs while the scheduler writes.
        unsafe { ptrs[l].write(regs[l]) };
        lanes[l] = State::Ready(0);
    }
    Ok(true)
}
