//! Support shared by wavefuse's kernel suite (tests/) and harness (src/main.rs).
#![deny(missing_docs)]

pub mod oracle;
