//! Pangu-Weather in Rust: the whole network on candle with wavefuse's
//! fused kernels, the weight file (seeded weights shared with the PyTorch
//! reference, and [`convert`] from the released ONNX files), npy fields
//! in the official layout, and the forecast rollout.
//!
//! The network is described once in `MODEL.md` (graph, tensor names,
//! seeded generator); [`model::Pangu`] builds it (embedding, the
//! [`trunk::Trunk`] of layers with [`downsample`] and [`upsample`], patch
//! recovery), [`forecast`] runs it. [`stage`] holds the block in either
//! order, and the two-block stage the kernels were first measured on.
#![deny(missing_docs)]

pub mod config;
pub mod convert;
pub mod downsample;
pub mod error;
pub mod fields;
pub mod forecast;
pub mod memory;
pub mod model;
pub mod nn;
pub mod onnx;
pub mod seeded;
pub mod stage;
pub mod trunk;
pub mod upsample;
pub mod weights;

pub use config::{BlockOrder, Geometry};
pub use error::{Error, Result};
pub use model::{Build, Options, Pangu};
pub use weights::Weights;
