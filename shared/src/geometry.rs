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
