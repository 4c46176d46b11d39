//! Fused 3D window attention on the matrix units: for each window `w` and
//! head `h`, `O = softmax(scale * Q K^T + mask(w) + bias[type(w), h]) V`
//! over Pangu's 144-token windows, heads of 32.
//!
//! Input: the QKV Linear's output [windows * 144, 3C] f16 (per token
//! `[q(C) | k(C) | v(C)]`, C = heads x 32 head-major, as
//! [`super::qkv_split()`] reads it), optionally plus an f16 QKV bias \[3C\]
//! added first (`f16(x + b)`, rounded, as PyTorch's f16 Linear output).
//! Output: [windows * 144, C] f16 in token order, head-major (what the
//! output projection reads).
//!
//! The shifted-window mask is given as region labels: `labels[slot(w)]`
//! holds one i32 per token of the window, and `mask_ij` is 0 where tokens
//! `i` and `j` carry the same label, [`ATTN_MASK_NEG`] (-100) otherwise:
//! exactly Swin's and Pangu's mask, read as 144 labels instead of a
//! 144 x 144 tile.
//!
//! Numerics, per (window, head), query row `i`, key `j`, with `dh =
//! f16(1 / scale)`, `dl = f16(1 / scale - dh)` (together within `2^-22` of
//! `1 / scale` for the scales the host accepts, 2^-14 to 8):
//! - the score in units of `1 / scale`, one f32 accumulation on the matrix
//!   unit per 16-key tile (hardware order; every product exact): `a =
//!   m_ij + sum_d q_d k_d + dh bias_ij + dl bias_ij`, in that order
//!   ([`Mma::add_scaled`]: the bias times a diagonal, no per-element
//!   conversion or `fma`; added last, so that the strip's q . k products
//!   need not wait for its bias rows), with
//!   the mask `m_ij` exactly 0 within a region and `mh = f16(-100 f32(1
//!   / scale))` across it (one-hot region rows of the queries, `mh` in the
//!   column of the row's region, times the keys' complementary rows, 1 in
//!   every column but the key's region: a 16x16x8 step on the matrix
//!   unit from zero, one nonzero product at most, `ONEHOT`, for windows of
//!   up to
//!   [`ATTN_ONEHOT_REGIONS`] regions where `mh` is finite, `scale` above
//!   about 2^-9.4; none for a window of one region), so
//!   `scale a` is `z = scale s + bias + mask` up to the accumulation's
//!   rounding, with the mask `-100 (1 + d)`, `|d| <= 2^-11`;
//! - `m = max_j a` (f32, exact; `scale > 0`);
//! - `e = 2^(fma(a, c, -(m c)))`, `c = f32(scale log2 e)`, the hardware
//!   `exp2` ([`gpu::exp2_approx`]);
//! - `p = f16(e)`: the unnormalised weights are rounded once to f16 for
//!   `P V` on the matrix unit (f32 accumulation);
//! - `sum = sum_j p_j`: the row sums of the same rounded weights, on the
//!   matrix unit with `P V` (`P` times a tile of ones, f32 accumulation:
//!   [`Mma::add_row_sums`]);
//! - `out = f16(o * (1 / sum))`, `1 / sum` one Newton step on the
//!   hardware's reciprocal (within an f32 ulp of the rounded quotient).
//!
//! So `out` is a weighted mean of the `v_j` with weights that sum to one
//! (up to the f32 sums' rounding): the f16 rounding of `p` (PyTorch's
//! unfused chain rounds its probabilities to f16 too) moves it by at most
//! about `2^-11 sum_j w_j |v_j - out|` (`w` the exact probabilities)
//! rather than `2^-11 sum_j w_j |v_j|`; plus half an ulp and the effect of
//! the f32 scores' rounding. Summed on the matrix unit, the row sums cost
//! one matrix step per 16-key tile instead of the per-lane adds and the
//! shuffles over a row's lanes. The
//! host op (`wavefuse::ops::window_attention`) states the bound.
//!
//! The exact path (`exact_strip`): a 16-row strip whose row sum comes out
//! NaN (a NaN or infinite score: an infinite or NaN bias, whose zero
//! products on the matrix unit spread NaN along its row of the tile, or
//! NaN / infinite inputs) is computed again after the wave's other strips,
//! per element in f32 as `z = fma(s, scale, bias) + mask` (-100 exactly)
//! with the bias read from memory, so `-inf` entries get weight 0 and a
//! row is NaN exactly where `torch.softmax`'s is: a row whose `z` holds
//! NaN or +inf, or only -inf (a bias row of -inf); a label mask never
//! masks a whole row (a token shares its own region). Masked windows of
//! more than [`ATTN_ONEHOT_REGIONS`] regions (not Pangu's or Swin's), or
//! at a scale where `mh` is not a finite f16, take this path for every
//! strip.
//!
//! Layout: one workgroup of [`ATTN_WAVES`] waves per (window, head), on a
//! grid of (heads, windows) (head `block_id`, window `block_id_y`: no
//! division by the head count). The q, k and v tiles (144 x 32)
//! and the window's 144 labels are copied to workgroup memory in 16-byte
//! pieces ([`gpu::copy_to_workgroup`]: `cp.async` on NVIDIA, so no
//! registers hold them in flight; each eight threads fill 128 contiguous
//! bytes; a QKV bias is then added in place, `add_qkv_bias`), in the
//! target's `Layout` (NVIDIA: dense rows with swizzled
//! 16-byte chunks; AMD: rows padded to [`ATTN_LDS_STRIDE`]); a masked
//! window of up to [`ATTN_ONEHOT_REGIONS`] regions writes its one-hot key
//! tile. Each wave then takes the 16-row query strips `w, w + 3, w + 6`:
//! the strip's 16 x 144 scores stay in registers as nine 16x16
//! accumulators; the strip's bias rows come from a per-wave buffer in
//! workgroup memory (NVIDIA: the rows as they lie in memory, chunk pairs
//! swizzled; AMD: rows padded to [`ATTN_BIAS_STRIDE`]), copied in
//! 16-byte pieces while the previous strip finished and waited for after
//! the strip's q . k products (the first strip's rows as a second group
//! of copies behind q, k and v: [`gpu::copy_to_workgroup_fence`]; read straight from
//! L2 in the accumulator layout they kept L2 at 71% of its throughput and
//! the kernel 13% slower on the H200) and read as left
//! operands; the row max is reduced over the lanes of a row; the
//! rounded weights are reused in registers as the left operand of `P V`
//! and of their row sums ([`Mma::to_a`]); the strip's outputs, rounded,
//! pass through the wave's output strip in workgroup memory so that each
//! 64-byte row leaves as four 16-byte stores (stored from the accumulator
//! layout, every 32-bit store wrote half of a sector, and the kernel was
//! slower on the H200). Nothing but
//! q, k, v, the bias, the labels and the output touches memory outside
//! the workgroup.
//!
//! On NVIDIA the entry points carry launch bounds (`cargo xtask kernels`
//! writes `.maxntid 96` and `.minnctapersm 4` into the PTX): without them
//! ptxas took 176 registers and 3 workgroups fit an SM.
use crate::gpu::mma::{MAX_ROWS, MatrixKernel, Mma, Swizzle, Tile};
use crate::gpu::{self, pack2};
use crate::vec::{V8, load8_bits, store8_bits};
use wavefuse_shared::geometry::{
    ATTN_BIAS_STRIDE, ATTN_HEAD_DIM, ATTN_LABEL_OFFSET, ATTN_LDS_STRIDE, ATTN_MASK_NEG,
    ATTN_ONEHOT_OFFSET, ATTN_ONEHOT_REGIONS, ATTN_ONEHOT_STRIDE, ATTN_OUT_OFFSET, ATTN_T,
    ATTN_WAVES,
};

