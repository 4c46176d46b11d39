//! The forecast rollout: the lead time reached by the paper's hierarchical
//! rule (the largest model interval first), the fields kept on the device
//! between steps, each step's output written by a writer thread while the
//! next step computes.
use crate::error::{Error, Result};
use crate::fields::{self, Field};
use crate::model::Pangu;
use candle_core::{DType, Device, Tensor};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Instant;

/// Parses a duration in hours: `24h`, `24`, or days `7d`.
pub fn parse_hours(what: &str, s: &str) -> Result<u32> {
    let bad = || {
        Error::invalid(
            what,
            format!("`{s}`: expected hours such as 24h (or days, 7d)"),
        )
    };
    let (num, mult) = if let Some(n) = s.strip_suffix('h') {
        (n, 1)
    } else if let Some(n) = s.strip_suffix('d') {
        (n, 24)
    } else {
        (s, 1)
    };
    let v: u32 = num.parse().map_err(|_| bad())?;
    v.checked_mul(mult).filter(|&v| v > 0).ok_or_else(bad)
}

/// The model intervals, in order, that reach `lead` hours: as many steps
/// of the largest interval as fit, then of the next, and so on (the
/// paper's hierarchical temporal aggregation). An error when the given
/// intervals cannot reach `lead` exactly.
pub fn schedule(lead: u32, intervals: &[u32]) -> Result<Vec<u32>> {
    let mut iv: Vec<u32> = intervals.iter().copied().filter(|&h| h > 0).collect();
    iv.sort_unstable_by(|a, b| b.cmp(a));
    iv.dedup();
    let mut left = lead;
    let mut steps = Vec::new();
    for &h in &iv {
        while left >= h {
            steps.push(h);
            left -= h;
        }
    }
    if left != 0 || steps.is_empty() {
        let have: Vec<String> = iv.iter().map(|h| format!("{h}h")).collect();
        return Err(Error::invalid(
            "--lead",
            format!(
                "{lead}h cannot be reached with models of {} (add a model whose interval divides the remainder, {left}h)",
                if have.is_empty() {
                    "no interval".into()
                } else {
                    have.join(", ")
                }
            ),
        ));
    }
    Ok(steps)
}

/// The output files of the step that ends at `lead` hours.
pub fn output_paths(dir: &Path, lead: u32) -> (PathBuf, PathBuf) {
    (
        dir.join(format!("output_upper_{lead:03}h.npy")),
        dir.join(format!("output_surface_{lead:03}h.npy")),
    )
}

/// What one step took.
#[derive(Clone, Debug)]
pub struct Step {
    /// Lead time at the end of the step, hours.
    pub lead: u32,
    /// The model interval used.
    pub interval: u32,
    /// Seconds from the step's start to its fields on the host.
    pub seconds: f64,
}

/// What a rollout took.
#[derive(Clone, Debug)]
pub struct Rollout {
    /// Each step.
    pub steps: Vec<Step>,
    /// Seconds from the first step's start to the last file written.
    pub total_seconds: f64,
    /// Seconds the writer spent writing files (overlapped with compute).
    pub write_seconds: f64,
}

/// Moves a field set of `dims` from the device to the host.
fn to_host(t: &Tensor) -> Result<Field> {
    let shape = t.dims().to_vec();
    let data = t
        .to_dtype(DType::F32)?
        .to_device(&Device::Cpu)?
        .flatten_all()?
        .to_vec1::<f32>()?;
    Ok(Field { shape, data })
}

/// Runs `plan` (intervals from [`schedule`]) from `(upper, surface)` on
/// the models' device, writing each step's fields into `out` as
/// [`output_paths`]. `on_step` sees each step when its fields are on the
/// host (a progress bar).
pub fn rollout(
    models: &BTreeMap<u32, Pangu>,
    plan: &[u32],
    upper: Tensor,
    surface: Tensor,
    out: &Path,
    mut on_step: impl FnMut(&Step),
) -> Result<Rollout> {
    for h in plan {
        if !models.contains_key(h) {
            return Err(Error::invalid("--weights", format!("no {h}h model loaded")));
        }
    }
    // One pending file pair at most: the writer overlaps the next step's
    // compute and never holds more than one step on the host.
    let (tx, rx) = mpsc::sync_channel::<(PathBuf, PathBuf, Field, Field)>(1);
    let writer = std::thread::spawn(move || -> Result<f64> {
        let mut busy = 0.0;
        for (pu, ps, fu, fs) in rx {
            let t = Instant::now();
            fields::write(&pu, &fu)?;
            fields::write(&ps, &fs)?;
            busy += t.elapsed().as_secs_f64();
        }
        Ok(busy)
    });
    let start = Instant::now();
    let mut steps = Vec::with_capacity(plan.len());
    let (mut u, mut s) = (upper, surface);
    let mut lead = 0;
    let mut failure = None;
    for &h in plan {
        let t = Instant::now();
        let step = (|| -> Result<(Tensor, Tensor, Field, Field)> {
            let m = &models[&h];
            let (nu, ns) = m.forward(&u, &s)?;
            let (fu, fs) = (to_host(&nu)?, to_host(&ns)?);
            Ok((nu, ns, fu, fs))
        })();
        let (nu, ns, fu, fs) = match step {
            Ok(v) => v,
            Err(e) => {
                failure = Some(e);
                break;
            }
        };
        lead += h;
        let st = Step {
            lead,
            interval: h,
            seconds: t.elapsed().as_secs_f64(),
        };
        on_step(&st);
        steps.push(st);
        let (pu, ps) = output_paths(out, lead);
        if tx.send((pu, ps, fu, fs)).is_err() {
            break;
        }
        u = nu;
        s = ns;
    }
    drop(tx);
    let written = writer
        .join()
        .map_err(|_| Error::invalid("writer", "the output writer panicked"))?;
    if let Some(e) = failure {
        return Err(e);
    }
    let write_seconds = written?;
    Ok(Rollout {
        steps,
        total_seconds: start.elapsed().as_secs_f64(),
        write_seconds,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hierarchical_rule() {
        assert_eq!(schedule(168, &[24, 6, 3, 1]).unwrap(), vec![24; 7]);
        assert_eq!(schedule(56, &[1, 24, 6, 3]).unwrap(), vec![24, 24, 6, 1, 1]);
        assert_eq!(schedule(30, &[6]).unwrap(), vec![6; 5]);
        let e = schedule(7, &[24, 6]).unwrap_err().to_string();
        assert!(e.contains("--lead") && e.contains("7h"), "{e}");
        assert!(schedule(24, &[]).is_err());
        assert_eq!(parse_hours("--lead", "7d").unwrap(), 168);
        assert_eq!(parse_hours("--lead", "168h").unwrap(), 168);
        assert!(parse_hours("--lead", "0h").is_err());
        assert!(parse_hours("--lead", "soon").is_err());
    }
}
