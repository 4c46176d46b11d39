//! Shapes, widths, launch geometry and index protocols shared by the
//! wavefuse device kernels (compiled for AMDGPU, NVPTX and the host) and the
//! host runtime. `no_std`; the window planner needs the `alloc` feature.
#![no_std]
#![deny(missing_docs)]

#[cfg(feature = "alloc")]
extern crate alloc;

pub mod geometry;
pub mod index;
pub mod layout;
pub mod target;
#[cfg(feature = "alloc")]
pub mod window;

pub use index::PAD;
pub use layout::{
    ADD_LN_AFFINE_192_BLOCK, ADD_LN_AFFINE_192_MIN_BLOCKS_SM, AddLnShape, LN_AFFINE_BLOCK,
    LN_AFFINE_MIN_BLOCKS_SM, LN_PARK_BYTES, ROW_AFFINE_MIN_BLOCKS_SM, ROW_BLOCK, RowLayout,
    VEC_HALVES, ln_block, ln_shared_bytes,
};
pub use target::Target;
