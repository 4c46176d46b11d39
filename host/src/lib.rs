//! wavefuse: fused transformer kernels for AMD and NVIDIA GPUs, written once
//! in `no_std` Rust.
//!
//! ```no_run
//! use wavefuse::{Device, Choice, f16};
//! # fn main() -> Result<(), wavefuse::Error> {
//! let dev = Device::open(Choice::Auto)?; // CUDA, then HIP, then the CPU emulator
//! let rows = 4;
//! let x: Vec<f16> = (0..rows * 192).map(|i| f16::from_f32((i % 7) as f32)).collect();
//! let x = dev.upload(&x)?;
//! let mut y = dev.alloc::<f16>(rows * 192)?;
//! wavefuse::layer_norm(&dev, &x.view(), &mut y.view_mut(), 192, None, 1e-5)?;
//! let y = y.download()?;
//! # Ok(()) }
//! ```
//!
//! From an engine: on its memory and its stream (see the README, "Use it
//! from an engine").
//!
//! ```no_run
//! use wavefuse::{Choice, Device, View, ViewMut, f16, layer_norm};
//!
//! fn ln_on_engine_stream(
//!     raw_stream: *mut std::ffi::c_void, // the engine's CUstream / hipStream_t
//!     x: u64,                            // device address of the engine's [rows, 192] f16 input
//!     y: u64,                            // ... and output
//!     rows: usize,
//! ) -> wavefuse::Result<()> {
//!     let dev = Device::open(Choice::Cuda(0))?; // open once, keep (cheap to clone, Send + Sync)
//!     // SAFETY: the stream is live for as long as `q` is used.
//!     let q = unsafe { dev.wrap_stream(raw_stream) }?; // checked: a stream of this device's primary context
//!     // SAFETY: the spans stay allocated and unaliased until the work is done.
//!     let (x, mut y) = unsafe {
//!         (
//!             View::<f16>::from_raw(&dev, x, rows * 192)?, // checked against the driver's pointer attributes
//!             ViewMut::<f16>::from_raw(&dev, y, rows * 192)?,
//!         )
//!     };
//!     layer_norm(&q, &x, &mut y, 192, None, 1e-5) // queued on the engine's stream; returns at once
//! }
//! ```
#![deny(missing_docs)]

mod backend;
mod buffer;
mod device;
mod error;
mod info;
mod objects;
pub mod ops;
mod registry;

pub use buffer::{DeviceBuffer, Elem, View, ViewMut};
pub use device::{AsStream, Choice, Device, Event, Stream};
pub use error::Error;
pub use half::{bf16, f16};
pub use info::{BackendKind, DeviceInfo, Wave};
pub use ops::add_layer_norm::{add_layer_norm, add_layer_norm_to};
pub use ops::add_layer_norm_gather::add_layer_norm_gather;
pub use ops::bias_gelu::{GeluBias, GeluMode, bias_gelu};
pub use ops::bias_mask_add::{AttnBias, AttnMask, WindowTable, bias_mask_add};
pub use ops::bias_mask_softmax::{bias_mask_softmax, bias_mask_softmax_inplace};
pub use ops::gather::{GATHER_F32_ROW, GatherPlan, gather, gather_to_f16};
pub use ops::layer_norm::{Affine, layer_norm};
pub use ops::layer_norm_gather::layer_norm_gather;
pub use ops::qkv_split::{QkvSplit, qkv_split};
pub use ops::region_labels::{RegionLabels, RegionMask};
#[doc(hidden)]
pub use ops::window_attention::window_attention_split;
pub use ops::window_attention::{WindowAttention, WindowBias, window_attention};

/// Built code objects, for inspection (static checks, bundles).
pub mod code_objects {
    pub use crate::objects::{AMD, AMD_CODE_OBJECT_VERSION, PTX};
    pub use crate::registry::{KERNELS, Kernel};
}

/// Result type of every fallible wavefuse call.
pub type Result<T, E = Error> = std::result::Result<T, E>;
