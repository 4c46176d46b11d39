//! Fused 3D window attention on the matrix units: for each window `w` and
//! head `h`, `O = softmax(scale * Q K^T + mask(w) + bias[type(w), h]) V`
//! over Pangu's 144-token windows, heads of 32.
//!
//! Input: the QKV Linear's output [windows * 144, 3C] f16 (per token
//! `[q(C) | k(C) | v(C)]`, C = heads x 32 head-major, as
//! [`super::qkv_split`] reads it), optionally plus an f16 QKV bias [3C]
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
//! Numerics, per (window, head), query row `i`, key `j`:
//! - `s = sum_d q_d k_d`: f16 products, f32 accumulation by the matrix
//!   unit (q is not pre-scaled or rounded);
//! - `z = fma(s, scale, mask_ij) + bias_ij` in f32 (without a mask
//!   `z = fma(s, scale, bias_ij)`): the mask first, as in
//!   [`super::bias_mask_add`], and `s * scale + mask` rounded once;
//! - `m = max_j z` (f32, exact);
//! - `e = 2^(fma(z, log2 e, -(m * log2 e)))`, the hardware `exp2`
//!   ([`gpu::exp2_approx`]), one FMA instead of a subtract and a multiply;
//! - `sum = sum_j e` in f32 (unrounded `e`);
//! - `p = f16(e)`: the unnormalised weights are rounded once to f16 for
//!   `P V` on the matrix unit (f32 accumulation);
//! - `out = f16(o * (1 / sum))`.
//!
//! So the result is within half an ulp of `out` plus `2^-11 sum_j p_j |v_j|`
//! (the f16 rounding of `p`, as in PyTorch's unfused chain, whose softmax
//! output is f16) plus the effect of the f32 scores' rounding; the host
//! op (`wavefuse::ops::window_attention`) states the bound. A row whose
//! `z` holds NaN or +inf, or only -inf (a bias row of -inf), is NaN (as
//! `torch.softmax`); a label mask never masks a whole row (a token shares
//! its own region).
//!
//! Layout: one workgroup of [`ATTN_WAVES`] waves per head and run of
//! [`ATTN_RUN`] consecutive windows (`block_id = run * heads + head`).
//! Workgroup memory holds the (type, head) bias tile (144 x 144 f16,
//! unpadded, 16-byte pieces swizzled so that the eight rows a quad-row of
//! NVIDIA lanes reads fall in distinct banks), copied again only when a
//! window's type differs from the previous one's; the window's k and v
//! tiles (rows padded to [`ATTN_LDS_STRIDE`]); its region labels. All three
//! are copied in 16-byte pieces ([`gpu::copy_to_workgroup`]: `cp.async` on
//! NVIDIA, so no registers hold them in flight). Each wave then takes the
//! 16-row query strips `w, w + 3, w + 6`; the strip's q rows are read from
//! global memory straight into the matrix unit's operand layout
//! ([`Mma::load_a_global`]), one strip ahead. The strip's 16 x 144 scores
//! stay in registers as nine 16x16 accumulators; the row max and sum are
//! reduced over the lanes of a row; the rounded weights are reused in
//! registers as the left operand of `P V` ([`Mma::to_a`]). Nothing but q,
//! k, v, the bias tile once per run, the labels and the output touches
//! memory outside the workgroup.
//!
//! On NVIDIA the entry points carry launch bounds (`cargo xtask kernels`
//! writes `.maxntid 96` and `.minnctapersm 3` into the PTX: the workgroup
//! memory allows three workgroups per SM).
use crate::gpu::mma::{MAX_ROWS, MatrixKernel, Mma};
use crate::gpu::{self, pack2, widen2};
use crate::vec::{V8, load8_bits, store8_bits};
use wavefuse_shared::geometry::{
    ATTN_HEAD_DIM, ATTN_K_OFFSET, ATTN_LABEL_OFFSET, ATTN_LDS_STRIDE, ATTN_MASK_NEG, ATTN_RUN,
    ATTN_T, ATTN_WAVES,
};

