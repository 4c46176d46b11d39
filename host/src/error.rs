//! Typed errors. Every argument check runs before any launch.
use crate::info::BackendKind;

/// What went wrong.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No usable backend for this request.
    #[error("backend {backend:?} unavailable: {reason}")]
    BackendUnavailable {
        /// Backend asked for.
        backend: BackendKind,
        /// Why it cannot be used here.
        reason: String,
    },
    /// The device's architecture has no embedded code object.
    #[error("no code object for device arch {arch}; built: [{}]{hint}", built.join(", "))]
    NoCodeObject {
        /// The device's architecture (e.g. `gfx936`, `sm_75`).
        arch: String,
        /// Architectures with embedded code objects.
        built: Vec<String>,
        /// How to get one.
        hint: &'static str,
    },
    /// A driver / runtime call failed.
    #[error("{backend:?} call {call} failed: {detail} (code {code})")]
    Driver {
        /// Backend.
        backend: BackendKind,
        /// The failing call.
        call: &'static str,
        /// The driver's numeric error code (`CUresult`, `hipError_t`; -1
        /// for the emulator, which has none).
        code: i32,
        /// The driver's name for it, or what the emulator found.
        detail: String,
    },
    /// Memory handed to [`crate::View::from_raw`] /
    /// [`crate::ViewMut::from_raw`] cannot be used by this device.
    #[error("{op}: foreign span {addr:#x} + {bytes} bytes: {why}")]
    ForeignSpan {
        /// The constructor.
        op: &'static str,
        /// First byte.
        addr: u64,
        /// Length in bytes.
        bytes: usize,
        /// What the check found (null, host memory, another device, past
        /// the end of its allocation, ...).
        why: String,
    },
    /// A stream handed to [`crate::Device::wrap_stream`] does not belong
    /// to this device's primary context.
    #[error("wrap_stream: {why}")]
    ForeignStream {
        /// What the check found.
        why: String,
    },
    /// The emulator caught a kernel bug (partial collective, trap...).
    #[error("emulator: {0}")]
    Emulator(#[from] wavefuse_device::emu::EmuError),
    /// Row width without a compiled kernel.
    #[error("{op}: width {width} not supported (supported: {supported:?})")]
    UnsupportedWidth {
        /// Operation.
        op: &'static str,
        /// Width asked for.
        width: usize,
        /// Widths with kernels.
        supported: &'static [usize],
    },
    /// A length that must be a multiple of the row width is not.
    #[error("{op}: length {len} of `{what}` is not a multiple of width {width}")]
    RaggedRows {
        /// Operation.
        op: &'static str,
        /// Argument.
        what: &'static str,
        /// Its length.
        len: usize,
        /// Row width.
        width: usize,
    },
    /// Two arguments disagree in length.
    #[error("{op}: `{what}` has length {got}, expected {expected}")]
    LengthMismatch {
        /// Operation.
        op: &'static str,
        /// Argument.
        what: &'static str,
        /// Its length.
        got: usize,
        /// Expected length.
        expected: usize,
    },
    /// A buffer is not aligned for the 16-byte vector path.
    #[error("{op}: `{what}` starts at device address {addr:#x}, not {align}-byte aligned")]
    Misaligned {
        /// Operation.
        op: &'static str,
        /// Argument.
        what: &'static str,
        /// Address.
        addr: u64,
        /// Required alignment.
        align: u64,
    },
    /// A scalar parameter is out of its domain.
    #[error("{op}: parameter `{what}` = {value} is invalid: {why}")]
    BadParameter {
        /// Operation.
        op: &'static str,
        /// Parameter.
        what: &'static str,
        /// Value (formatted).
        value: String,
        /// Domain.
        why: &'static str,
    },
    /// The problem needs more workgroups than one launch can have.
    #[error("{op}: {rows} rows need {blocks} workgroups, over the launch limit")]
    TooLarge {
        /// Operation.
        op: &'static str,
        /// Rows asked for.
        rows: usize,
        /// Workgroups needed.
        blocks: usize,
    },
    /// Buffers of different devices were mixed.
    #[error("{op}: `{what}` belongs to another device")]
    WrongDevice {
        /// Operation.
        op: &'static str,
        /// Argument.
        what: &'static str,
    },
    /// An output aliases an input where the kernel does not allow it.
    #[error("{op}: `{a}` and `{b}` overlap")]
    Aliasing {
        /// Operation.
        op: &'static str,
        /// First argument.
        a: &'static str,
        /// Second argument.
        b: &'static str,
    },
}