const T: usize = ATTN_T as usize;
const D: usize = ATTN_HEAD_DIM as usize;
const LS: usize = ATTN_LDS_STRIDE as usize;
const BS: usize = ATTN_BIAS_STRIDE as usize;
const OS: usize = ATTN_ONEHOT_STRIDE as usize;
/// One-hot columns: a window's regions, when the matrix unit adds its mask.
const REGIONS: u32 = ATTN_ONEHOT_REGIONS;
/// 16-row query strips (and 16-key tiles) per window.
const STRIPS: usize = T / 16;
/// 16-byte vectors of q, k and v per thread: 18 for three warps of 32 (9
/// of them used for three waves of 64).
const PER_THREAD: usize = 3 * T * D / 8 / (ATTN_WAVES as usize * 32);
const _: () = assert!(T.is_multiple_of(16) && (ATTN_WAVES * 32).is_multiple_of(24));
const _: () = assert!(PER_THREAD == 18 && T.is_multiple_of(ATTN_WAVES as usize * 64 / 12));

/// The kernel's arguments (see [`window_attention`]).
#[derive(Clone, Copy)]
struct Args {
    qkv: *const u16,
    qkv_bias: *const u16,
    out: *mut u16,
    bias: *const u16,
    labels: *const i32,
    types: *const i32,
    slots: *const i32,
    heads: u32,
    n_types: u32,
    n_slots: u32,
    scale: f32,
}

struct Attention<const MASK: bool>(Args);

/// This thread's share of the window's q, k and v copy: `(t0, part, c,
/// rows)`: token rows `t0, t0 + rows, ..`, part `part` (q, k, v), quarter
/// `c` of the head row (16 bytes). Each eight threads copy two consecutive
/// tokens of one part, so they fill 128 contiguous bytes of a tile (the
/// H200 splits a `cp.async` whose quarter-warp spans more into extra L2
/// requests). The workgroup's thread count is a multiple of 24, so part
/// and quarter are the same for all of a thread's pieces and its addresses
/// advance by constant steps (index arithmetic per piece, with 64-bit
/// divisions by 12, was a third of the kernel's instructions).
#[inline(always)]
fn qkv_share() -> (usize, usize, usize, usize) {
    let tid = gpu::thread_id();
    let threads = ATTN_WAVES * gpu::wave_size();
    (
        (2 * (tid / 24) + (tid / 4) % 2) as usize,
        ((tid / 8) % 3) as usize,
        (tid % 4) as usize,
        (threads / 12) as usize,
    )
}

/// Where the staged q, k, v tiles and the bias strip buffers lie, for the
/// target's matrix unit ([`Mma::DENSE_TILES`]): dense swizzled rows (q, k,
/// v rows of 64 bytes, [`Swizzle::QUADS`]; bias rows of 288 bytes,
/// [`Swizzle::PAIRS`]) on NVIDIA, rows padded to [`ATTN_LDS_STRIDE`] and
/// [`ATTN_BIAS_STRIDE`] halves on AMD (the geometry's space, which holds
/// either).
#[derive(Clone, Copy)]
struct Layout {
    ls: usize,
    bs: usize,
    qkv: Swizzle,
    bias: Swizzle,
}

