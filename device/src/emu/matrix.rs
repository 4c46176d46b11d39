//! Wave-wide matrix instructions: NVIDIA's warp `mma.sync.m16n8k16` and
//! `mma.sync.m16n8k8` (f16 inputs, f32 accumulate) in wave32 and AMD's
//! wavefront
//! `v_mfma_f32_16x16x16f16` in wave64.
//!
//! Each lane suspends with its operand registers; when the whole wave is
//! there, the scheduler assembles the A, B and C matrices from the lanes'
//! registers by the vendor's per-lane fragment layout, computes
//! `D = A * B + C` and hands every lane its part of D. The layouts below
//! are transcribed from the vendors' documents, independently of the
//! `gpu::mma` facade that builds fragments for kernels, so a facade whose
//! fragments disagree with the hardware computes wrong products here too.
//!
//! Arithmetic: each element of D is `c + sum(a * b)` computed in f64 (the
//! f16 products are exact) and rounded once to f32. The hardware's
//! accumulation order and intermediate rounding are not specified by
//! either vendor; this is at least as accurate, and kernels state error
//! bounds that hold for both.
use super::{Op, collective};
use half::f16;

/// A matrix instruction the emulator executes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MatrixOp {
    /// NVIDIA `mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32` (warp of
    /// 32): A 16x16 in `a[0..4]`, B 16x8 in `b[0..2]`, C/D 16x8 in `c`.
    Mma16816,
    /// NVIDIA `mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32` (warp of
    /// 32): A 16x8 in `a[0..2]`, B 8x8 in `b[0]`, C/D 16x8 in `c`.
    Mma1688,
    /// AMD CDNA2/CDNA3 `v_mfma_f32_16x16x16f16` (wavefront of 64): A 16x16
    /// in `a[0..2]`, B 16x16 in `b[0..2]`, C/D 16x16 in `c`.
    Mfma16x16x16,
}

impl MatrixOp {
    /// Lanes of the wave that executes it.
    pub const fn lanes(self) -> u32 {
        match self {
            MatrixOp::Mma16816 | MatrixOp::Mma1688 => 32,
            MatrixOp::Mfma16x16x16 => 64,
        }
    }
}

/// One lane's registers of a matrix instruction: packed f16 pairs for A
/// and B (low half first), f32 for C; the result D replaces C.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
#[repr(C)]
pub struct MatrixRegs {
    /// A operand registers (`.f16x2` each).
    pub a: [u32; 4],
    /// B operand registers (`.f16x2` each).
    pub b: [u32; 2],
    /// C on entry, D on return.
    pub c: [f32; 4],
}

/// Executes `op` with this lane's registers; every lane of the wave must
/// call it together (a partial wave is reported like any collective).
pub fn run_matrix(op: MatrixOp, regs: &mut MatrixRegs) {
    collective(Op::Matrix { op, regs });
}

/// (register, half) of 16-bit element `e` of a lane's packed registers.
fn half(regs: &[u32], e: usize) -> f64 {
    let w = regs[e / 2] >> (16 * (e % 2));
    f16::from_bits(w as u16).to_f64()
}

/// PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type"
/// (`.f16` A/B, `.f32` C/D): `groupID = laneid >> 2`,
/// `threadID_in_group = laneid % 4`.
mod ptx {
    /// (row, col) of A element `a_i` (i < 8; two per `.f16x2` register).
    pub fn a(lane: usize, i: usize) -> (usize, usize) {
        let (g, t) = (lane >> 2, lane % 4);
        let row = if i < 2 || (4..6).contains(&i) {
            g
        } else {
            g + 8
        };
        let col = if i < 4 {
            t * 2 + (i & 1)
        } else {
            t * 2 + (i & 1) + 8
        };
        (row, col)
    }

    /// (row, col) of B element `b_i` (i < 4).
    pub fn b(lane: usize, i: usize) -> (usize, usize) {
        let (g, t) = (lane >> 2, lane % 4);
        let row = if i < 2 {
            t * 2 + (i & 1)
        } else {
            t * 2 + (i & 1) + 8
        };
        (row, g)
    }

    /// (row, col) of C/D element `c_i` (i < 4).
    pub fn c(lane: usize, i: usize) -> (usize, usize) {
        let (g, t) = (lane >> 2, lane % 4);
        let row = if i < 2 { g } else { g + 8 };
        (row, t * 2 + (i & 1))
    }
}

