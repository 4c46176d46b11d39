//! Support shared by wavefuse's kernel suite (tests/) and harness
//! (src/main.rs): f64 oracles, error measures and row checks, and the
//! input generator.
#![deny(missing_docs)]

pub mod check;
pub mod oracle;
pub mod rng;
