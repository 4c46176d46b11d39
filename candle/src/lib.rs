//! wavefuse in candle.
//!
//! [`pangu`] holds the Pangu-Weather transformer stage written on candle:
//! one source, run either with candle's own ops ([`pangu::CandleOps`]) or
//! with wavefuse's fused kernels where one applies
//! ([`pangu::WavefuseOps`]); the GEMMs are candle's in both.
#![deny(missing_docs)]

pub mod pangu;
