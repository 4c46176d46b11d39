//! Matrix-unit (tensor core) operations on 16x16 tiles, one source for
//! every target.
//!
//! A kernel that multiplies matrices implements [`MatrixKernel`]: its body
//! is generic over an [`Mma`], the matrix unit of one wave, and [`run`]
//! calls it with the target's: [`Warp32`] on NVIDIA (two
//! `mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32` per 16x16x16 step,
//! operands through `ldmatrix`), [`Wave64`] on AMD gfx90a/gfx942 (one
//! `v_mfma_f32_16x16x16f16`). The host build has both and picks by the
//! emulated wave size (wave32: [`Warp32`], wave64: [`Wave64`]), so the
//! emulator runs each vendor's fragment layout on the same kernel source.
//!
//! The unit of work is a 16x16x16 step `C += A * B` on f16 operands with
//! an f32 accumulator (also a 16x16x8 one, [`Mma::mma8`], and the row sums
//! of a left operand against a tile of ones, [`Mma::add_row_sums`]). Fragments are opaque per-lane registers whose
//! layout the target defines; kernels reach elements only through the
//! accumulator's coordinates ([`Mma::acc_row`], [`Mma::acc_col`]), load
//! operands from row-major f16 tiles in workgroup memory, reduce over the
//! lanes that share an accumulator row, and turn an accumulator into a
//! left operand ([`Mma::to_a`]: `P = softmax(S)` then `P * V` with no trip
//! through memory). Accumulator elements `2k` and `2k + 1` always lie in
//! one row, in adjacent columns (`acc_col(2k + 1) == acc_col(2k) + 1`,
//! `acc_col(2k)` even), so a kernel can move them as one f16 pair. In
//! quad order ([`Mma::load_b_t_quads`], [`Mma::load_b_quads`]) a lane's
//! elements of a row are four consecutive columns, for one wide read of a
//! row-major tile in the accumulator's layout.
//!
//! Every operation is a wave-wide collective: the whole wave must reach
//! it (the emulator reports a partial wave). On NVIDIA `mma` is LLVM's
//! convergent NVVM intrinsic, which LLVM does not move into divergent
//! code; `ldmatrix` is inline PTX on a 32-bit shared address (the
//! intrinsic takes only generic pointers, whose address arithmetic cost
//! more instructions than the loads), which LLVM does not know to be
//! convergent: call the loads only where the whole wave is present.
//!
//! Arithmetic: f16 products, f32 accumulation in the hardware's order (not
//! specified by either vendor); the emulator sums each element's products
//! in f64 and rounds once.

#[cfg(not(target_arch = "amdgpu"))]
mod warp32;
#[cfg(not(target_arch = "nvptx64"))]
mod wave64;

#[cfg(not(target_arch = "amdgpu"))]
pub use warp32::Warp32;
#[cfg(not(target_arch = "nvptx64"))]
pub use wave64::Wave64;

/// Where a [`Tile`]'s 16-byte chunks lie in its rows: chunk `c` (columns
/// `8c..8c + 8`) of row `r` is stored at chunk `c ^ ((r >> shift) & mask)`.
/// Every swizzle here reads only bits 0..3 of the row, so rows 8 apart are
/// placed alike (what the loads' per-lane addresses rely on).
///
/// Why: `ldmatrix` reads eight rows at one chunk per phase; in a dense
/// tile those rows meet the same workgroup-memory banks. Padding the rows
/// apart instead (the old layout) left the eight 16-byte `cp.async` pieces
/// of a quarter-warp spread over two or more 128-byte spans of workgroup
/// memory, and the H200 then split the copy's global reads into extra L2
/// requests (window attention: 2.3 times the dense copy's read
/// requests). A swizzled dense tile keeps both
/// the copy and the reads conflict-free.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Swizzle {
    shift: u32,
    mask: u32,
}

