//! NVIDIA warp (32 lanes): a 16x16x16 step is two
//! `mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32`, one per 8-column
//! half of B and C; operands come from workgroup memory through
//! `ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16`.
//!
//! Lane layouts (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating
//! point type"), with `g = lane / 4`, `t = lane % 4`:
//! - A: registers `a0..a3` hold `(g, 2t..2t+1)`, `(g + 8, 2t..)`,
//!   `(g, 2t + 8..)`, `(g + 8, 2t + 8..)`;
//! - B (per 8-column half `h`): `b0 = B[2t..2t+1][8h + g]`,
//!   `b1 = B[2t + 8..][8h + g]`;
//! - C (per half `h`): `c0, c1 = C[g][8h + 2t..]`, `c2, c3 = C[g + 8][..]`.
//!
//! The C registers of the two halves are, in that order, exactly the A
//! registers of the same 16x16 tile rounded to f16 (FlashAttention-2's
//! register reuse), which is what [`Mma::to_a`] does.
//!
//! `ldmatrix.x4` loads four 8x8 matrices; lane `l` gives the address of row
//! `l % 8` of matrix `l / 8` and receives, in register `j`, row `l / 4`,
//! columns `2 (l % 4)..` of matrix `j` (`.trans`: rows `2 (l % 4)..` of
//! column `l / 4`). The row addresses below pick the matrices so that the
//! registers come out as the fragments above.
use super::{Mma, Tile};
use crate::gpu::{imp, pack2, shfl_xor_f32, thread_id};

/// NVIDIA's matrix unit for one warp (see the module docs).
#[derive(Clone, Copy, Debug)]
pub struct Warp32;

#[inline(always)]
fn lane() -> u32 {
    thread_id() % 32
}

/// Address of the row lane `lane()` supplies to an `ldmatrix.x4` whose
/// matrix `j` covers rows `row0 + 8 * rows[j]..` and columns `col0 + 8 *
/// cols[j]..` of `t` (bit masks, not arrays: a lane-indexed array would
/// live in local memory).
#[inline(always)]
fn row_addr(t: Tile, row0: usize, col0: usize, rows: [u32; 4], cols: [u32; 4]) -> *const u16 {
    let bits = |m: [u32; 4]| m[0] | (m[1] << 1) | (m[2] << 2) | (m[3] << 3);
    let l = lane();
    let j = l / 8;
    let r = 8 * ((bits(rows) >> j) & 1) + l % 8;
    let c = 8 * ((bits(cols) >> j) & 1) as usize;
    t.at_rel(row0, r, col0 + c)
}

/// Quad order (see [`Mma::load_b_t_quads`]): the hardware's accumulator
/// column `c = 8h + 2t + x` (half `h`, `t = lane % 4`, `x` 0 or 1) holds
/// tile column `4t + 2h + x`, so lane `t`'s elements of a row are columns
/// `4t..4t + 4`. The operand loads get it by the rows they address: the
/// lane that gives row `r` of an 8x8 matrix of 8-group `h` gives tile row
/// `quad_row(r, h)` instead of `8h + r`.
#[inline(always)]
fn quad_row(r: u32, h: u32) -> u32 {
    4 * (r >> 1) + 2 * h + (r & 1)
}

/// [`row_addr`] with the tile rows of each 8-group in quad order.
#[inline(always)]
fn quad_addr(p: *const u16, stride: usize, rows: [u32; 4], cols: [u32; 4]) -> *const u16 {
    let bits = |m: [u32; 4]| m[0] | (m[1] << 1) | (m[2] << 2) | (m[3] << 3);
    let l = lane();
    let j = l / 8;
    let r = quad_row(l % 8, (bits(rows) >> j) & 1);
    let c = 8 * ((bits(cols) >> j) & 1);
    p.wrapping_add(r as usize * stride + c as usize)
}

/// `ldmatrix.x4` (`.trans` when `TRANS`) of the matrices [`row_addr`]
/// names. A [`super::Swizzle::QUADS`] tile's second 16-column half comes from the
/// first half's lane address in rows 0.. with bit 5 of its offset flipped
/// (64-byte rows), plus the rows' offset: one register serves both halves
/// and every row block, as immediates did for padded rows.
///
/// # Safety
/// As for [`Mma::load_a`]: the matrices' rows readable in workgroup
/// memory, 16-byte aligned (a `QUADS` tile's rows at 64-byte-aligned
/// offsets); the whole warp calls this.
#[inline(always)]
unsafe fn load_x4<const TRANS: bool>(
    t: Tile,
    row0: usize,
    col0: usize,
    rows: [u32; 4],
    cols: [u32; 4],
) -> [u32; 4] {
    if t.quads() {
        // The second 16-column half by bit 5 (XOR 32 bytes); the first
        // with the same rows-0 register: through `row_addr` at `row0`, the
        // k tile's nine row blocks took nine address registers (and their
        // set-up per window) in sm_90 SASS.
        let x = if col0 % 32 == 16 { 32 } else { 0 };
        let (a, off) = (
            row_addr(t, 0, col0 - x as usize / 2, rows, cols),
            row0 * t.stride(),
        );
        // SAFETY: caller contract; the moved address is the row to read.
        return unsafe {
            if TRANS {
                imp::ldmatrix_x4_trans_x(a, x, off)
            } else {
                imp::ldmatrix_x4_x(a, x, off)
            }
        };
    }
    let a = row_addr(t, row0, col0, rows, cols);
    // SAFETY: caller contract.
    unsafe {
        if TRANS {
            imp::ldmatrix_x4_trans(a)
        } else {
            imp::ldmatrix_x4(a)
        }
    }
}

