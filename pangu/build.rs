//! With the `cuda` feature, candle links the CUDA libraries (cudarc
//! `dynamic-linking`); on a machine without them, tools/cuda-toolkit.sh
//! builds link-time stubs with the real SONAMEs and exports their folder as
//! `WAVEFUSE_CUDA_STUBS`. A link-search line here, not RUSTFLAGS: changing
//! RUSTFLAGS rebuilds every crate, candle-kernels' nvcc step included.
fn main() {
    println!("cargo:rerun-if-env-changed=WAVEFUSE_CUDA_STUBS");
    if std::env::var_os("CARGO_FEATURE_CUDA").is_some()
        && let Some(dir) = std::env::var_os("WAVEFUSE_CUDA_STUBS")
    {
        println!("cargo:rustc-link-search=native={}", dir.to_string_lossy());
    }
}
