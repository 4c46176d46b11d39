//! AMD CDNA2/CDNA3 wavefront (64 lanes): a 16x16x16 step is one
//! `v_mfma_f32_16x16x16f16` (`v_mfma_f32_16x16x16_f16` on gfx942).
//!
//! Hardware lane layouts (AMD matrix instruction calculator, CDNA2 and
//! CDNA3), with `q = lane / 16`: lane `l` holds `A[l % 16][4q..4q + 4]`,
//! `B[4q..4q + 4][l % 16]` and `D[4q..4q + 4][l % 16]`: a lane holds one
//! column of D, while it holds one row of A.
//!
//! The facade issues every step transposed: `mma(a, b, c)` executes the
//! instruction with `b` as its A and `a` as its B, which computes
//! `(A * B)^T` (the operand layouts are symmetric: the A registers of a
//! matrix are the B registers of its transpose). So the facade's
//! accumulator holds `C[l % 16][4q..4q + 4]`: one row per lane, laid out
//! exactly like an A operand, and [`Mma::to_a`] is a conversion only
//! (no lane exchange). Row reductions run over the four lanes `l % 16 + 16q`.
//!
//! Loads are plain reads (`ds_read_b64` for the two contiguous forms, four
//! `ds_read_u16` for [`Mma::load_b`]). A lane's accumulator columns
//! `4q..4q + 4` are consecutive, so quad order ([`Mma::load_b_t_quads`])
//! is the natural order here.
use super::{Mma, Swizzle, Tile};
use crate::gpu::{imp, pack2, shfl_xor_f32, thread_id};

/// AMD's matrix unit for one wavefront (see the module docs).
#[derive(Clone, Copy, Debug)]
pub struct Wave64;

#[inline(always)]
fn lane() -> u32 {
    thread_id() % 64
}

/// Four halves at `p` (8-byte aligned) as two registers.
///
/// # Safety
/// `p` readable for 8 bytes and 8-byte aligned.
#[inline(always)]
unsafe fn read4(p: *const u16) -> [u32; 2] {
    // SAFETY: caller contract.
    unsafe { p.cast::<[u32; 2]>().read() }
}

impl Mma for Wave64 {
    const LANES: u32 = 64;
    const ACC_LEN: usize = 4;
    const ROWS: usize = 1;
    const DENSE_TILES: bool = false;
    /// Halves `A[l % 16][4q..4q + 4]`.
    type A = [u32; 2];
    /// Halves `B[4q..4q + 4][l % 16]`.
    type B = [u32; 2];
    /// `C[l % 16][4q..4q + 4]` (see the module docs).
    type Acc = [f32; 4];
    /// `diag(d)` as a right operand.
    type D = [u32; 2];
    /// An accumulator against ones: every element of lane `l` is row `l %
    /// 16`'s sum.
    type Sums = [f32; 4];
    /// An [`Mma::A`] whose halves at k 8..16 (lanes 32..64) are zero.
    type A8 = [u32; 2];
    /// An [`Mma::B`] whose halves at k 8..16 (lanes 32..64) are zero.
    type B8 = [u32; 2];

    #[inline(always)]
    fn zero() -> [f32; 4] {
        [0.0; 4]
    }

    #[inline(always)]
    fn acc_row(_e: usize) -> u32 {
        lane() % 16
    }

    #[inline(always)]
    fn acc_col(e: usize) -> u32 {
        4 * (lane() / 16) + e as u32
    }

    #[inline(always)]
    fn acc_slot(_e: usize) -> usize {
        0
    }

    #[inline(always)]
    fn slot_row(_r: usize) -> u32 {
        lane() % 16
    }

    #[inline(always)]
    fn row_max(v: f32) -> f32 {
        let v = v.max(shfl_xor_f32(v, 16));
        v.max(shfl_xor_f32(v, 32))
    }

    #[inline(always)]
    fn row_sum(v: f32) -> f32 {
        let v = v + shfl_xor_f32(v, 16);
        v + shfl_xor_f32(v, 32)
    }

    #[inline(always)]
    unsafe fn load_a(t: Tile, row0: usize, col0: usize) -> [u32; 2] {
        let l = lane();
        // SAFETY: row l % 16, halves 4q..4q + 4 (within one chunk) of the
        // tile's part (caller contract: readable, 16-byte aligned rows).
        unsafe { read4(t.at_rel(row0, l % 16, col0 + 4 * (l / 16) as usize)) }
    }

