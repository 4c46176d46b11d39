//! The Pangu-Weather stage on candle: two Earth-specific transformer blocks
//! (unshifted, shifted), post-norm with the level and latitude mask as the
//! released weights need, or pre-norm with Swin's three-axis mask as in the
//! profiled student model ([`StageConfig::with_order`]).
//!
//! One source ([`Stage`], written against [`StageOps`]), two builds picked
//! at run time: [`CandleOps`] (candle's own ops, as PyTorch would write
//! them) and [`WavefuseOps`] (wavefuse's fused kernels wherever one
//! applies). The GEMMs are cuBLAS in both (candle's matmul; the wavefuse
//! build's Linears with their bias in the epilogue). The window tables come from
//! [`wavefuse_shared::window::WindowPlan`], the planner the kernels use,
//! so both builds window, mask and type tokens the same way.
mod block;
mod candle_ops;
pub mod config;
pub(crate) mod ops;
mod probe;
pub mod tables;
mod wavefuse_ops;
pub mod weights;

pub use block::{Block, Stage};
pub use candle_ops::{CandleOps, affine_layer_norm, partition, unpartition};
pub use config::{BlockOrder, MaskAxes, StageConfig};
pub use ops::{Affine, StageOps};
pub use probe::Probe;
pub use tables::Windowing;
pub use wavefuse_ops::WavefuseOps;