impl Layout {
    #[inline(always)]
    fn of<M: Mma>() -> Self {
        if M::DENSE_TILES {
            Layout {
                ls: D,
                bs: T,
                qkv: Swizzle::QUADS,
                bias: Swizzle::PAIRS,
            }
        } else {
            Layout {
                ls: LS,
                bs: BS,
                qkv: Swizzle::NONE,
                bias: Swizzle::NONE,
            }
        }
    }

    /// Part `part` (q, k, v) of the staged tiles at `lds`.
    #[inline(always)]
    fn qkv(self, lds: *mut u16, part: usize) -> Tile {
        Tile::new(lds.wrapping_add(part * T * self.ls), self.ls, self.qkv)
    }

    /// Wave `wave`'s bias strip buffer.
    #[inline(always)]
    fn buf(self, lds: *mut u16, wave: usize) -> Tile {
        let p = lds.wrapping_add(3 * T * self.ls + wave * 16 * self.bs);
        Tile::new(p, self.bs, self.bias)
    }
}
const _: () = assert!(D <= LS && T <= BS);

/// Adds the QKV bias to the q, k and v pieces this thread copied
/// ([`copy`]), in workgroup memory, after the thread's wait: `f16(x + b)`
/// per element. Each thread touches only its own pieces, so the
/// workgroup's barrier after this is the only one needed. Through the
/// asynchronous copy and this pass the bias costs no exposed load latency:
/// loading the rows through registers to add it on the way took 1.46
/// times as long as the copy path on the H200.
///
/// # Safety
/// As for [`window_attention`]; `lds` holds three 144-row tiles, copied
/// by this thread's [`copy`] and waited for.
// Index loops over register arrays unroll; iterators do not always.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn add_qkv_bias(a: &Args, lay: Layout, lds: *mut u16, h: usize) {
    let ch = a.heads as usize * D;
    let (t0, part, c, rows) = qkv_share();
    let per = T / rows;
    // Rows t0 + j rows keep t0's swizzle (rows is a multiple of 8).
    let dst = lay.qkv(lds, part).at(t0, 8 * c).cast_mut();
    // SAFETY: part * C + h * 32 + 8c < 3C; aligned (caller).
    let b = unsafe { load8_bits(a.qkv_bias.add(part * ch + h * D + 8 * c)) };
    crate::unroll!(j in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17] {
        if j < per {
            let p = dst.wrapping_add(j * rows * lay.ls);
            // SAFETY: the piece this thread copied (inside the three
            // tiles, 16-byte aligned) and waited for.
            let x = unsafe { load8_bits(p) };
            let mut v = [0u32; 4];
            // Word by word (a whole-vector copy left the array in local
            // memory on NVPTX).
            for k in 0..4 {
                v[k] = gpu::add_h2(x.0[k], b.0[k]);
            }
            // SAFETY: as above.
            unsafe { store8_bits(p, V8(v)) };
        }
    });
}

/// Starts copying the window's q, k and v rows of head `h` to workgroup
/// memory (`cp.async` on NVIDIA: no registers hold the data in flight);
/// [`gpu::copy_to_workgroup_wait`] waits for them.
///
/// # Safety
/// As for [`window_attention`]; `lds` holds three 144-row tiles.
#[inline(always)]
unsafe fn copy(a: &Args, lay: Layout, lds: *mut u16, w: usize, h: usize) {
    let ch = a.heads as usize * D;
    let (t0, part, c, rows) = qkv_share();
    // A constant on the GPU targets (18 or 9): the loop unrolls, with the
    // destinations as immediates, and the unused slots of the wave64
    // build vanish at compile time.
    let per = T / rows;
    let src = a
        .qkv
        .wrapping_add((w * T + t0) * 3 * ch + part * ch + h * D + 8 * c);
    // Rows t0 + j rows keep t0's swizzle (rows is a multiple of 8).
    let dst = lay.qkv(lds, part).at(t0, 8 * c).cast_mut();
    crate::unroll!(j in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17] {
        if j < per {
            // SAFETY: token row t0 + j * rows < 144 of the window in qkv,
            // the destination in the tiles; both 16-byte aligned (caller).
            unsafe {
                gpu::copy_to_workgroup(dst.add(j * rows * lay.ls), src.add(j * rows * 3 * ch))
            };
        }
    });
}

/// Starts copying the 144 region labels (i32) at `src` to `dst`.
///
/// # Safety
/// Both valid for 576 bytes and 16-byte aligned (`dst` workgroup memory).
#[inline(always)]
unsafe fn copy_labels(src: *const i32, dst: *mut i32) {
    let c = gpu::thread_id() as usize;
    if c < T / 4 {
        // SAFETY: piece c of 36.
        unsafe { gpu::copy_to_workgroup(dst.add(4 * c).cast(), src.add(4 * c).cast()) };
    }
}

/// How the window's mask is added, from its labels in workgroup memory
/// (the same answer on every lane): [`NO_MASK`] when they are all equal,
/// [`ONEHOT`] when they are all below [`ATTN_ONEHOT_REGIONS`], else
/// [`LABELS`].
#[inline(always)]
fn mask_mode(lab: *const i32) -> u8 {
    const PIECES: usize = T / 4;
    let ws = gpu::wave_size() as usize;
    let lane = gpu::thread_id() as usize % ws;
    // SAFETY: labels 0..144 of the window (workgroup memory).
    let l0 = unsafe { lab.read() };
    let (mut differ, mut above) = (false, false);
    // The labels in 16-byte pieces, at most two per lane in a constant
    // count: as a loop over single labels (four or five per lane, with a
    // remainder), the mode took about 3% of the kernel's stall samples
    // on the H200.
    for k in 0..PIECES.div_ceil(ws) {
        let p = lane + k * ws;
        if p < PIECES {
            // SAFETY: piece p of the labels (16-byte aligned).
            let v = unsafe { load8_bits(lab.add(4 * p).cast()) };
            for l in v.0 {
                differ |= l as i32 != l0;
                above |= l >= REGIONS;
            }
        }
    }
    // One vote each (a butterfly of shuffles over the lanes was slower
    // on the H200).
    if !gpu::wave_any(differ) {
        NO_MASK
    } else if !gpu::wave_any(above) {
        ONEHOT
    } else {
        LABELS
    }
}