    #[inline(always)]
    unsafe fn load_b_t(t: Tile, row0: usize, col0: usize) -> [u32; 2] {
        // B[4q + x][l % 16] = tile[l % 16][4q + x]: the same reads as A.
        // SAFETY: as for `load_a`.
        unsafe { Self::load_a(t, row0, col0) }
    }

    #[inline(always)]
    unsafe fn load_b(t: Tile, row0: usize, col0: usize) -> [u32; 2] {
        let l = lane();
        let (k, j) = (4 * (l / 16), (l % 16) as usize);
        // SAFETY: rows k..k + 4, column j of the tile's part (caller
        // contract).
        let h = |x: u32| u32::from(unsafe { t.at_rel(row0, k + x, col0 + j).read() });
        [h(0) | (h(1) << 16), h(2) | (h(3) << 16)]
    }

    #[inline(always)]
    fn quad_col() -> u32 {
        4 * (lane() / 16)
    }

    #[inline(always)]
    fn quad_pos(e: usize) -> usize {
        e
    }

    #[inline(always)]
    unsafe fn load_b_t_quads(p: *const u16, stride: usize) -> [u32; 2] {
        // The accumulator's columns 4q..4q + 4 are consecutive already.
        // SAFETY: as for `load_b_t` (an unswizzled tile).
        unsafe { Self::load_b_t(Tile::new(p, stride, Swizzle::NONE), 0, 0) }
    }

    #[inline(always)]
    unsafe fn load_b_quads(p: *const u16, stride: usize) -> [u32; 2] {
        // SAFETY: as for `load_b`.
        unsafe { Self::load_b(Tile::new(p, stride, Swizzle::NONE), 0, 0) }
    }

    #[inline(always)]
    fn a_of(f: impl Fn(u32, u32) -> u16) -> [u32; 2] {
        let l = lane();
        let (i, k) = (l % 16, 4 * (l / 16));
        let h = |x: u32| u32::from(f(i, k + x));
        [h(0) | (h(1) << 16), h(2) | (h(3) << 16)]
    }

    #[inline(always)]
    fn diag(d: u16) -> [u32; 2] {
        // Lane l holds B[4q..4q + 4][l % 16]: the diagonal element is half
        // l % 16 - 4q of them, if in range.
        let l = lane();
        let x = (l % 16).wrapping_sub(4 * (l / 16));
        let d = u32::from(d);
        let h = |i: u32| if x == i { d } else { 0 };
        [h(0) | (h(1) << 16), h(2) | (h(3) << 16)]
    }

    #[inline(always)]
    fn add_scaled(x: [u32; 2], d: [u32; 2], c: [f32; 4]) -> [f32; 4] {
        Self::mma(x, d, c)
    }

    #[inline(always)]
    fn sums_zero() -> [f32; 4] {
        [0.0; 4]
    }

    #[inline(always)]
    fn add_row_sums(a: [u32; 2], s: [f32; 4]) -> [f32; 4] {
        const ONES: u32 = 0x3c00_3c00;
        Self::mma(a, [ONES, ONES], s)
    }

    #[inline(always)]
    fn row_sums(s: [f32; 4]) -> [f32; 2] {
        [s[0], s[0]]
    }

    #[inline(always)]
    fn a8_of(f: impl Fn(u32, u32) -> u16) -> [u32; 2] {
        Self::a_of(|i, k| if k < 8 { f(i, k) } else { 0 })
    }

    #[inline(always)]
    unsafe fn load_b8_t(t: Tile, row0: usize, col0: usize) -> [u32; 2] {
        let l = lane();
        if l < 32 {
            // SAFETY: row l % 16, halves 4q..4q + 4 of the tile's 8 columns
            // (caller contract).
            unsafe { read4(t.at_rel(row0, l % 16, col0 + 4 * (l / 16) as usize)) }
        } else {
            [0, 0]
        }
    }

    #[inline(always)]
    fn mma8(a: [u32; 2], b: [u32; 2], c: [f32; 4]) -> [f32; 4] {
        Self::mma(a, b, c)
    }

    #[inline(always)]
    fn splat(x: f32) -> [f32; 4] {
        [x; 4]
    }

    #[inline(always)]
    fn mma(a: [u32; 2], b: [u32; 2], c: [f32; 4]) -> [f32; 4] {
        // Transposed (module docs): hardware A = our B, hardware B = our A.
        imp::mfma_16x16x16_f16(b, a, c)
    }

    #[inline(always)]
    fn to_a(c: [f32; 4]) -> [u32; 2] {
        [pack2(c[0], c[1]), pack2(c[2], c[3])]
    }
}