impl Swizzle {
    /// Chunks in place.
    pub const NONE: Self = Self { shift: 0, mask: 0 };
    /// Chunk pairs swapped in rows 4..8 of every 8: conflict-free for rows
    /// of an odd number of chunk pairs (the 288-byte bias rows).
    pub const PAIRS: Self = Self { shift: 2, mask: 1 };
    /// Chunks XORed with `(r >> 1) & 3`: conflict-free for 64-byte rows
    /// (rows of a multiple of 4 chunks). A `QUADS` tile's rows must start
    /// at 64-byte-aligned offsets of workgroup memory: the NVIDIA loads
    /// find a row's second 16-column half by flipping bit 5 of its
    /// address.
    pub const QUADS: Self = Self { shift: 1, mask: 3 };

    /// The XOR applied to the chunks of row `r`.
    #[inline(always)]
    pub const fn of(self, r: u32) -> u32 {
        (r >> self.shift) & self.mask
    }
}

/// A row-major f16 tile in workgroup memory: rows `stride` halves apart,
/// chunks placed by a [`Swizzle`]. Rows must hold a multiple of `mask + 1`
/// chunks, so the XOR keeps a chunk within its row.
#[derive(Clone, Copy, Debug)]
pub struct Tile {
    p: *const u16,
    stride: usize,
    sw: Swizzle,
}

impl Tile {
    /// The tile at `p` (16-byte aligned, `stride` a multiple of 8).
    #[inline(always)]
    pub const fn new(p: *const u16, stride: usize, sw: Swizzle) -> Self {
        Tile { p, stride, sw }
    }

    /// Where columns `col..` of row `row` lie (at most to the end of
    /// their 8-column chunk): the address of element `(row, col)`.
    #[inline(always)]
    pub fn at(self, row: usize, col: usize) -> *const u16 {
        self.at_rel(0, row as u32, col)
    }

    /// Halves from one row to the next.
    // The NVIDIA loads' (`Warp32`) only, as is `quads`.
    #[cfg(not(target_arch = "amdgpu"))]
    #[inline(always)]
    pub(crate) fn stride(self) -> usize {
        self.stride
    }

    /// Whether the tile is [`Swizzle::QUADS`]-swizzled (its rows then lie
    /// at 64-byte-aligned offsets of workgroup memory: the caller's
    /// contract for such tiles).
    #[cfg(not(target_arch = "amdgpu"))]
    #[inline(always)]
    pub(crate) fn quads(self) -> bool {
        self.sw == Swizzle::QUADS
    }

    /// [`Tile::at`] for row `row0 + r`, `row0` a multiple of 8: the
    /// swizzle term is then `r`'s, the same for every 8-row step of one
    /// lane (so it stays out of the loops).
    #[inline(always)]
    pub(crate) fn at_rel(self, row0: usize, r: u32, col: usize) -> *const u16 {
        // `c ^ s` with `s <= mask`, written so that the chunk bits above
        // the mask (constants in unrolled loops) stay an addend: the
        // address is then a lane register plus an immediate.
        let m = self.sw.mask as usize;
        let c = ((col / 8) & !m) + (((col / 8) & m) ^ self.sw.of(r) as usize);
        self.p
            .wrapping_add((row0 + r as usize) * self.stride + 8 * c + col % 8)
    }
}

/// The most distinct tile rows one lane's accumulator elements lie in (2
/// for [`Warp32`], 1 for [`Wave64`]): the size of a kernel's per-row state
/// arrays, of which it uses the first [`Mma::ROWS`].
pub const MAX_ROWS: usize = 2;

/// The matrix unit of one wave: fragment types, their lane layouts and the
/// operations on them. See the module docs.
pub trait Mma {
    /// Lanes of the wave that executes each operation.
    const LANES: u32;
    /// Accumulator elements per lane (`256 / LANES`).
    const ACC_LEN: usize;
    /// Distinct tile rows this lane's accumulator elements lie in
    /// (at most [`MAX_ROWS`]).
    const ROWS: usize;
    /// Left operand: a 16x16 f16 tile (16 output rows x 16 of k).
    type A: Copy;
    /// Right operand: a 16x16 f16 tile (16 of k x 16 output columns).
    type B: Copy;
    /// A 16x16 f32 accumulator; `as_ref()[e]` is element `e` of this lane.
    type Acc: Copy + AsRef<[f32]> + AsMut<[f32]>;