/// Writes the window's complementary one-hot key tile: row `j` holds 0 in
/// column `labels[j]`, 1 elsewhere (so the one-hot query rows times it is
/// `mh` across regions and 0 within one, from a zero accumulator: started
/// from a splat of `mh` instead, every tile's step took four register
/// copies of it on NVIDIA). Every thread of the workgroup calls it; a
/// barrier follows.
///
/// # Safety
/// `lab` the window's labels, each in `0..REGIONS`; `oh` 144 rows of [`OS`]
/// halves of workgroup memory, 16-byte aligned.
#[inline(always)]
unsafe fn write_onehot(lab: *const i32, oh: *mut u16) {
    const H1: u32 = 0x3c00;
    const _: () = assert!(REGIONS == 8 && OS >= 8);
    let threads = (ATTN_WAVES * gpu::wave_size()) as usize;
    let mut j = gpu::thread_id() as usize;
    while j < T {
        // SAFETY: label j of the window.
        let l = unsafe { lab.add(j).read() } as u32;
        let mut w = [0u32; 4];
        for (x, w) in w.iter_mut().enumerate() {
            let h = |c: u32| if c == l { 0 } else { H1 };
            *w = h(2 * x as u32) | (h(2 * x as u32 + 1) << 16);
        }
        // SAFETY: row j of the tile, one 16-byte piece.
        unsafe { store8_bits(oh.add(j * OS), V8(w)) };
        j += threads;
    }
}

/// Starts copying the bias rows of query strip `strip` to this wave's
/// buffer `buf`: 16 rows of 144 halves (4,608 bytes, 16-byte pieces
/// spread over the wave), in place up to the buffer's swizzle.
///
/// # Safety
/// `bp` the (type, head) bias tile, `buf` 16 rows of 144 halves of
/// workgroup memory ([`Layout::buf`]); both 16-byte aligned.
#[inline(always)]
unsafe fn prefetch_bias(bp: *const u16, buf: Tile, strip: usize) {
    const ROW: u32 = T as u32 / 8;
    const PIECES: usize = 16 * T / 8;
    let ws = gpu::wave_size();
    let src = bp.wrapping_add(16 * strip * T);
    let lane = gpu::thread_id() % ws;
    // Piece c is row c / 18, column 8 (c % 18); the lane's pieces step by
    // the wave size, so row and column advance by constants (no division
    // per piece). In 32 bits: `usize` row and column cost 64-bit compares
    // and selects per piece.
    let (mut row, mut col) = (lane / ROW, lane % ROW);
    let (drow, dcol) = (ws / ROW, ws % ROW);
    for j in 0..PIECES.div_ceil(ws as usize) {
        let c = lane as usize + j * ws as usize;
        if c < PIECES {
            // SAFETY: piece c of the strip's rows (row 16 strip + row <
            // 144 of the tile) and of the buffer.
            unsafe {
                gpu::copy_to_workgroup(
                    buf.at(row as usize, 8 * col as usize).cast_mut(),
                    src.add(8 * c),
                )
            };
        }
        row += drow;
        col += dcol;
        if col >= ROW {
            col -= ROW;
            row += 1;
        }
        // One piece at a time on AMD, where the copy passes through
        // registers (all pieces' loads hoisted spilled on gfx908).
        gpu::sched_barrier();
    }
}

/// How a window's strips add the mask: none (also a window whose labels
/// are all equal: `z + 0` is `z`), on the matrix unit from one-hot rows,
/// or by comparing labels per element on the exact path ([`exact_strip`],
/// every strip; [`mask_mode`]).
const NO_MASK: u8 = 0;
const LABELS: u8 = 1;
const ONEHOT: u8 = 2;

/// Where a wave's strips read from: the staged q, k, v tiles, the wave's
/// bias strip buffer, the (type, head) bias tile in global memory, the
/// window's labels and its one-hot key tile.
#[derive(Clone, Copy)]
struct Tiles {
    q: Tile,
    k: Tile,
    v: Tile,
    buf: Tile,
    bias: *const u16,
    labels: *const i32,
    onehot: Tile,
    /// The wave's output strip.
    out: Tile,
}

/// The scale's constants: `1 / scale` as two f16 diagonals for the
/// matrix unit ([`Mma::add_scaled`]), `scale log2 e` for the exponent and
/// the mask value in units of `1 / scale`.
#[derive(Clone, Copy)]
struct Scale<M: Mma> {
    dhi: M::D,
    dlo: M::D,
    c: f32,
    /// The mask value in units of `1 / scale`, as f16 bits (the one-hot
    /// query rows' nonzero).
    mh: u16,
}

impl<M: Mma> Scale<M> {
    #[inline(always)]
    fn of(scale: f32) -> Self {
        let inv = 1.0 / scale;
        let dh = gpu::f2h(inv);
        let dl = gpu::f2h(inv - gpu::h2f(dh));
        let mh = gpu::f2h(ATTN_MASK_NEG * inv);
        Scale {
            dhi: M::diag(dh),
            dlo: M::diag(dl),
            c: scale * core::f32::consts::LOG2_E,
            mh,
        }
    }
}

