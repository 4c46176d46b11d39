//! The one list of kernel entry points: name and typed parameters.
//!
//! [`for_each_kernel!`](crate::for_each_kernel) hands the list to a macro
//! of the caller's choosing. The host derives everything that names a
//! kernel from it: the symbols it loads from a code object, the emulator's
//! dispatch (which calls each host-built entry point with parameters of
//! exactly these types, so a list that disagrees with an entry's
//! definition does not compile) and the typed launch functions its ops
//! call (so an op that passes the wrong arguments does not compile).
//! `tests/amd_static.rs` checks that the code objects export exactly these
//! symbols.
//!
//! A new kernel: its `kernel!` entry in its family module, one line here,
//! and a host op.

/// Expands `$m! { name(param: Type, ...); ... }` over every kernel entry
/// point, in a fixed order.
#[macro_export]
macro_rules! for_each_kernel {
    ($m:ident) => {
        $m! {
            wf_layer_norm_192(x: *const u16, y: *mut u16, gamma: *const u16, beta: *const u16, rows: u64, eps: f32);
            wf_layer_norm_384(x: *const u16, y: *mut u16, gamma: *const u16, beta: *const u16, rows: u64, eps: f32);
            wf_layer_norm_768(x: *const u16, y: *mut u16, gamma: *const u16, beta: *const u16, rows: u64, eps: f32);
            wf_layer_norm_affine_192(x: *const u16, y: *mut u16, gamma: *const u16, beta: *const u16, rows: u64, eps: f32);
            wf_layer_norm_affine_384(x: *const u16, y: *mut u16, gamma: *const u16, beta: *const u16, rows: u64, eps: f32);
            wf_layer_norm_affine_768(x: *const u16, y: *mut u16, gamma: *const u16, beta: *const u16, rows: u64, eps: f32);
            wf_add_layer_norm_192(residual: *const u16, branch: *const u16, residual_out: *mut u16, y: *mut u16, gamma: *const u16, beta: *const u16, rows: u64, eps: f32);
            wf_add_layer_norm_384(residual: *const u16, branch: *const u16, residual_out: *mut u16, y: *mut u16, gamma: *const u16, beta: *const u16, rows: u64, eps: f32);
            wf_add_layer_norm_768(residual: *const u16, branch: *const u16, residual_out: *mut u16, y: *mut u16, gamma: *const u16, beta: *const u16, rows: u64, eps: f32);
            wf_add_layer_norm_affine_192(residual: *const u16, branch: *const u16, residual_out: *mut u16, y: *mut u16, gamma: *const u16, beta: *const u16, rows: u64, eps: f32);
            wf_add_layer_norm_affine_384(residual: *const u16, branch: *const u16, residual_out: *mut u16, y: *mut u16, gamma: *const u16, beta: *const u16, rows: u64, eps: f32);
            wf_add_layer_norm_affine_768(residual: *const u16, branch: *const u16, residual_out: *mut u16, y: *mut u16, gamma: *const u16, beta: *const u16, rows: u64, eps: f32);
            wf_layer_norm_gather_192(src: *const u16, idx: *const i32, out: *mut u16, gamma: *const u16, beta: *const u16, n_out: u64, n_src: u64, eps: f32);
            wf_layer_norm_gather_384(src: *const u16, idx: *const i32, out: *mut u16, gamma: *const u16, beta: *const u16, n_out: u64, n_src: u64, eps: f32);
            wf_layer_norm_gather_768(src: *const u16, idx: *const i32, out: *mut u16, gamma: *const u16, beta: *const u16, n_out: u64, n_src: u64, eps: f32);
            wf_layer_norm_gather_affine_192(src: *const u16, idx: *const i32, out: *mut u16, gamma: *const u16, beta: *const u16, n_out: u64, n_src: u64, eps: f32);
            wf_layer_norm_gather_affine_384(src: *const u16, idx: *const i32, out: *mut u16, gamma: *const u16, beta: *const u16, n_out: u64, n_src: u64, eps: f32);
            wf_layer_norm_gather_affine_768(src: *const u16, idx: *const i32, out: *mut u16, gamma: *const u16, beta: *const u16, n_out: u64, n_src: u64, eps: f32);
            wf_gather_192(src: *const u16, idx: *const i32, out: *mut u16, n_out: u64, n_src: u64);
            wf_gather_384(src: *const u16, idx: *const i32, out: *mut u16, n_out: u64, n_src: u64);
            wf_gather_768(src: *const u16, idx: *const i32, out: *mut u16, n_out: u64, n_src: u64);
            wf_gather_generic(src: *const u16, idx: *const i32, out: *mut u16, n_out: u64, n_src: u64, vecs: u64);
            wf_gather4_f32_to_f16(src: *const f32, idx: *const i32, out: *mut u16, n_out: u64, n_src: u64);
            wf_add_layer_norm_gather_192(residual: *const u16, branch: *const u16, residual_out: *mut u16, idx: *const i32, out: *mut u16, gamma: *const u16, beta: *const u16, n_out: u64, n_src: u64, eps: f32);
            wf_add_layer_norm_gather_384(residual: *const u16, branch: *const u16, residual_out: *mut u16, idx: *const i32, out: *mut u16, gamma: *const u16, beta: *const u16, n_out: u64, n_src: u64, eps: f32);
            wf_add_layer_norm_gather_768(residual: *const u16, branch: *const u16, residual_out: *mut u16, idx: *const i32, out: *mut u16, gamma: *const u16, beta: *const u16, n_out: u64, n_src: u64, eps: f32);
            wf_add_layer_norm_gather_affine_192(residual: *const u16, branch: *const u16, residual_out: *mut u16, idx: *const i32, out: *mut u16, gamma: *const u16, beta: *const u16, n_out: u64, n_src: u64, eps: f32);
            wf_add_layer_norm_gather_affine_384(residual: *const u16, branch: *const u16, residual_out: *mut u16, idx: *const i32, out: *mut u16, gamma: *const u16, beta: *const u16, n_out: u64, n_src: u64, eps: f32);
            wf_add_layer_norm_gather_affine_768(residual: *const u16, branch: *const u16, residual_out: *mut u16, idx: *const i32, out: *mut u16, gamma: *const u16, beta: *const u16, n_out: u64, n_src: u64, eps: f32);
            wf_bias_gelu_f16(x: *const u16, b: *const u16, y: *mut u16, n_vec: u32, cols_vec: u32);
            wf_bias_gelu_bf16(x: *const u16, b: *const u16, y: *mut u16, n_vec: u32, cols_vec: u32);
            wf_bias_gelu_tanh_f16(x: *const u16, b: *const u16, y: *mut u16, n_vec: u32, cols_vec: u32);
            wf_bias_gelu_tanh_bf16(x: *const u16, b: *const u16, y: *mut u16, n_vec: u32, cols_vec: u32);
            wf_bias_gelu_f16_scalar(x: *const u16, b: *const u16, y: *mut u16, n: u32, cols: u32);
            wf_bias_gelu_bf16_scalar(x: *const u16, b: *const u16, y: *mut u16, n: u32, cols: u32);
            wf_bias_gelu_tanh_f16_scalar(x: *const u16, b: *const u16, y: *mut u16, n: u32, cols: u32);
            wf_bias_gelu_tanh_bf16_scalar(x: *const u16, b: *const u16, y: *mut u16, n: u32, cols: u32);
            wf_qkv_split(qkv: *const u16, bias: *const u16, q: *mut u16, k: *mut u16, v: *mut u16, n_vec: u32, heads: u32, tokens: u32, scale: f32);
            wf_qkv_split_bias(qkv: *const u16, bias: *const u16, q: *mut u16, k: *mut u16, v: *mut u16, n_vec: u32, heads: u32, tokens: u32, scale: f32);
            wf_bias_mask_add(s: *mut u16, bias: *const u16, mask: *const u16, types: *const i32, slots: *const i32, heads: u32, tile_vec: u32, n_types: u32, n_slots: u32);
            wf_bias_mask_add_nomask(s: *mut u16, bias: *const u16, mask: *const u16, types: *const i32, slots: *const i32, heads: u32, tile_vec: u32, n_types: u32, n_slots: u32);
            wf_bias_mask_softmax_144(s: *const u16, p: *mut u16, bias: *const u16, mask: *const u16, types: *const i32, slots: *const i32, rows: u32, heads: u32, n_types: u32, n_slots: u32);
            wf_bias_mask_softmax_nomask_144(s: *const u16, p: *mut u16, bias: *const u16, mask: *const u16, types: *const i32, slots: *const i32, rows: u32, heads: u32, n_types: u32, n_slots: u32);
            wf_window_attention_144(qkv: *const u16, qkv_bias: *const u16, out: *mut u16, bias: *const u16, labels: *const i32, types: *const i32, slots: *const i32, heads: u32, n_types: u32, n_slots: u32, scale: f32);
            wf_window_attention_mask_144(qkv: *const u16, qkv_bias: *const u16, out: *mut u16, bias: *const u16, labels: *const i32, types: *const i32, slots: *const i32, heads: u32, n_types: u32, n_slots: u32, scale: f32);
        }
    };
}
