//! The host SIMT emulator: runs kernel source compiled for the host with the
//! execution model of a GPU workgroup.
//!
//! Each thread of a workgroup is a stackful coroutine. A thread runs until it
//! reaches a collective (lane exchange or barrier), where it suspends with
//! its contribution. When every thread is suspended or finished, the
//! scheduler resolves what can be resolved: a wave whose lanes all wait at
//! the same exchange gets its values swapped; a block whose threads all wait
//! at the barrier is released. Anything else (a lane that exited while its
//! wave waits at an exchange, lanes of one wave at different collectives, a
//! barrier missed by an exited thread) is reported as an [`EmuError`]
//! instead of being papered over: real GPUs hang or return garbage there.
//!
//! Workgroups are spread over the host's cores; within a workgroup the
//! threads run in a fixed order, so results are deterministic.

mod matrix;
mod sched;

use core::cell::Cell;
use core::fmt;
use std::vec::Vec;

pub use matrix::{MatrixOp, MatrixRegs, run_matrix};
pub use sched::launch;

/// Grid, workgroup and wave sizes of one emulated launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchConfig {
    /// Workgroups in x and y.
    pub grid: (u32, u32),
    /// Threads per workgroup (a multiple of `wave`).
    pub block: u32,
    /// Lanes per wave: 32 or 64.
    pub wave: u32,
    /// Bytes of launch-sized workgroup memory.
    pub shared_bytes: usize,
}

/// A kernel misbehaved under the emulator (or the launch was malformed).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EmuError {
    /// The launch configuration cannot run (zero sizes, ragged waves...).
    BadConfig(&'static str),
    /// Some lanes of a wave wait at a lane exchange that others exited before.
    PartialCollective {
        /// Workgroup (x, y).
        block: (u32, u32),
        /// Wave index within the workgroup.
        wave: u32,
        /// Lanes that had exited.
        exited: u32,
    },
    /// Lanes of one wave wait at different collectives (or different masks).
    DivergentCollective {
        /// Workgroup (x, y).
        block: (u32, u32),
        /// Wave index within the workgroup.
        wave: u32,
    },
    /// A barrier that some threads of the workgroup exited before reaching.
    PartialBarrier {
        /// Workgroup (x, y).
        block: (u32, u32),
        /// Threads that had exited.
        exited: u32,
    },
    /// A thread trapped (the kernel found an impossible state).
    Trap {
        /// Workgroup (x, y).
        block: (u32, u32),
        /// Thread within the workgroup.
        thread: u32,
    },
    /// A wave ran a matrix instruction of another wave size (an NVIDIA
    /// warp instruction in wave64 mode or an AMD wavefront instruction in
    /// wave32 mode).
    MatrixWave {
        /// Workgroup (x, y).
        block: (u32, u32),
        /// Wave index within the workgroup.
        wave: u32,
        /// The instruction.
        op: MatrixOp,
    },
    /// The host could not map coroutine stacks.
    Stack,
}

impl fmt::Display for EmuError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EmuError::BadConfig(why) => write!(f, "bad launch configuration: {why}"),
            EmuError::PartialCollective {
                block,
                wave,
                exited,
            } => write!(
                f,
                "partial lane exchange in block {block:?} wave {wave}: {exited} lanes had exited"
            ),
            EmuError::DivergentCollective { block, wave } => write!(
                f,
                "lanes of block {block:?} wave {wave} wait at different collectives"
            ),
            EmuError::PartialBarrier { block, exited } => write!(
                f,
                "barrier in block {block:?} missed by {exited} exited threads"
            ),
            EmuError::Trap { block, thread } => {
                write!(f, "thread {thread} of block {block:?} trapped")
            }
            EmuError::MatrixWave { block, wave, op } => write!(
                f,
                "block {block:?} wave {wave} ran {op:?}, an instruction of another wave size"
            ),
            EmuError::Stack => write!(f, "could not allocate emulator stacks"),
        }
    }
}

impl std::error::Error for EmuError {}

/// What a suspended thread waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Workgroup barrier.
    Barrier,
    /// Butterfly exchange within the wave.
    ShflXor {
        /// This lane's contribution.
        value: u32,
        /// Lane mask (`src = lane ^ mask`).
        mask: u32,
    },
    /// Indexed exchange within the wave: every lane reads lane `src`'s value.
    ShflIdx {
        /// This lane's contribution.
        value: u32,
        /// Source lane (below the wave size).
        src: u32,
    },
    /// A wave-wide matrix instruction: every lane of the wave hands over
    /// its operand registers (`regs` points at them on the lane's own
    /// stack, which stays put while it is suspended) and gets the result
    /// written into `regs.c`.
    Matrix {
        /// The instruction.
        op: MatrixOp,
        /// This lane's registers.
        regs: *mut MatrixRegs,
    },
    /// The thread trapped; it is never resumed.
    Trap,
}

type Yielder = corosensei::Yielder<u32, Op>;

/// The running thread's view of the launch.
pub struct Ctx {
    /// Thread index within the workgroup.
    pub thread: u32,
    /// Workgroup index (x, y).
    pub block: (u32, u32),
    /// Lanes per wave.
    pub wave: u32,
    shared: *mut u8,
    yielder: Cell<*const Yielder>,
}

std::thread_local! {
    static CURRENT: Cell<*const Ctx> = const { Cell::new(core::ptr::null()) };
}

/// The running emulated thread's context.
#[inline]
pub fn ctx() -> &'static Ctx {
    let p = CURRENT.with(Cell::get);
    if p.is_null() {
        // Kernels are only reachable through `launch`; calling one directly
        // is a bug in the caller that no result could describe.
        std::eprintln!("wavefuse: a kernel ran outside the SIMT emulator");
        std::process::abort();
    }
    // SAFETY: the scheduler sets CURRENT to a Ctx that outlives the resumed
    // coroutine and clears it when the coroutine suspends.
    unsafe { &*p }
}

/// Suspends the running thread at a collective; returns its result.
pub fn collective(op: Op) -> u32 {
    let y = ctx().yielder.get();
    // SAFETY: the yielder was stored by the coroutine's own entry and lives
    // as long as the coroutine.
    unsafe { (*y).suspend(op) }
}

/// The workgroup's launch-sized memory.
pub fn workgroup_mem<T>() -> *mut T {
    ctx().shared.cast()
}

/// Stops the running thread for good; the launch reports [`EmuError::Trap`].
pub fn trap() -> ! {
    loop {
        collective(Op::Trap);
    }
}

/// Words of workgroup memory, poisoned ([`poison`]).
fn poisoned_shared(bytes: usize) -> Vec<u128> {
    std::vec![poison(0); bytes.div_ceil(16)]
}

/// What workgroup `block` finds in its workgroup memory, so that reads of
/// memory no thread wrote (or wrote without a barrier between) show up
/// rather than reading zeros: all ones (NaN as f16 and f32, -1 as an
/// integer) in even workgroups; in odd ones a finite value (`0x3555`, 0.333
/// as f16; 1.7e-6 as f32), which a kernel's NaN handling cannot absorb
/// (window attention's exact path repairs strips whose scores are NaN,
/// hiding a missing barrier behind all-ones poison).
fn poison(block: u64) -> u128 {
    if block.is_multiple_of(2) {
        u128::MAX
    } else {
        0x3555_3555_3555_3555_3555_3555_3555_3555
    }
}