/// Whether key `j` (its label in workgroup memory) lies in the region
/// `lrow` of a query row.
///
/// # Safety
/// `labels` valid for 144 entries, `j < 144`.
#[inline(always)]
unsafe fn same_region(labels: *const i32, j: usize, lrow: i32) -> bool {
    // SAFETY: caller contract.
    unsafe { labels.add(j).read() == lrow }
}

/// The strip's q operands (key dimensions 0..16 and 16..32).
///
/// # Safety
/// The staged q tile; `r0 + 16 <= 144`.
#[inline(always)]
unsafe fn strip_q<M: Mma>(l: Tiles, r0: usize) -> (M::A, M::A) {
    // SAFETY: rows r0..r0 + 16 of the q tile (in workgroup memory).
    unsafe { (M::load_a(l.q, r0, 0), M::load_a(l.q, r0, 16)) }
}

/// The strip's weights from its scores in `s` (in place): `e = 2^(fma(x,
/// c, -max_x c))`, returned rounded to f16 as left operands for `P V`
/// (their row sums are taken on the matrix unit with it:
/// [`Mma::add_row_sums`]).
#[inline(always)]
#[allow(clippy::needless_range_loop)]
fn softmax<M: Mma>(s: &mut [M::Acc; STRIPS], mx: [f32; MAX_ROWS], c: f32) -> [M::A; STRIPS] {
    let mut neg_ml = [0.0f32; MAX_ROWS];
    for r in 0..M::ROWS {
        neg_ml[r] = -(M::row_max(mx[r]) * c);
    }
    let mut p = [M::to_a(M::zero()); STRIPS];
    crate::unroll!(n in [0, 1, 2, 3, 4, 5, 6, 7, 8] {
        let acc = s[n].as_mut();
        for e in 0..M::ACC_LEN {
            let r = M::acc_slot(e);
            acc[e] = gpu::exp2_approx(gpu::fma(acc[e], c, neg_ml[r]));
        }
        p[n] = M::to_a(s[n]);
    });
    p
}

/// Each row's `1 / sum` from the row sums of the rounded weights: one
/// Newton step (two `fma`) on the hardware's reciprocal, within an f32 ulp
/// of the correctly rounded value (Markstein; exact division on the host).
/// A sum lies in [1, 144] (the row's largest weight is 1) or is NaN, which
/// stays NaN; so the IEEE division's range check and slow path (a branch
/// per row on NVIDIA) are not needed.
#[inline(always)]
fn inv_sums<M: Mma>(sums: M::Sums) -> [f32; MAX_ROWS] {
    let sum = M::row_sums(sums);
    let mut inv = [0.0f32; MAX_ROWS];
    for r in 0..M::ROWS {
        let y = gpu::recip_approx(sum[r]);
        inv[r] = gpu::fma(y, gpu::fma(-sum[r], y, 1.0), y);
    }
    inv
}

/// The strip the exact way, for a strip whose fast path met a non-finite
/// score (an infinite or NaN bias, whose zero products on the matrix unit
/// spread NaN over its row of the tile, or NaN / infinite inputs): `z =
/// fma(s, scale, bias) + mask` per element in f32 from the unbiased
/// scores and the bias read from memory (the strip buffer already holds
/// the next strip), so `-inf` entries get weight 0 and a row is NaN only
/// where PyTorch's is. Two passes over the keys (the max, then the
/// weights and `P V`), so that no tile's scores stay live: this path must
/// not raise the kernel's register peak. Returns `P V` and each row's `1 /
/// sum`.
///
/// # Safety
/// `bias` the strip's 16 rows of the (type, head) tile; the tiles as for
/// [`strips`].
#[inline(always)]
#[allow(clippy::needless_range_loop)]
unsafe fn exact_strip<M: Mma, const MODE: u8>(
    l: Tiles,
    r0: usize,
    bias: *const u16,
    scale: f32,
) -> (M::Acc, M::Acc, [f32; MAX_ROWS]) {
    const L2E: f32 = core::f32::consts::LOG2_E;
    // SAFETY: the staged q rows of the strip (caller contract).
    let q = unsafe { strip_q::<M>(l, r0) };
    // The labels of the lane's rows, as two values rather than an array (a
    // per-row array took stack on AMD).
    // SAFETY: rows r0 + slot_row(r) < 144 of the labels.
    let (lr0, lr1) = unsafe {
        (
            l.labels.add(r0 + M::slot_row(0) as usize).read(),
            l.labels.add(r0 + M::slot_row(M::ROWS - 1) as usize).read(),
        )
    };
    // Tile n's z in place of its scores.
    let z_of = |n: usize| {
        // SAFETY: the staged k tile (caller contract).
        let (k0, k1) = unsafe { (M::load_b_t(l.k, 16 * n, 0), M::load_b_t(l.k, 16 * n, 16)) };
        let mut s = M::mma(q.1, k1, M::mma(q.0, k0, M::zero()));
        let acc = s.as_mut();
        for e in 0..M::ACC_LEN {
            let r = M::acc_slot(e);
            let (i, j) = (M::acc_row(e) as usize, 16 * n + M::acc_col(e) as usize);
            // SAFETY: (i, j) inside the strip's rows (caller contract).
            let b = gpu::h2f(unsafe { bias.add(i * T + j).read() });
            let mut z = gpu::fma(acc[e], scale, b);
            let lr = if r == 0 { lr0 } else { lr1 };
            // SAFETY: j < 144.
            if MODE != NO_MASK && !unsafe { same_region(l.labels, j, lr) } {
                z += ATTN_MASK_NEG;
            }
            acc[e] = z;
        }
        s
    };
    let mut mx = [f32::NEG_INFINITY; MAX_ROWS];
    for n in 0..STRIPS {
        let s = z_of(n);
        for e in 0..M::ACC_LEN {
            let r = M::acc_slot(e);
            mx[r] = mx[r].max(s.as_ref()[e]);
        }
        // One tile at a time on AMD (all tiles' bias reads hoisted spilled).
        gpu::sched_barrier();
    }
    let mut neg_ml = [0.0f32; MAX_ROWS];
    for r in 0..M::ROWS {
        neg_ml[r] = -(M::row_max(mx[r]) * L2E);
    }
    let (mut o0, mut o1, mut sums) = (M::zero(), M::zero(), M::sums_zero());
    for n in 0..STRIPS {
        let mut s = z_of(n);
        let acc = s.as_mut();
        for e in 0..M::ACC_LEN {
            let r = M::acc_slot(e);
            acc[e] = gpu::exp2_approx(gpu::fma(acc[e], L2E, neg_ml[r]));
        }
        // SAFETY: the staged v tile (caller contract).
        let (v0, v1) = unsafe { (M::load_b(l.v, 16 * n, 0), M::load_b(l.v, 16 * n, 16)) };
        let p = M::to_a(s);
        o0 = M::mma(p, v0, o0);
        o1 = M::mma(p, v1, o1);
        sums = M::add_row_sums(p, sums);
        gpu::sched_barrier();
    }
    (o0, o1, inv_sums::<M>(sums))
}

