//! `kernel!`: one definition, a GPU entry point or a host function.
//!
//! On AMDGPU and NVPTX the item becomes an unmangled `extern "gpu-kernel"`
//! entry point (the symbol the host looks up by name). On the host it
//! becomes a plain `unsafe fn` that the emulator calls once per thread.

macro_rules! kernel {
    ($(#[$meta:meta])* pub fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $body:block) => {
        $(#[$meta])*
        ///
        /// # Safety
        /// Pointers must be valid for the extents the host API checked.
        #[cfg(any(target_arch = "amdgpu", target_arch = "nvptx64"))]
        #[unsafe(no_mangle)]
        pub unsafe extern "gpu-kernel" fn $name($($arg: $ty),*) $body

        $(#[$meta])*
        ///
        /// # Safety
        /// Must run inside [`crate::emu`]; pointers must be valid for the
        /// extents the host API checked.
        #[cfg(not(any(target_arch = "amdgpu", target_arch = "nvptx64")))]
        #[allow(clippy::missing_safety_doc, clippy::too_many_arguments)]
        pub unsafe fn $name($($arg: $ty),*) $body
    };
}