const T: usize = ATTN_T as usize;
const D: usize = ATTN_HEAD_DIM as usize;
const LS: usize = ATTN_LDS_STRIDE as usize;
/// 16-row query strips (and 16-key tiles) per window.
const STRIPS: usize = T / 16;
/// 16-byte vectors of k and v per window and head.
const VECS: usize = 2 * T * D / 8;
/// Vectors per thread: 12 for three warps of 32 (6 of them used for three
/// waves of 64).
const PER_THREAD: usize = VECS / (ATTN_WAVES as usize * 32);
/// 16-byte pieces of a bias tile.
const BIAS_VECS: usize = T * T / 8;
const _: () = assert!(T.is_multiple_of(16) && VECS.is_multiple_of(ATTN_WAVES as usize * 64));
const _: () = assert!(PER_THREAD == 12 && ATTN_RUN >= 1);

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
    windows: u32,
    heads: u32,
    run: u32,
    n_types: u32,
    n_slots: u32,
    scale: f32,
}

struct Attention<const MASK: bool, const FAST: bool>(Args);

/// Item `i` of a window's k and v copy: (token row, part 1 = k or 2 = v,
/// quarter of the head row); consecutive items read consecutive 16 bytes.
#[inline(always)]
fn kv_item(i: usize) -> (usize, usize, usize) {
    (i / 8, 1 + (i % 8) / 4, i % 4)
}

/// Copies the window's k and v rows of head `h` into workgroup memory
/// through registers (all loads issued before the stores), adding the QKV
/// bias.
///
/// # Safety
/// As for [`window_attention`]; `lk` holds the k then the v tile.
// Index loops over register arrays unroll; iterators do not always.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
unsafe fn stage_kv(a: &Args, lk: *mut u16, w: usize, h: usize) {
    let ch = a.heads as usize * D;
    let tid = gpu::thread_id() as usize;
    let nthreads = (ATTN_WAVES * gpu::wave_size()) as usize;
    // A constant on the GPU targets (12 or 6), so the unused slots of the
    // wave64 build vanish at compile time.
    let per = VECS / nthreads;
    let mut v = [[0u32; 4]; PER_THREAD];
    crate::unroll!(j in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11] {
        let i = tid + j * nthreads;
        if j < per {
            let (t, part, c) = kv_item(i);
            let src = (w * T + t) * 3 * ch + part * ch + h * D + 8 * c;
            // SAFETY: the row lies in qkv (caller); 16-byte aligned.
            let x = unsafe { load8_bits(a.qkv.add(src)) };
            // SAFETY: part * C + h * 32 + 8c < 3C; aligned (caller).
            let b = unsafe { load8_bits(a.qkv_bias.add(part * ch + h * D + 8 * c)) };
            // Word by word (a whole-vector copy left the array in local
            // memory on NVPTX).
            for k in 0..4 {
                v[j][k] = gpu::add_h2(x.0[k], b.0[k]);
            }
        }
    });
    crate::unroll!(j in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11] {
        let i = tid + j * nthreads;
        if j < per {
            let (t, part, c) = kv_item(i);
            // SAFETY: inside the two tiles; rows of 80 bytes keep the
            // 16-byte alignment.
            unsafe { store8_bits(lk.add(((part - 1) * T + t) * LS + 8 * c), V8(v[j])) };
        }
    });
}

/// Starts copying the window's k and v rows of head `h` to workgroup
/// memory (`cp.async` on NVIDIA: no registers hold the data in flight).
///
/// # Safety
/// As for [`stage_kv`].
#[inline(always)]
unsafe fn copy_kv(a: &Args, lk: *mut u16, w: usize, h: usize) {
    let ch = a.heads as usize * D;
    let nthreads = (ATTN_WAVES * gpu::wave_size()) as usize;
    let mut i = gpu::thread_id() as usize;
    while i < VECS {
        let (t, part, c) = kv_item(i);
        // SAFETY: the row lies in qkv, the destination in the tiles; both
        // 16-byte aligned (caller).
        unsafe {
            gpu::copy_to_workgroup(
                lk.add(((part - 1) * T + t) * LS + 8 * c),
                a.qkv.add((w * T + t) * 3 * ch + part * ch + h * D + 8 * c),
            )
        };
        i += nthreads;
    }
}

