//! placeholder
use crate::Result;
use std::path::Path;
pub struct Opts;
pub fn parse(_a: &[String]) -> Result<Opts> {
    Ok(Opts)
}
pub fn run(_r: &Path, _o: &Opts) -> Result<()> {
    Ok(())
}