/// Writes the strip's output rows `f16(o * inv)` (token `w * 144 + r0 +
/// i`, channels `h * 32..`), through the wave's output strip `ot` in
/// workgroup memory: each row's 64 bytes then leave as four 16-byte
/// pieces from four lanes.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn store_rows<M: Mma>(
    a: &Args,
    ot: Tile,
    w: usize,
    h: usize,
    r0: usize,
    o0: M::Acc,
    o1: M::Acc,
    inv: [f32; MAX_ROWS],
) {
    let ch = a.heads as usize * D;
    // Every lane's reads of the previous strip are done.
    gpu::wave_barrier();
    for (half, o) in [o0, o1].iter().enumerate() {
        let o = o.as_ref();
        let mut e = 0;
        while e < M::ACC_LEN {
            let i = M::acc_row(e) as usize;
            let d = 16 * half + M::acc_col(e) as usize;
            let r = M::acc_slot(e);
            let pair = pack2(o[e] * inv[r], o[e + 1] * inv[r]);
            // SAFETY: row i < 16, column d < 32 of the wave's strip; d
            // even, so 4-byte aligned.
            unsafe { ot.at(i, d).cast_mut().cast::<u32>().write(pair) };
            e += 2;
        }
    }
    gpu::wave_barrier();
    let ws = gpu::wave_size() as usize;
    let lane = gpu::thread_id() as usize % ws;
    // A constant count (two pieces per lane on NVIDIA, one on AMD), so
    // that every piece's load is issued before the first store (as a loop
    // to 64, each store waited for its load).
    for k in 0..16 * D / 8 / ws {
        let p = lane + k * ws;
        let (i, c) = (p / 4, 8 * (p % 4));
        // SAFETY: piece p of the strip (written above, after the barrier);
        // token (w, r0 + i), channels h * 32 + c.. of the output (caller),
        // 16-byte aligned.
        unsafe {
            gpu::copy_from_workgroup(a.out.add((w * T + r0 + i) * ch + h * D + c), ot.at(i, c))
        };
    }
}