/// Where halves `(i, j..j + 2)` (`j` even) of the bias tile lie in
/// workgroup memory: the 16-byte pieces of rows with bit 2 set are swapped
/// in pairs (`j ^ 8`), so that rows `g` and `g + 4` of a quad-row read do
/// not share banks (rows are 288 bytes, 8 banks apart).
#[inline(always)]
fn bias_at(i: usize, j: usize) -> usize {
    i * T + (j ^ (2 * (i & 4)))
}

/// Starts copying the (type, head) bias tile at `bp` to workgroup memory
/// at `lb`, swizzled as [`bias_at`] reads it.
///
/// # Safety
/// `bp` a whole bias tile, `lb` T x T halves of workgroup memory, both
/// 16-byte aligned.
#[inline(always)]
unsafe fn copy_bias(bp: *const u16, lb: *mut u16) {
    let nthreads = (ATTN_WAVES * gpu::wave_size()) as usize;
    let mut c = gpu::thread_id() as usize;
    while c < BIAS_VECS {
        let (r, q) = (c / (T / 8), c % (T / 8));
        // SAFETY: row r < 144 of the tile; 16-byte pieces of rows of 288
        // bytes (the swizzle swaps whole pieces within the row).
        unsafe { gpu::copy_to_workgroup(lb.add(bias_at(r, 8 * q)), bp.add(r * T + 8 * q)) };
        c += nthreads;
    }
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

/// How a strip adds the mask: none (`z = fma(s, scale, bias)`), from the
/// labels in workgroup memory, or a window of one region (`mask = 0`
/// everywhere: `z = fma(s, scale, 0) + bias`, the labels' result without
/// reading them).
const NO_MASK: u8 = 0;
const LABELS: u8 = 1;
const ONE_REGION: u8 = 2;

/// Whether the window's labels in workgroup memory are all equal (the
/// same answer on every lane of the wave).
#[inline(always)]
fn one_region(lab: *const i32) -> bool {
    let ws = gpu::wave_size() as usize;
    let lane = gpu::thread_id() as usize % ws;
    // SAFETY: labels 0..144 of the window (workgroup memory).
    let l0 = unsafe { lab.read() };
    let mut differ = 0u32;
    let mut t = lane;
    while t < T {
        // SAFETY: as above.
        differ |= u32::from(unsafe { lab.add(t).read() } != l0);
        t += ws;
    }
    let mut m = 1;
    while m < ws as u32 {
        differ |= gpu::shfl_xor_u32(differ, m);
        m <<= 1;
    }
    differ == 0
}

/// Workgroup-memory tiles of the current window.
#[derive(Clone, Copy)]
struct Tiles {
    bias: *const u16,
    k: *const u16,
    v: *const u16,
    labels: *const i32,
}

/// One 16-row query strip (rows `r0..r0 + 16`) of window `w`, head `h`:
/// scores, softmax, `P V`, the output rows.
#[inline(always)]
#[allow(clippy::needless_range_loop, clippy::too_many_arguments)]
fn strip<M: Mma, const MODE: u8>(
    a: &Args,
    l: Tiles,
    q0: M::A,
    q1: M::A,
    r0: usize,
    w: usize,
    h: usize,
) {
    let ch = a.heads as usize * D;
    let mut lrow = [0i32; MAX_ROWS];
    if MODE == LABELS {
        for r in 0..M::ROWS {
            // SAFETY: row r0 + slot_row(r) < 144 of the labels.
            lrow[r] = unsafe { l.labels.add(r0 + M::slot_row(r) as usize).read() };
        }
    }
    // Per 16-key tile: the scores, then z in place, and the max of each of
    // the lane's rows.
    let mut s = [M::zero(); STRIPS];
    let mut mx = [f32::NEG_INFINITY; MAX_ROWS];
    crate::unroll!(n in [0, 1, 2, 3, 4, 5, 6, 7, 8] {
        // SAFETY: every tile read lies in the staged k (16-byte aligned rows
        // of LS halves in workgroup memory).
        let (k0, k1) = unsafe {
            let p = l.k.add(16 * n * LS);
            (M::load_b_t(p, LS), M::load_b_t(p.add(16), LS))
        };
        s[n] = M::mma(q1, k1, M::mma(q0, k0, M::zero()));
        let acc = s[n].as_mut();
        let mut e = 0;
        while e < M::ACC_LEN {
            let i = r0 + M::acc_row(e) as usize;
            let j = 16 * n + M::acc_col(e) as usize;
            // SAFETY: (i, j..j + 2) lies in the bias tile; j is even, so the
            // pair is 4-byte aligned.
            let b = widen2(unsafe { l.bias.add(bias_at(i, j)).cast::<u32>().read() });
            for x in 0..2 {
                let z = match MODE {
                    NO_MASK => gpu::fma(acc[e + x], a.scale, b[x]),
                    ONE_REGION => gpu::fma(acc[e + x], a.scale, 0.0) + b[x],
                    _ => {
                        // SAFETY: j + x < 144.
                        let lc = unsafe { l.labels.add(j + x).read() };
                        let m = if lc == lrow[M::acc_slot(e)] { 0.0 } else { ATTN_MASK_NEG };
                        gpu::fma(acc[e + x], a.scale, m) + b[x]
                    }
                };
                acc[e + x] = z;
                let r = M::acc_slot(e);
                mx[r] = mx[r].max(z);
            }
            e += 2;
        }
    });
    let mut neg_ml = [0.0f32; MAX_ROWS];
    for r in 0..M::ROWS {
        neg_ml[r] = -(M::row_max(mx[r]) * core::f32::consts::LOG2_E);
    }
    let mut sum = [0.0f32; MAX_ROWS];
    let mut p = [M::to_a(M::zero()); STRIPS];
    crate::unroll!(n in [0, 1, 2, 3, 4, 5, 6, 7, 8] {
        let acc = s[n].as_mut();
        for e in 0..M::ACC_LEN {
            let r = M::acc_slot(e);
            let x = gpu::exp2_approx(gpu::fma(acc[e], core::f32::consts::LOG2_E, neg_ml[r]));
            acc[e] = x;
            sum[r] += x;
        }
        p[n] = M::to_a(s[n]);
    });
    let mut inv = [0.0f32; MAX_ROWS];
    for r in 0..M::ROWS {
        inv[r] = 1.0 / M::row_sum(sum[r]);
    }
    // Keeps the v reads here: hoisted above the softmax, they raised the
    // register peak past gfx90a's 128 VGPRs (and spilled).
    gpu::sched_barrier();
    let (mut o0, mut o1) = (M::zero(), M::zero());
    crate::unroll!(n in [0, 1, 2, 3, 4, 5, 6, 7, 8] {
        // SAFETY: as for the k tiles.
        let (v0, v1) = unsafe {
            let p = l.v.add(16 * n * LS);
            (M::load_b(p, LS), M::load_b(p.add(16), LS))
        };
        o0 = M::mma(p[n], v0, o0);
        o1 = M::mma(p[n], v1, o1);
        // One tile's v reads at a time on AMD: gfx908 budgets 64 VGPRs (its
        // MFMA results live in AGPRs), and all nine tiles' reads hoisted
        // together spilled there.
        gpu::sched_barrier();
    });
    for (half, o) in [o0, o1].iter().enumerate() {
        let o = o.as_ref();
        let mut e = 0;
        while e < M::ACC_LEN {
            let i = r0 + M::acc_row(e) as usize;
            let d = 16 * half + M::acc_col(e) as usize;
            let r = M::acc_slot(e);
            let pair = pack2(o[e] * inv[r], o[e + 1] * inv[r]);
            // SAFETY: token (w, i), channel h * 32 + d of the output
            // (caller); d even, so 4-byte aligned.
            unsafe {
                a.out
                    .add((w * T + i) * ch + h * D + d)
                    .cast::<u32>()
                    .write(pair)
            };
            e += 2;
        }
    }
}

impl<const MASK: bool, const FAST: bool> MatrixKernel for Attention<MASK, FAST> {
    #[inline(always)]
    fn run<M: Mma>(self) {
        let a = self.0;
        let heads = crate::math::divisor(a.heads);
        let tile = gpu::block_id();
        let (chunk, h) = ((tile / heads) as usize, (tile % heads) as usize);
        let first = chunk * a.run as usize;
        let end = (first + a.run as usize).min(a.windows as usize);
        let ch = a.heads as usize * D;
        let lds = gpu::workgroup_mem::<u16>();
        let lb = lds;
        let lk = lds.wrapping_add(ATTN_K_OFFSET as usize / 2);
        let lab = lds.wrapping_add(ATTN_LABEL_OFFSET as usize / 2).cast::<i32>();
        let tiles = Tiles {
            bias: lb,
            k: lk,
            v: lk.wrapping_add(T * LS),
            labels: lab,
        };
        let wave = gpu::wave_uniform(gpu::thread_id() / gpu::wave_size()) as usize;
        let has_qb = !a.qkv_bias.is_null();
        let zero_a = M::to_a(M::zero());
        // The q strip `strip` of window `w`, straight from global memory,
        // plus the q part of the QKV bias (stride 0: every row the same;
        // read again each time rather than held in registers).
        let load_q = |w: usize, strip: usize| {
            // SAFETY: rows 16 strip.. of window w < windows lie in qkv, and
            // head h's 32 q-bias halves in qkv_bias (caller); pairs 4-byte
            // aligned, rows 8-byte aligned.
            unsafe {
                let p = a.qkv.add((w * T + 16 * strip) * 3 * ch + h * D);
                let (q0, q1) = (M::load_a_global(p, 3 * ch), M::load_a_global(p.add(16), 3 * ch));
                if has_qb {
                    let b = a.qkv_bias.add(h * D);
                    (
                        M::add_a(q0, M::load_a_global(b, 0)),
                        M::add_a(q1, M::load_a_global(b.add(16), 0)),
                    )
                } else {
                    (q0, q1)
                }
            }
        };
        let mut qn = if first < end { load_q(first, wave) } else { (zero_a, zero_a) };
        let mut cached = u32::MAX;
        let mut w = first;
        while w < end {
            // SAFETY: w < windows: the tables hold one entry per window.
            let (ty, sl) = unsafe {
                super::bias_mask_add::lookup::<MASK>(a.types, a.slots, w as u32, a.n_types, a.n_slots)
            };
            // Every wave is done with the previous window's tiles.
            gpu::barrier();
            if ty != cached {
                // SAFETY: `lookup` trapped on types out of range; the tile
                // lies in the bias (caller).
                unsafe { copy_bias(a.bias.add((ty as usize * a.heads as usize + h) * T * T), lb) };
                cached = ty;
            }
            // SAFETY: as for `stage_kv` / `copy_kv` (caller).
            unsafe {
                if has_qb {
                    stage_kv(&a, lk, w, h)
                } else {
                    copy_kv(&a, lk, w, h)
                }
            };
            if MASK {
                // SAFETY: `lookup` trapped on slots out of range; the slot's
                // labels lie in `labels` (caller).
                unsafe { copy_labels(a.labels.add(sl as usize * T), lab) };
            }
            gpu::copy_to_workgroup_wait();
            gpu::barrier();
            let uniform = MASK && FAST && one_region(lab);
            let mut s = wave;
            while s < STRIPS {
                let (q0, q1) = qn;
                // The next strip's q, one strip ahead (the next window's
                // first after the last).
                let (nw, ns) = if s + (ATTN_WAVES as usize) < STRIPS {
                    (w, s + ATTN_WAVES as usize)
                } else {
                    (w + 1, wave)
                };
                if nw < end {
                    qn = load_q(nw, ns);
                }
                if !MASK {
                    strip::<M, NO_MASK>(&a, tiles, q0, q1, 16 * s, w, h);
                } else if uniform {
                    strip::<M, ONE_REGION>(&a, tiles, q0, q1, 16 * s, w, h);
                } else {
                    strip::<M, LABELS>(&a, tiles, q0, q1, 16 * s, w, h);
                }
                s += ATTN_WAVES as usize;
            }
            w += 1;
        }
    }
}

/// One workgroup per head and run of `run` consecutive windows.
///
/// # Safety
/// `qkv` valid for `windows * 144 * 3 * heads * 32` halves and `out` for a
/// third of that, `qkv_bias` null or valid for `3 * heads * 32`, `bias`
/// for `n_types * heads * 144 * 144`, `labels` for `n_slots * 144` when
/// `MASK`, `types` (and `slots`) for `windows` entries, all 16-byte
/// aligned; `heads >= 1`, `run >= 1`; launched with
/// `ceil(windows / run) * heads` workgroups of [`ATTN_WAVES`] waves and
/// [`ATTN_SHARED_BYTES`](wavefuse_shared::geometry::ATTN_SHARED_BYTES) of
/// workgroup memory.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub unsafe fn window_attention<const MASK: bool, const FAST: bool>(
    qkv: *const u16,
    qkv_bias: *const u16,
    out: *mut u16,
    bias: *const u16,
    labels: *const i32,
    types: *const i32,
    slots: *const i32,
    windows: u32,
    heads: u32,
    run: u32,
    n_types: u32,
    n_slots: u32,
    scale: f32,
) {
    gpu::mma::run(Attention::<MASK, FAST>(Args {
        qkv,
        qkv_bias,
        out,
        bias,
        labels,
        types,
        slots,
        windows,
        heads,
        run,
        n_types,
        n_slots,
        scale,
    }))
}

