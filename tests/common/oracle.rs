//! f64 oracles: the suite's own (shared with the harness) plus test-only ones.
#![allow(unused_imports)]
pub use wavefuse_suite::oracle::*;