    /// Whether tiles for this unit's loads are best dense with swizzled
    /// chunks ([`Swizzle`]) rather than padded: NVIDIA, where `ldmatrix`
    /// reads eight 16-byte rows per phase and `cp.async` fills a tile in
    /// 16-byte pieces (see [`Swizzle`]); not AMD, where the copies pass
    /// through registers, the padded rows keep a wave's reads in distinct
    /// banks as well, and the swizzle's extra per-lane addresses spilled
    /// gfx908's 64-VGPR budget.
    const DENSE_TILES: bool;
    /// An accumulator of zeros.
    fn zero() -> Self::Acc;
    /// Tile row (0..16) of this lane's accumulator element `e`.
    fn acc_row(e: usize) -> u32;
    /// Tile column (0..16) of this lane's accumulator element `e`.
    fn acc_col(e: usize) -> u32;
    /// Which of this lane's rows (0..[`Mma::ROWS`]) element `e` lies in.
    fn acc_slot(e: usize) -> usize;
    /// Tile row of this lane's row `r` (`acc_row(e) == slot_row(acc_slot(e))`).
    fn slot_row(r: usize) -> u32;
    /// Max of `v` over the lanes holding elements of the same tile row (call
    /// once per row slot; `f32::max`, so NaN is ignored unless all are NaN).
    fn row_max(v: f32) -> f32;
    /// Sum of `v` over the lanes holding elements of the same tile row, in
    /// a fixed order (every such lane gets the same bits).
    fn row_sum(v: f32) -> f32;
    /// Left operand from the 16x16 part of tile `t` at row `row0`, column
    /// `col0`: `A[i][k] = t[row0 + i][col0 + k]` ([`Tile::at`]).
    ///
    /// # Safety
    /// `t` lies in workgroup memory and its rows `row0..row0 + 16`, columns
    /// `col0..col0 + 16` are readable; `row0` and `col0` multiples of 8.
    unsafe fn load_a(t: Tile, row0: usize, col0: usize) -> Self::A;
    /// Right operand from a tile stored by output column (the rows of `Y`
    /// in `X * Y^T`): `B[k][j] = t[row0 + j][col0 + k]`.
    ///
    /// # Safety
    /// As for [`Mma::load_a`].
    unsafe fn load_b_t(t: Tile, row0: usize, col0: usize) -> Self::B;
    /// Right operand from a row-major tile: `B[k][j] = t[row0 + k][col0 + j]`.
    ///
    /// # Safety
    /// As for [`Mma::load_a`].
    unsafe fn load_b(t: Tile, row0: usize, col0: usize) -> Self::B;
    /// First of the four consecutive tile columns that hold this lane's
    /// elements of each of its rows in an accumulator in quad order (see
    /// [`Mma::load_b_t_quads`]); a multiple of 4.
    fn quad_col() -> u32;
    /// Which of those four columns (0..4) element `e` of a quad-order
    /// accumulator lies in: its column is `quad_col() + quad_pos(e)`.
    /// The same on every lane, and `quad_pos(2k + 1) == quad_pos(2k) + 1`.
    fn quad_pos(e: usize) -> usize;
    /// [`Mma::load_b_t`] with the product's columns in quad order: in
    /// `mma(a, load_b_t_quads(p, s), c)` element `e` of every lane holds
    /// column `quad_col() + quad_pos(e)` of the product (row
    /// [`Mma::acc_row`]`(e)`), so a lane's elements of one row are four
    /// consecutive columns that it can meet with one 8-byte read (a bias
    /// row, a label row). The columns are a permutation of the tile's,
    /// chosen by which tile row each lane addresses (free on both
    /// targets).
    ///
    /// # Safety
    /// `p` points into workgroup memory, 16-byte aligned, `stride` a
    /// multiple of 8, and 16 rows of 16 halves are readable (an unswizzled
    /// tile).
    unsafe fn load_b_t_quads(p: *const u16, stride: usize) -> Self::B;
    /// The right operand that multiplies [`Mma::to_a`] of a quad-order
    /// accumulator: `mma(to_a(c), load_b_quads(p, s), d)` adds
    /// `sum_k c[i][k] * p[k * s + j]` with `c`'s columns as
    /// [`Mma::load_b_t_quads`] placed them (the tile's rows permuted the
    /// same way).
    ///
    /// # Safety
    /// As for [`Mma::load_b_t_quads`].
    unsafe fn load_b_quads(p: *const u16, stride: usize) -> Self::B;
    /// A left operand from its elements: `A[i][k] = f(i, k)` (f16 bits),
    /// `f` called for this lane's elements only.
    fn a_of(f: impl Fn(u32, u32) -> u16) -> Self::A;
    /// A diagonal right operand `diag(d)` for [`Mma::add_scaled`] (`d` as
    /// f16 bits).
    type D: Copy;
    /// `diag(d)`: the scalar `d` (f16 bits) as a diagonal matrix.
    fn diag(d: u16) -> Self::D;
    /// `c + x * diag(d)`: adds `d * x[i][j]` to each element, `x` a tile
    /// in the left operand's layout ([`Mma::load_a`]). Each product is
    /// exact in f32; the zeros off the diagonal make an infinite or NaN
    /// element of `x` NaN in its whole column of the result.
    fn add_scaled(x: Self::A, d: Self::D, c: Self::Acc) -> Self::Acc;
    /// Row sums of left operands, accumulated by [`Mma::add_row_sums`].
    type Sums: Copy;
    /// Sums of zero.
    fn sums_zero() -> Self::Sums;
    /// `s` plus each row of `a`: `sum_k A[i][k]` added to row `i`'s sum,
    /// one matrix step against a tile of ones (exact products, f32
    /// accumulation in the hardware's order): one m16n8k16 on NVIDIA (half
    /// a 16x16x16 step), one MFMA on AMD.
    fn add_row_sums(a: Self::A, s: Self::Sums) -> Self::Sums;
    /// The sums of this lane's rows (`[r]` for [`Mma::slot_row`]`(r)`, `r <
    /// ROWS`); every lane of a row holds the same bits.
    fn row_sums(s: Self::Sums) -> [f32; MAX_ROWS];
    /// Left operand of a 16x16x8 step (16 output rows x 8 of k).
    type A8: Copy;
    /// Right operand of a 16x16x8 step (8 of k x 16 output columns).
    type B8: Copy;
    /// A 16x16x8 left operand from its elements: `A[i][k] = f(i, k)` (f16
    /// bits, `k < 8`), `f` called for this lane's elements only.
    fn a8_of(f: impl Fn(u32, u32) -> u16) -> Self::A8;
    /// A 16x16x8 right operand from a tile stored by output column:
    /// `B[k][j] = t[row0 + j][col0 + k]`, `k < 8` (one 16-byte chunk of 16
    /// rows).
    ///
    /// # Safety
    /// As for [`Mma::load_a`], for 16 rows of 8 halves.
    unsafe fn load_b8_t(t: Tile, row0: usize, col0: usize) -> Self::B8;
    /// `c + a * b` over eight of k: two m16n8k8 on NVIDIA (half the matrix
    /// work of a 16x16x16 step, operands from one `ldmatrix.x2`), one MFMA
    /// with k 8..16 zero on AMD.
    fn mma8(a: Self::A8, b: Self::B8, c: Self::Acc) -> Self::Acc;
    /// An accumulator with every element `x`.
    fn splat(x: f32) -> Self::Acc;
    /// `c + a * b`.
    fn mma(a: Self::A, b: Self::B, c: Self::Acc) -> Self::Acc;
    /// The accumulator rounded to f16 (nearest-even) as a left operand:
    /// `to_a(c)` holds `A[i][k] = f16(C[i][k])`.
    fn to_a(c: Self::Acc) -> Self::A;
}

/// A kernel body generic over the matrix unit (see [`run`]).
pub trait MatrixKernel {
    /// The body, with the wave's matrix unit `M`.
    fn run<M: Mma>(self);
}

/// Runs `k` with this target's matrix unit (on the host: the emulated wave
/// size's).
#[inline(always)]
pub fn run<K: MatrixKernel>(k: K) {
    #[cfg(target_arch = "nvptx64")]
    k.run::<Warp32>();
    #[cfg(target_arch = "amdgpu")]
    k.run::<Wave64>();
    #[cfg(not(any(target_arch = "amdgpu", target_arch = "nvptx64")))]
    {
        if super::wave_size() == 32 {
            k.run::<Warp32>()
        } else {
            k.run::<Wave64>()
        }
    }
}