kernel! {
    /// Window attention with the earth bias (no mask).
    pub fn wf_window_attention_144(qkv: *const u16, qkv_bias: *const u16, out: *mut u16, bias: *const u16, labels: *const i32, types: *const i32, slots: *const i32, windows: u32, heads: u32, run: u32, n_types: u32, n_slots: u32, scale: f32) {
        // SAFETY: extents, alignment and tables checked by the host API.
        unsafe { window_attention::<false, false>(qkv, qkv_bias, out, bias, labels, types, slots, windows, heads, run, n_types, n_slots, scale) }
    }
}

kernel! {
    /// Window attention with the earth bias and the shifted-window mask
    /// from region labels.
    pub fn wf_window_attention_mask_144(qkv: *const u16, qkv_bias: *const u16, out: *mut u16, bias: *const u16, labels: *const i32, types: *const i32, slots: *const i32, windows: u32, heads: u32, run: u32, n_types: u32, n_slots: u32, scale: f32) {
        // SAFETY: extents, alignment and tables checked by the host API.
        unsafe { window_attention::<true, true>(qkv, qkv_bias, out, bias, labels, types, slots, windows, heads, run, n_types, n_slots, scale) }
    }
}

kernel! {
    /// EXPERIMENT: labels path for every window.
    pub fn wf_window_attention_mask_144_slow(qkv: *const u16, qkv_bias: *const u16, out: *mut u16, bias: *const u16, labels: *const i32, types: *const i32, slots: *const i32, windows: u32, heads: u32, run: u32, n_types: u32, n_slots: u32, scale: f32) {
        // SAFETY: extents, alignment and tables checked by the host API.
        unsafe { window_attention::<true, false>(qkv, qkv_bias, out, bias, labels, types, slots, windows, heads, run, n_types, n_slots, scale) }
    }
}