/// The wave's query strips `wave, wave + 3, ..` of window `w`, head `h`:
/// scores, softmax, `P V`, the output rows. The first strip's bias rows
/// are in flight to `l.buf` (and every wave passed the barrier after the
/// staging).
#[inline(always)]
#[allow(clippy::needless_range_loop)]
fn strips<M: Mma, const MODE: u8>(
    a: &Args,
    l: Tiles,
    k: Scale<M>,
    wave: usize,
    w: usize,
    h: usize,
) {
    let mut redo = 0u32;
    let mut strip = wave;
    while strip < STRIPS {
        let r0 = 16 * strip;
        // SAFETY: every tile read below lies in the staged q, k, v (16-byte
        // aligned rows of LS halves in workgroup memory).
        let q = unsafe { strip_q::<M>(l, r0) };
        // Per 16-key tile, in units of 1 / scale: the bias times the two
        // diagonals, then q . k, on the matrix unit; the mask added; the
        // max of each of the lane's rows (one chain).
        // The one-hot rows of the strip's queries: `mh` in the column of
        // the row's region, so that their product with the keys'
        // complementary rows is exactly 0 within a region and `mh` across.
        let aoh = if MODE == ONEHOT {
            M::a8_of(|i, c| {
                // SAFETY: row r0 + i < 144 of the labels.
                let li = unsafe { l.labels.add(r0 + i as usize).read() } as u32;
                if c == li { k.mh } else { 0 }
            })
        } else {
            M::a8_of(|_, _| 0)
        };
        let mut s = [M::zero(); STRIPS];
        let mut mx = [f32::NEG_INFINITY; MAX_ROWS];
        crate::unroll!(n in [0, 1, 2, 3, 4, 5, 6, 7, 8] {
            // SAFETY: as above.
            let (k0, k1) = unsafe { (M::load_b_t(l.k, 16 * n, 0), M::load_b_t(l.k, 16 * n, 16)) };
            // The mask first, exactly 0 or `mh`: the matrix unit's sum then
            // starts from it.
            let acc = if MODE == ONEHOT {
                // SAFETY: rows 16n..16n + 16 of the one-hot key tile.
                let koh = unsafe { M::load_b8_t(l.onehot, 16 * n, 0) };
                M::mma8(aoh, koh, M::zero())
            } else {
                M::zero()
            };
            s[n] = M::mma(q.1, k1, M::mma(q.0, k0, acc));
        });
        // The strip's bias rows, fetched during the previous strip (the
        // first strip's during the start).
        gpu::copy_to_workgroup_wait();
        gpu::wave_barrier();
        crate::unroll!(n in [0, 1, 2, 3, 4, 5, 6, 7, 8] {
            // SAFETY: the bias tile is rows 0..16, columns 16n..16n + 16 of
            // the wave's buffer.
            let bt = unsafe { M::load_a(l.buf, 0, 16 * n) };
            s[n] = M::add_scaled(bt, k.dlo, M::add_scaled(bt, k.dhi, s[n]));
            // Per row the tile's four elements pairwise, then one step of
            // a chain over the tiles: 9 dependent steps, not 36 (the max
            // is exact in any order).
            let acc = s[n].as_ref();
            let mut t = [[f32::NEG_INFINITY; 4]; MAX_ROWS];
            for e in 0..M::ACC_LEN {
                t[M::acc_slot(e)][M::quad_pos(e)] = acc[e];
            }
            for r in 0..M::ROWS {
                mx[r] = mx[r].max(t[r][0].max(t[r][1]).max(t[r][2].max(t[r][3])));
            }
        });
        // Every lane is done with the buffer: fetch the wave's next strip
        // while this one finishes.
        gpu::wave_barrier();
        if strip + (ATTN_WAVES as usize) < STRIPS {
            // SAFETY: as for the first strip.
            unsafe { prefetch_bias(l.bias, l.buf, strip + ATTN_WAVES as usize) };
        }
        let p = softmax::<M>(&mut s, mx, k.c);
        // Keeps the v reads here: hoisted above the softmax, they raised the
        // register peak past gfx90a's 128 VGPRs (and spilled).
        gpu::sched_barrier();
        let (mut o0, mut o1, mut sums) = (M::zero(), M::zero(), M::sums_zero());
        crate::unroll!(n in [0, 1, 2, 3, 4, 5, 6, 7, 8] {
            // SAFETY: as for the k tiles.
            let (v0, v1) = unsafe { (M::load_b(l.v, 16 * n, 0), M::load_b(l.v, 16 * n, 16)) };
            o0 = M::mma(p[n], v0, o0);
            o1 = M::mma(p[n], v1, o1);
            sums = M::add_row_sums(p[n], sums);
            // One tile's v reads at a time on AMD: gfx908 budgets 64 VGPRs
            // (its MFMA results live in AGPRs), and all nine tiles' reads
            // hoisted together spilled there.
            gpu::sched_barrier();
        });
        let inv = inv_sums::<M>(sums);
        // A NaN sum: some score of the row was not finite; the strip is
        // done again the exact way after the others (module docs).
        let mut bad = false;
        for r in 0..M::ROWS {
            bad |= inv[r].is_nan();
        }
        redo |= u32::from(gpu::wave_any(bad)) << strip;
        store_rows::<M>(a, l.out, w, h, r0, o0, o1, inv);
        strip += ATTN_WAVES as usize;
    }
    // The strips with a non-finite score, the exact way (overwriting their
    // outputs in this thread's program order; wave-uniform).
    while redo != 0 {
        let strip = redo.trailing_zeros() as usize;
        redo &= redo - 1;
        let r0 = 16 * strip;
        // SAFETY: the strip's rows of the bias tile; the staged tiles.
        let (o0, o1, inv) = unsafe { exact_strip::<M, MODE>(l, r0, l.bias.add(r0 * T), a.scale) };
        store_rows::<M>(a, l.out, w, h, r0, o0, o1, inv);
    }
}

