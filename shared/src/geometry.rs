//! Launch geometry of the element-wise and attention-side kernels: the
//! constants both the kernels (loop bounds, lane roles) and the host
//! (grid sizes) are built from. The row kernels' layouts are in
//! [`crate::layout`].

/// bias + GELU: threads per workgroup.
pub const GELU_BLOCK: u32 = 256;
/// bias + GELU: items (16-byte vectors or scalars) per thread.
pub const GELU_PER_THREAD: u32 = 4;

/// bias + mask add: threads per workgroup (3 waves of 64, 6 warps of 32).
pub const ADD_BLOCK: u32 = 192;

/// bias + mask + softmax: row length with a kernel.
pub const SOFTMAX_T: u32 = 144;
/// bias + mask + softmax: lanes per row.
pub const SOFTMAX_LANES: u32 = 6;
/// bias + mask + softmax: threads per workgroup (4 waves of 64, 8 warps of 32).
pub const SOFTMAX_BLOCK: u32 = 256;
/// bias + mask + softmax: rows per workgroup (8 warps x 5 rows or 4 waves x 10 rows).
pub const SOFTMAX_ROWS: u32 = 40;

/// Generic-width gather: lanes that share one token (fits wave32 and wave64).
pub const GENERIC_LANES: u32 = 32;

/// QKV split: threads per workgroup.
pub const QKV_BLOCK: u32 = 256;
/// QKV split: 16-byte vectors per thread.
pub const QKV_PER_THREAD: u32 = 4;
/// QKV split: the only head dimension with a kernel.
pub const QKV_HEAD_DIM: u32 = 32;

/// Window attention: tokens per window.
pub const ATTN_T: u32 = 144;
/// Window attention: channels per head.
pub const ATTN_HEAD_DIM: u32 = 32;
/// Window attention: the mask value between tokens of different regions of
/// a shifted window (Swin's and Pangu's `-100`, not `-inf`).
pub const ATTN_MASK_NEG: f32 = -100.0;
/// Window attention: the most regions of a window whose mask the kernel
/// adds on the matrix unit (one-hot rows of 8 columns, a 16x16x8 step;
/// Pangu's 3D shifted windows have up to 8 regions, Swin's 2D ones 4);
/// windows with more take the kernel's exact path.
pub const ATTN_ONEHOT_REGIONS: u32 = 8;
/// Window attention: row stride of the one-hot key tile in workgroup
/// memory (halves): dense 16-byte rows, so the eight rows one `ldmatrix`
/// phase reads are 128 contiguous bytes (every bank once).
pub const ATTN_ONEHOT_STRIDE: u32 = 8;
/// Window attention: the smallest `scale` with a kernel (2^-14): the
/// kernel multiplies the bias by `1 / scale` on the matrix unit as two f16
/// parts, which need `1 / scale` within f16's range.
pub const ATTN_SCALE_MIN: f32 = 1.0 / 16384.0;
/// Window attention: the largest `scale` with a kernel (8): up to it the
/// two f16 parts of `1 / scale` are within `2^-22` of it (module docs of
/// the host op).
pub const ATTN_SCALE_MAX: f32 = 8.0;
/// Window attention: waves per workgroup (one workgroup per window and
/// head; wave `w` takes the 16-row query strips `w, w + 3, w + 6`).
pub const ATTN_WAVES: u32 = 3;
/// Window attention: row stride of the q, k, v tiles in workgroup memory
/// on AMD (halves): 32 + 8 of padding, so the rows a wave's reads meet
/// fall in distinct bank groups. NVIDIA builds store dense 64-byte rows
/// with swizzled chunks in the same space (the device facade's
/// `Mma::DENSE_TILES`).
pub const ATTN_LDS_STRIDE: u32 = 40;
/// Window attention: row stride of each wave's bias strip buffer on AMD
/// (halves): 144 + 8 of padding (NVIDIA: dense swizzled 288-byte rows in
/// the same space).
pub const ATTN_BIAS_STRIDE: u32 = 152;
/// Window attention: byte offset of the window's 144 region labels (i32)
/// in workgroup memory, after the q, k and v tiles and each wave's bias
/// strip buffer (16 rows of [`ATTN_BIAS_STRIDE`] halves).
pub const ATTN_LABEL_OFFSET: u32 =
    3 * ATTN_T * ATTN_LDS_STRIDE * 2 + ATTN_WAVES * 16 * ATTN_BIAS_STRIDE * 2;
/// Window attention: workgroup memory per workgroup (bytes): the q, k and
/// v tiles of one window and head, each wave's bias strip buffer, the
/// window's labels, its one-hot key tile, each wave's output strip.
/// 55,104 bytes: within gfx9's 64
/// KiB; above the 48 KiB an NVIDIA launch takes without an opt-in (the
/// host sets the kernel's limit to this when it loads the module); four
/// workgroups per SM on sm_90 (228 KiB, 1 KiB reserved per workgroup).
pub const ATTN_SHARED_BYTES: u32 = ATTN_OUT_OFFSET + ATTN_WAVES * 16 * ATTN_HEAD_DIM * 2;
/// Window attention: byte offset of each wave's output strip (16 rows of
/// [`ATTN_HEAD_DIM`] halves, swizzled 64-byte rows), after the one-hot key
/// tile: a strip's outputs pass through it so that each row leaves in
/// 16-byte pieces.
pub const ATTN_OUT_OFFSET: u32 = ATTN_ONEHOT_OFFSET + ATTN_T * ATTN_ONEHOT_STRIDE * 2;
/// Window attention: byte offset of the one-hot key tile (144 rows of
/// [`ATTN_ONEHOT_STRIDE`] halves), after the labels.
pub const ATTN_ONEHOT_OFFSET: u32 = ATTN_LABEL_OFFSET + ATTN_T * 4;
const _: () = assert!(
    ATTN_SHARED_BYTES <= 64 * 1024
        && ATTN_LABEL_OFFSET.is_multiple_of(16)
        && ATTN_ONEHOT_OFFSET.is_multiple_of(16)
        && ATTN_OUT_OFFSET.is_multiple_of(64)
);
/// Window attention: workgroups per SM the NVIDIA build's register budget
/// is set for (PTX `.minnctapersm`, written by `cargo xtask kernels`):
/// 168 registers per thread; the workgroup memory allows 4 on sm_90.
pub const ATTN_MIN_BLOCKS_SM: u32 = 4;