/// PTX ISA, "Matrix Fragments for mma.m16n8k8" (`.f16` A/B, `.f32`
/// C/D): A 16x8 in two `.f16x2` registers, B 8x8 in one; C/D as for
/// m16n8k16 ([`ptx::c`]).
mod ptx8 {
    /// (row, col) of A element `a_i` (i < 4).
    pub fn a(lane: usize, i: usize) -> (usize, usize) {
        let (g, t) = (lane >> 2, lane % 4);
        (if i < 2 { g } else { g + 8 }, t * 2 + (i & 1))
    }

    /// (row, col) of B element `b_i` (i < 2).
    pub fn b(lane: usize, i: usize) -> (usize, usize) {
        let (g, t) = (lane >> 2, lane % 4);
        (t * 2 + (i & 1), g)
    }
}

/// AMD Matrix Instruction Calculator (ROCm/amd_matrix_instruction_calculator),
/// `v_mfma_f32_16x16x16f16` on CDNA2 (gfx90a) and `v_mfma_f32_16x16x16_f16`
/// on CDNA3 (gfx942), one block, no CBSZ/ABID/BLGP: `A[i][k]` and `B[k][j]`
/// sit in lane `i + 16 * (k / 4)` (resp. `j + ...`), item `k % 4` of the
/// two-register group (bits `16 * (k % 2)` of register `(k % 4) / 2`);
/// `C[i][j]`/`D[i][j]` in lane `j + 16 * (i / 4)`, register `i % 4`.
/// Given as the inverse: which element a lane's item holds.
mod cdna {
    /// (i, k) of A item `x` (x < 4) of `lane`.
    pub fn a(lane: usize, x: usize) -> (usize, usize) {
        (lane % 16, 4 * (lane / 16) + x)
    }

    /// (k, j) of B item `x` of `lane`.
    pub fn b(lane: usize, x: usize) -> (usize, usize) {
        (4 * (lane / 16) + x, lane % 16)
    }

    /// (i, j) of C/D register `x` of `lane`.
    pub fn c(lane: usize, x: usize) -> (usize, usize) {
        (4 * (lane / 16) + x, lane % 16)
    }
}

/// `D = A * B + C` over one wave's registers (`regs[lane]`, as many as
/// `op.lanes()`), written back into each lane's `c`.
pub(crate) fn resolve(op: MatrixOp, regs: &mut [MatrixRegs]) {
    let mut a = [[0.0f64; 16]; 16];
    let mut b = [[0.0f64; 16]; 16];
    let mut c = [[0.0f64; 16]; 16];
    let n = match op {
        MatrixOp::Mma16816 => {
            for (lane, r) in regs.iter().enumerate() {
                for i in 0..8 {
                    let (row, col) = ptx::a(lane, i);
                    a[row][col] = half(&r.a, i);
                }
                for i in 0..4 {
                    let (row, col) = ptx::b(lane, i);
                    b[row][col] = half(&r.b, i);
                    let (row, col) = ptx::c(lane, i);
                    c[row][col] = f64::from(r.c[i]);
                }
            }
            8
        }
        MatrixOp::Mma1688 => {
            for (lane, r) in regs.iter().enumerate() {
                for i in 0..4 {
                    let (row, col) = ptx8::a(lane, i);
                    a[row][col] = half(&r.a, i);
                    let (row, col) = ptx::c(lane, i);
                    c[row][col] = f64::from(r.c[i]);
                }
                for i in 0..2 {
                    let (row, col) = ptx8::b(lane, i);
                    b[row][col] = half(&r.b, i);
                }
            }
            8
        }
        MatrixOp::Mfma16x16x16 => {
            for (lane, r) in regs.iter().enumerate() {
                for x in 0..4 {
                    let (i, k) = cdna::a(lane, x);
                    a[i][k] = half(&r.a, x);
                    let (k, j) = cdna::b(lane, x);
                    b[k][j] = half(&r.b, x);
                    let (i, j) = cdna::c(lane, x);
                    c[i][j] = f64::from(r.c[x]);
                }
            }
            16
        }
    };
    let mut d = [[0.0f32; 16]; 16];
    for i in 0..16 {
        for j in 0..n {
            let mut s = c[i][j];
            for k in 0..16 {
                s += a[i][k] * b[k][j];
            }
            d[i][j] = s as f32;
        }
    }
    for (lane, r) in regs.iter_mut().enumerate() {
        for x in 0..4 {
            let (i, j) = match op {
                MatrixOp::Mma16816 | MatrixOp::Mma1688 => ptx::c(lane, x),
                MatrixOp::Mfma16x16x16 => cdna::c(lane, x),
            };
            r.c[x] = d[i][j];
        }
    }
}