impl<const MASK: bool> MatrixKernel for Attention<MASK> {
    #[inline(always)]
    fn run<M: Mma>(self) {
        let a = self.0;
        let (w, h) = (gpu::block_id_y() as usize, gpu::block_id() as usize);
        let lds = gpu::workgroup_mem::<u16>();
        let lay = Layout::of::<M>();
        let lab = lds
            .wrapping_add(ATTN_LABEL_OFFSET as usize / 2)
            .cast::<i32>();
        let oh = lds.wrapping_add(ATTN_ONEHOT_OFFSET as usize / 2);
        // Every copy starts before the one wait: q, k and v, the labels
        // and the first bias strip arrive together (copied and waited for
        // one after another, they were about a tenth of the kernel's stall
        // samples on the H200). The tables are read after the q, k, v
        // copies start, so that their latency (and the range check's)
        // overlaps the copies'.
        let lookup = || {
            // SAFETY: w < windows: the tables hold one entry per window.
            unsafe {
                super::bias_mask_add::lookup::<MASK>(
                    a.types, a.slots, w as u32, a.n_types, a.n_slots,
                )
            }
        };
        // SAFETY: one workgroup per (window, head) (caller).
        unsafe { copy(&a, lay, lds, w, h) };
        let (ty, sl) = lookup();
        // The masked entry's scale constants while the copies are in
        // flight: its mode needs `mh` right after the barrier (computed
        // there, they were each window's start); the unmasked entry was
        // faster with them after the barrier.
        let early = MASK.then(|| Scale::<M>::of(a.scale));
        if MASK {
            // SAFETY: `lookup` trapped on slots out of range; the slot's
            // labels lie in `labels` (caller).
            unsafe { copy_labels(a.labels.add(sl as usize * T), lab) };
        }
        // SAFETY: `lookup` trapped on types out of range.
        let bp = unsafe { a.bias.add((ty as usize * a.heads as usize + h) * T * T) };
        let wave = gpu::wave_uniform(gpu::thread_id() / gpu::wave_size()) as usize;
        let buf = lay.buf(lds, wave);
        // The q, k, v and label copies as one group, the first bias strip as
        // a second, waited for by the strip.
        gpu::copy_to_workgroup_fence();
        // SAFETY: the wave's buffer; its first strip.
        unsafe { prefetch_bias(bp, buf, wave) };
        gpu::copy_to_workgroup_fence();
        gpu::copy_to_workgroup_wait_older();
        if !a.qkv_bias.is_null() {
            // SAFETY: this thread's pieces, copied and waited for.
            unsafe { add_qkv_bias(&a, lay, lds, h) };
        }
        gpu::barrier();
        let k = early.unwrap_or_else(|| Scale::<M>::of(a.scale));
        let l = Tiles {
            q: lay.qkv(lds, 0),
            k: lay.qkv(lds, 1),
            v: lay.qkv(lds, 2),
            buf,
            bias: bp,
            labels: lab,
            onehot: Tile::new(oh, OS, Swizzle::NONE),
            out: Tile::new(
                lds.wrapping_add(ATTN_OUT_OFFSET as usize / 2 + wave * 16 * D),
                D,
                Swizzle::QUADS,
            ),
        };
        // The one-hot product needs the mask in units of 1 / scale as a
        // finite f16 (scale above about 2^-9.4); smaller scales take the
        // exact path.
        let mode = match if MASK { mask_mode(lab) } else { NO_MASK } {
            ONEHOT if !gpu::h2f(k.mh).is_finite() => LABELS,
            m => m,
        };
        match mode {
            NO_MASK => strips::<M, NO_MASK>(&a, l, k, wave, w, h),
            ONEHOT => {
                // SAFETY: the labels are in 0..REGIONS (mask_mode); the tile
                // is the workgroup's. The mode is the workgroup's, so every
                // thread reaches the barrier.
                unsafe { write_onehot(lab, oh) };
                gpu::barrier();
                strips::<M, ONEHOT>(&a, l, k, wave, w, h)
            }
            _ => {
                // More regions than one-hot columns (not Pangu's or Swin's
                // windows): every strip the exact way, reading the bias from
                // memory (the first strip's copy is not used).
                gpu::copy_to_workgroup_wait();
                let mut strip = wave;
                while strip < STRIPS {
                    let r0 = 16 * strip;
                    // SAFETY: the strip's rows of the bias tile; the staged
                    // tiles and labels.
                    let (o0, o1, inv) =
                        unsafe { exact_strip::<M, LABELS>(l, r0, bp.add(r0 * T), a.scale) };
                    store_rows::<M>(&a, l.out, w, h, r0, o0, o1, inv);
                    strip += ATTN_WAVES as usize;
                }
            }
        }
    }
}

/// One workgroup per (window, head).
///
/// # Safety
/// `qkv` valid for `windows * 144 * 3 * heads * 32` halves and `out` for a
/// third of that, `qkv_bias` null or valid for `3 * heads * 32`, `bias`
/// for `n_types * heads * 144 * 144`, `labels` for `n_slots * 144` when
/// `MASK`, `types` (and `slots`) for `windows` entries, all 16-byte
/// aligned; `heads >= 1`; launched on a grid of (heads, windows) workgroups of
/// [`ATTN_WAVES`] waves and
/// [`ATTN_SHARED_BYTES`](wavefuse_shared::geometry::ATTN_SHARED_BYTES) of
/// workgroup memory.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub unsafe fn window_attention<const MASK: bool>(
    qkv: *const u16,
    qkv_bias: *const u16,
    out: *mut u16,
    bias: *const u16,
    labels: *const i32,
    types: *const i32,
    slots: *const i32,
    heads: u32,
    n_types: u32,
    n_slots: u32,
    scale: f32,
) {
    gpu::mma::run(Attention::<MASK>(Args {
        qkv,
        qkv_bias,
        out,
        bias,
        labels,
        types,
        slots,
        heads,
        n_types,
        n_slots,
        scale,
    }))
}

kernel! {
    /// Window attention with the earth bias (no mask).
    pub fn wf_window_attention_144(qkv: *const u16, qkv_bias: *const u16, out: *mut u16, bias: *const u16, labels: *const i32, types: *const i32, slots: *const i32, heads: u32, n_types: u32, n_slots: u32, scale: f32) {
        // SAFETY: extents, alignment and tables checked by the host API.
        unsafe { window_attention::<false>(qkv, qkv_bias, out, bias, labels, types, slots, heads, n_types, n_slots, scale) }
    }
}

kernel! {
    /// Window attention with the earth bias and the shifted-window mask
    /// from region labels.
    pub fn wf_window_attention_mask_144(qkv: *const u16, qkv_bias: *const u16, out: *mut u16, bias: *const u16, labels: *const i32, types: *const i32, slots: *const i32, heads: u32, n_types: u32, n_slots: u32, scale: f32) {
        // SAFETY: extents, alignment and tables checked by the host API.
        unsafe { window_attention::<true>(qkv, qkv_bias, out, bias, labels, types, slots, heads, n_types, n_slots, scale) }
    }
}
