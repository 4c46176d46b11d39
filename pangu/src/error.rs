//! The crate's error: every bad input is named before any compute.
use std::path::PathBuf;

/// What went wrong, naming the tensor, file or argument.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A required tensor is absent from a weight file.
    #[error("{file}: tensor `{name}` missing{hint}")]
    MissingTensor {
        /// The weight file.
        file: String,
        /// The tensor's name.
        name: String,
        /// Unknown names in the file, if any (a misnamed tensor).
        hint: String,
    },
    /// A tensor the model does not know (misnamed or from another model).
    #[error("{file}: unknown tensor `{name}` {shape:?}")]
    UnknownTensor {
        /// The weight file.
        file: String,
        /// The tensor's name.
        name: String,
        /// Its shape.
        shape: Vec<usize>,
    },
    /// A tensor or field of the wrong shape.
    #[error("{what}: shape {got:?}, expected {want}")]
    Shape {
        /// The tensor or argument.
        what: String,
        /// Its shape.
        got: Vec<usize>,
        /// What was expected.
        want: String,
    },
    /// A tensor or field of the wrong element type.
    #[error("{what}: element type {got}, expected {want}")]
    Dtype {
        /// The tensor or argument.
        what: String,
        /// Its element type.
        got: String,
        /// The expected element type.
        want: String,
    },
    /// NaN or Inf in a field or a weight.
    #[error("{what}: non-finite value {value} at {at}")]
    NonFinite {
        /// The tensor or argument.
        what: String,
        /// The first bad value.
        value: f32,
        /// Where (index names).
        at: String,
    },
    /// A grid the network cannot run.
    #[error("grid {lat} x {lon}: {why}")]
    Grid {
        /// Latitudes.
        lat: usize,
        /// Longitudes.
        lon: usize,
        /// Why not.
        why: String,
    },
    /// A bad command-line or configuration value.
    #[error("{what}: {why}")]
    Invalid {
        /// The argument.
        what: String,
        /// Why it is refused.
        why: String,
    },
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// A weight file that is not a readable safetensors file.
    #[error("{file}: {why}")]
    Format {
        /// The file.
        file: String,
        /// Why.
        why: String,
    },
    /// candle or a wavefuse kernel failed.
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
}

/// The crate's result.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// A mapper from an I/O error on `path`.
    pub fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Error {
        let path = path.into();
        move |source| Error::Io { path, source }
    }

    /// A refused argument `what`.
    pub fn invalid(what: impl Into<String>, why: impl Into<String>) -> Error {
        Error::Invalid {
            what: what.into(),
            why: why.into(),
        }
    }
}