impl Mma for Warp32 {
    const LANES: u32 = 32;
    const ACC_LEN: usize = 8;
    const ROWS: usize = 2;
    const DENSE_TILES: bool = true;
    /// `[a0, a1, a2, a3]`.
    type A = [u32; 4];
    /// `[b0, b1]` of columns 0..8, then of columns 8..16.
    type B = [u32; 4];
    /// `[c0..c3]` of columns 0..8, then of columns 8..16.
    type Acc = [f32; 8];
    /// m16n8k8's `b0` of `diag(d)`.
    type D = u32;
    /// The C registers of one m16n8k16 against ones: `[c0, c1]` row `g`,
    /// `[c2, c3]` row `g + 8` (every column of a row holds its sum).
    type Sums = [f32; 4];
    /// m16n8k8's `[a0, a1]`: `(g, 2t..2t+1)`, `(g + 8, 2t..)`.
    type A8 = [u32; 2];
    /// m16n8k8's `b0` (`B[2t..2t+1][8h + g]`) of each 8-column half `h`.
    type B8 = [u32; 2];

    #[inline(always)]
    fn zero() -> [f32; 8] {
        [0.0; 8]
    }

    #[inline(always)]
    fn acc_row(e: usize) -> u32 {
        lane() / 4 + 8 * ((e as u32 % 4) / 2)
    }

    #[inline(always)]
    fn acc_col(e: usize) -> u32 {
        8 * (e as u32 / 4) + 2 * (lane() % 4) + e as u32 % 2
    }

    #[inline(always)]
    fn acc_slot(e: usize) -> usize {
        (e % 4) / 2
    }

    #[inline(always)]
    fn slot_row(r: usize) -> u32 {
        lane() / 4 + 8 * r as u32
    }

    #[inline(always)]
    fn row_max(v: f32) -> f32 {
        // A row's elements are in the four lanes of a quad.
        let v = v.max(shfl_xor_f32(v, 1));
        v.max(shfl_xor_f32(v, 2))
    }

    #[inline(always)]
    fn row_sum(v: f32) -> f32 {
        let v = v + shfl_xor_f32(v, 1);
        v + shfl_xor_f32(v, 2)
    }

    #[inline(always)]
    unsafe fn load_a(t: Tile, row0: usize, col0: usize) -> [u32; 4] {
        // a0..a3: (rows 0-7, k 0-7), (rows 8-15, k 0-7), (0-7, 8-15), (8-15, 8-15).
        // SAFETY: caller contract.
        unsafe { load_x4::<false>(t, row0, col0, [0, 1, 0, 1], [0, 0, 1, 1]) }
    }

    #[inline(always)]
    unsafe fn load_b_t(t: Tile, row0: usize, col0: usize) -> [u32; 4] {
        // The tile's row j is B's column j: b0 of half h is tile rows
        // 8h.., columns (k) 0-7, non-transposed; b1 the same at k 8-15.
        // SAFETY: caller contract.
        unsafe { load_x4::<false>(t, row0, col0, [0, 0, 1, 1], [0, 1, 0, 1]) }
    }

    #[inline(always)]
    unsafe fn load_b(t: Tile, row0: usize, col0: usize) -> [u32; 4] {
        // b0 of half h is tile rows (k) 0-7, columns 8h.., transposed; b1
        // the same at k 8-15.
        // SAFETY: caller contract.
        unsafe { load_x4::<true>(t, row0, col0, [0, 1, 0, 1], [0, 0, 1, 1]) }
    }

    #[inline(always)]
    fn quad_col() -> u32 {
        4 * (lane() % 4)
    }

    #[inline(always)]
    fn quad_pos(e: usize) -> usize {
        // Element e: half e / 4, x = e % 2 (see `quad_row`).
        2 * (e / 4) + e % 2
    }

    #[inline(always)]
    unsafe fn load_b_t_quads(p: *const u16, stride: usize) -> [u32; 4] {
        // As `load_b_t`; the tile row that becomes hardware column 8h + r
        // is quad_row(r, h).
        let a = quad_addr(p, stride, [0, 0, 1, 1], [0, 1, 0, 1]);
        // SAFETY: as for `load_a` (rows 0..16 of the tile, permuted).
        unsafe { imp::ldmatrix_x4(a) }
    }

