//! AMD backend (HIP module API). Placeholder until the HIP loader lands.
use super::cpu::Cpu;
use crate::device::BackendKind;
use crate::{Error, Result};

pub fn open(_ordinal: usize) -> Result<Cpu> {
    Err(Error::BackendUnavailable {
        backend: BackendKind::Hip,
        reason: "HIP backend not built yet".into(),
    })
}
