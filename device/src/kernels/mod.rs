//! Kernel families, one module each. Entry points are named
//! `wf_<family>[_<variant>]_<width>` and re-exported here; the host looks
//! them up by these names.
pub mod add_layer_norm;
pub mod add_layer_norm_gather;
pub mod bias_gelu;
pub mod bias_mask_add;
pub mod bias_mask_softmax;
pub mod gather;
pub mod layer_norm;
pub mod layer_norm_gather;
pub mod ln_affine;
pub mod ln_stats;
pub mod qkv_split;
pub mod window_attention;

pub use add_layer_norm::*;
pub use add_layer_norm_gather::*;
pub use bias_gelu::*;
pub use bias_mask_add::*;
pub use bias_mask_softmax::*;
pub use gather::*;
pub use layer_norm::*;
pub use layer_norm_gather::*;
pub use qkv_split::*;
pub use window_attention::*;