    #[inline(always)]
    unsafe fn load_b_quads(p: *const u16, stride: usize) -> [u32; 4] {
        // As `load_b`; hardware k = 8h + r (the A column that came from
        // accumulator column 8h + r) reads tile row quad_row(r, h).
        let a = quad_addr(p, stride, [0, 1, 0, 1], [0, 0, 1, 1]);
        // SAFETY: as for `load_a`.
        unsafe { imp::ldmatrix_x4_trans(a) }
    }

    #[inline(always)]
    fn a_of(f: impl Fn(u32, u32) -> u16) -> [u32; 4] {
        let (g, t) = (lane() / 4, lane() % 4);
        let w = |i: u32, k: u32| u32::from(f(i, k)) | (u32::from(f(i, k + 1)) << 16);
        [
            w(g, 2 * t),
            w(g + 8, 2 * t),
            w(g, 2 * t + 8),
            w(g + 8, 2 * t + 8),
        ]
    }

    #[inline(always)]
    fn diag(d: u16) -> u32 {
        // m16n8k8's b0 holds B[2t..2t + 2][g]: the diagonal element when
        // g is 2t or 2t + 1.
        let (g, t) = (lane() / 4, lane() % 4);
        let d = u32::from(d);
        if g == 2 * t {
            d
        } else if g == 2 * t + 1 {
            d << 16
        } else {
            0
        }
    }

    #[inline(always)]
    fn add_scaled(x: [u32; 4], d: u32, c: [f32; 8]) -> [f32; 8] {
        // Two m16n8k8 steps: x's columns 0-7 (a0, a1) give C's half 0,
        // columns 8-15 (a2, a3) half 1; one register of diagonal for both.
        let lo = imp::mma_m16n8k8([x[0], x[1]], d, [c[0], c[1], c[2], c[3]]);
        let hi = imp::mma_m16n8k8([x[2], x[3]], d, [c[4], c[5], c[6], c[7]]);
        [lo[0], lo[1], lo[2], lo[3], hi[0], hi[1], hi[2], hi[3]]
    }

    #[inline(always)]
    fn sums_zero() -> [f32; 4] {
        [0.0; 4]
    }

    #[inline(always)]
    fn add_row_sums(a: [u32; 4], s: [f32; 4]) -> [f32; 4] {
        // B = ones (f16 1.0 in every half): C's eight columns each get
        // the row's sum; one of them is kept.
        const ONES: u32 = 0x3c00_3c00;
        imp::mma_m16n8k16(a, [ONES, ONES], s)
    }

    #[inline(always)]
    fn row_sums(s: [f32; 4]) -> [f32; 2] {
        [s[0], s[2]]
    }

    #[inline(always)]
    fn a8_of(f: impl Fn(u32, u32) -> u16) -> [u32; 2] {
        let (g, t) = (lane() / 4, lane() % 4);
        let w = |i: u32, k: u32| u32::from(f(i, k)) | (u32::from(f(i, k + 1)) << 16);
        [w(g, 2 * t), w(g + 8, 2 * t)]
    }

    #[inline(always)]
    unsafe fn load_b8_t(t: Tile, row0: usize, col0: usize) -> [u32; 2] {
        // Matrix h is tile rows 8h..8h + 8 (B's columns), 8 columns (k),
        // non-transposed: register h is half h's b0. Lanes 0..16 address
        // the rows.
        let l = lane();
        let a = t.at_rel(row0, 8 * ((l / 8) & 1) + l % 8, col0);
        // SAFETY: caller contract.
        unsafe { imp::ldmatrix_x2(a) }
    }

    #[inline(always)]
    fn mma8(a: [u32; 2], b: [u32; 2], c: [f32; 8]) -> [f32; 8] {
        let lo = imp::mma_m16n8k8(a, b[0], [c[0], c[1], c[2], c[3]]);
        let hi = imp::mma_m16n8k8(a, b[1], [c[4], c[5], c[6], c[7]]);
        [lo[0], lo[1], lo[2], lo[3], hi[0], hi[1], hi[2], hi[3]]
    }

    #[inline(always)]
    fn splat(x: f32) -> [f32; 8] {
        [x; 8]
    }

    #[inline(always)]
    fn mma(a: [u32; 4], b: [u32; 4], c: [f32; 8]) -> [f32; 8] {
        let lo = imp::mma_m16n8k16(a, [b[0], b[1]], [c[0], c[1], c[2], c[3]]);
        let hi = imp::mma_m16n8k16(a, [b[2], b[3]], [c[4], c[5], c[6], c[7]]);
        [lo[0], lo[1], lo[2], lo[3], hi[0], hi[1], hi[2], hi[3]]
    }

    #[inline(always)]
    fn to_a(c: [f32; 8]) -> [u32; 4] {
        [
            pack2(c[0], c[1]),
            pack2(c[2], c[3]),
            pack2(c[4], c[5]),
            pack2(c[6], c[7]),
        ]
    }
}
