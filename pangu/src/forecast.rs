//! The forecast rollout: the lead time reached by the paper's hierarchical
//! rule (the largest model interval first), the fields kept on the device
//! between steps, each step's output written by a writer thread while the
//! next step computes.
use crate::error::{Error, Result};
use crate::fields;
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

/// The leads, in hours, whose fields a rollout of `plan` writes: every
/// step's when `every` is `None`, else each multiple of `every` hours it
/// reaches, and the last step's always.
pub fn written_leads(plan: &[u32], every: Option<u32>) -> Vec<u32> {
    let mut lead = 0;
    let mut out = Vec::new();
    for (i, &h) in plan.iter().enumerate() {
        lead += h;
        let due = every.is_none_or(|e| e > 0 && lead % e == 0);
        if due || i + 1 == plan.len() {
            out.push(lead);
        }
    }
    out
}

/// Where a rollout writes and how.
#[derive(Clone, Copy, Debug)]
pub struct Outputs<'a> {
    /// The folder (exists and is writable: the caller checked).
    pub dir: &'a Path,
    /// Write the steps whose lead is a multiple of this many hours (and
    /// the last step); `None` writes every step.
    pub every: Option<u32>,
    /// Write on a background thread while the next step computes (the
    /// command's way); `false` writes each file before the next step.
    pub background: bool,
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
    /// Whether its fields were written.
    pub written: bool,
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

/// One field's values on the host: page-locked memory on CUDA (a
/// device-to-host copy into pageable memory runs at a small fraction of
/// the bus's speed), a plain vector elsewhere. Reused from step to step.
enum HostBuf {
    Vec(Vec<f32>),
    #[cfg(feature = "cuda")]
    Pinned(candle_core::cuda_backend::cudarc::driver::PinnedHostSlice<f32>),
}

#[cfg(feature = "cuda")]
fn driver_err(e: impl std::fmt::Debug) -> Error {
    Error::Candle(candle_core::Error::Msg(format!(
        "device-to-host copy: {e:?}"
    )))
}

impl HostBuf {
    /// Copies `t` (any float dtype, any device) into this buffer as f32
    /// and waits for the copy.
    fn fill(&mut self, t: &Tensor) -> Result<()> {
        let t = t.to_dtype(DType::F32)?.contiguous()?;
        #[cfg(feature = "cuda")]
        if let Device::Cuda(dev) = t.device() {
            let n = t.elem_count();
            let (storage, layout) = t.storage_and_layout();
            let candle_core::Storage::Cuda(cs) = &*storage else {
                return Err(driver_err("a CUDA tensor without CUDA storage"));
            };
            let start = layout.start_offset();
            let src = cs.as_cuda_slice::<f32>()?.slice(start..start + n);
            let stream = dev.cuda_stream();
            if !matches!(self, HostBuf::Pinned(p) if p.len() == n) {
                // SAFETY: flags 0 is plain page-locked, cached memory; it
                // is written whole by the copy below before it is read.
                let p = unsafe { stream.context().alloc_pinned_with_flags::<f32>(n, 0) }
                    .map_err(driver_err)?;
                *self = HostBuf::Pinned(p);
            }
            if let HostBuf::Pinned(p) = self {
                stream.memcpy_dtoh(&src, p).map_err(driver_err)?;
                // Waits for the copy. Not the buffer's own event: candle
                // turns cudarc's event tracking off, so that event is
                // never recorded and would not wait.
                stream.synchronize().map_err(driver_err)?;
            }
            return Ok(());
        }
        *self = HostBuf::Vec(t.to_device(&Device::Cpu)?.flatten_all()?.to_vec1::<f32>()?);
        Ok(())
    }

    fn values(&self) -> Result<&[f32]> {
        match self {
            HostBuf::Vec(v) => Ok(v),
            #[cfg(feature = "cuda")]
            HostBuf::Pinned(p) => p.as_slice().map_err(driver_err),
        }
    }
}

/// A step's two fields on the host, with their shapes.
struct Staged {
    upper: HostBuf,
    surface: HostBuf,
    shapes: (Vec<usize>, Vec<usize>),
}

impl Staged {
    fn new() -> Staged {
        Staged {
            upper: HostBuf::Vec(Vec::new()),
            surface: HostBuf::Vec(Vec::new()),
            shapes: (Vec::new(), Vec::new()),
        }
    }

    fn fill(&mut self, upper: &Tensor, surface: &Tensor) -> Result<()> {
        self.upper.fill(upper)?;
        self.surface.fill(surface)?;
        self.shapes = (upper.dims().to_vec(), surface.dims().to_vec());
        Ok(())
    }

    fn write(&self, pu: &Path, ps: &Path) -> Result<()> {
        fields::write_values(pu, &self.shapes.0, self.upper.values()?)?;
        fields::write_values(ps, &self.shapes.1, self.surface.values()?)
    }
}

/// One step's output, on its device, written as the rollout writes it
/// (page-locked staging on CUDA) to the files of `lead` hours in `dir`:
/// returns the seconds of the device-to-host copy and of the file
/// writes, each measured alone, after an untimed first copy that
/// allocates the staging buffers.
pub fn copy_and_write(
    dir: &Path,
    lead: u32,
    upper: &Tensor,
    surface: &Tensor,
) -> Result<(f64, f64)> {
    let mut staged = Staged::new();
    staged.fill(upper, surface)?;
    let t = Instant::now();
    staged.fill(upper, surface)?;
    let copy = t.elapsed().as_secs_f64();
    let (pu, ps) = output_paths(dir, lead);
    let t = Instant::now();
    staged.write(&pu, &ps)?;
    Ok((copy, t.elapsed().as_secs_f64()))
}

/// A step's fields on the device, and on the host when they are written.
type StepFields = (Tensor, Tensor, Option<Staged>);

/// Runs `plan` (intervals from [`schedule`]) from `(upper, surface)` on
/// the models' device, each step starting from the previous step's fields
/// on the device, and writes the steps of [`written_leads`] into
/// `out.dir` as [`output_paths`]. `on_step` sees each step when its fields
/// are on the host (a progress bar).
pub fn rollout(
    models: &BTreeMap<u32, Pangu>,
    plan: &[u32],
    upper: Tensor,
    surface: Tensor,
    out: Outputs<'_>,
    mut on_step: impl FnMut(&Step),
) -> Result<Rollout> {
    let leads = written_leads(plan, out.every);
    for h in plan {
        if !models.contains_key(h) {
            return Err(Error::invalid("--weights", format!("no {h}h model loaded")));
        }
    }
    // Two host buffers circulate: the writer writes one while the next
    // step computes and is copied into the other; it hands each back when
    // its files are written, so the host never holds more than two steps.
    let (tx, rx) = mpsc::sync_channel::<(PathBuf, PathBuf, Staged)>(1);
    let (free_tx, free_rx) = mpsc::channel::<Staged>();
    let mut buffers = 0;
    // The buffer of the inline path (no writer thread).
    let mut spare: Option<Staged> = None;
    let writer = std::thread::spawn(move || -> Result<f64> {
        let mut busy = 0.0;
        for (pu, ps, staged) in rx {
            let t = Instant::now();
            staged.write(&pu, &ps)?;
            busy += t.elapsed().as_secs_f64();
            // The rollout may have ended: a buffer nobody takes is freed.
            let _ = free_tx.send(staged);
        }
        Ok(busy)
    });
    let start = Instant::now();
    let mut steps = Vec::with_capacity(plan.len());
    let (mut u, mut s) = (upper, surface);
    let mut lead = 0;
    let mut failure = None;
    let mut inline_write = 0.0;
    for &h in plan {
        let t = Instant::now();
        let write = leads.contains(&(lead + h));
        let step = (|| -> Result<StepFields> {
            let m = &models[&h];
            let (nu, ns) = m.forward(&u, &s)?;
            let host = if write {
                let mut staged = match spare.take().ok_or(()).or_else(|()| free_rx.try_recv()) {
                    Ok(b) => b,
                    Err(_) if buffers < 2 => {
                        buffers += 1;
                        Staged::new()
                    }
                    // The writer is behind: wait for its buffer (a writer
                    // that failed drops it, and its error is reported).
                    Err(_) => free_rx
                        .recv()
                        .map_err(|_| Error::invalid("writer", "the output writer stopped"))?,
                };
                staged.fill(&nu, &ns)?;
                Some(staged)
            } else {
                // The step's fields stay on the device; wait for them so
                // that the step's time is its own.
                nu.device().synchronize()?;
                None
            };
            Ok((nu, ns, host))
        })();
        let (nu, ns, host) = match step {
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
            written: write,
        };
        on_step(&st);
        steps.push(st);
        if let Some(staged) = host {
            let (pu, ps) = output_paths(out.dir, lead);
            if out.background {
                if tx.send((pu, ps, staged)).is_err() {
                    break;
                }
            } else {
                let t = Instant::now();
                let w = staged.write(&pu, &ps);
                inline_write += t.elapsed().as_secs_f64();
                spare = Some(staged);
                if let Err(e) = w {
                    failure = Some(e);
                    break;
                }
            }
        }
        u = nu;
        s = ns;
    }
    drop(tx);
    let written = writer
        .join()
        .map_err(|_| Error::invalid("writer", "the output writer panicked"))?;
    // A writer's error first: a step that stopped because the writer did
    // reports only that it stopped.
    let write_seconds = written? + inline_write;
    if let Some(e) = failure {
        return Err(e);
    }
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
        // (lead, models given, steps): largest interval first, each model
        // as often as it fits, then the next.
        for (lead, models, want) in [
            (168, &[24, 6, 3, 1][..], &[24; 7][..]),
            (31, &[24, 6, 1], &[24, 6, 1]),
            (31, &[1, 6, 24], &[24, 6, 1]),
            (56, &[1, 24, 6, 3], &[24, 24, 6, 1, 1]),
            (30, &[6], &[6; 5]),
            (30, &[24, 6], &[24, 6]),
            (6, &[24, 6], &[6]),
            (1, &[1], &[1]),
        ] {
            assert_eq!(
                schedule(lead, models).unwrap(),
                want,
                "{lead}h with {models:?}"
            );
        }
        // Unreachable leads name the lead and the intervals available.
        for (lead, models) in [(7, &[24, 6][..]), (30, &[24]), (5, &[6])] {
            let e = schedule(lead, models).unwrap_err().to_string();
            assert!(
                e.contains("--lead") && e.contains(&format!("{lead}h")),
                "{e}"
            );
            for h in models {
                assert!(e.contains(&format!("{h}h")), "{e}");
            }
        }
        assert!(schedule(24, &[]).is_err());
        assert_eq!(parse_hours("--lead", "7d").unwrap(), 168);
        assert_eq!(parse_hours("--lead", "168h").unwrap(), 168);
        assert!(parse_hours("--lead", "0h").is_err());
        assert!(parse_hours("--lead", "soon").is_err());
    }

    #[test]
    fn written_leads_follow_every() {
        for (plan, every, want) in [
            (&[24; 7][..], None, &[24, 48, 72, 96, 120, 144, 168][..]),
            (&[24; 7], Some(24), &[24, 48, 72, 96, 120, 144, 168]),
            (&[24; 7], Some(48), &[48, 96, 144, 168]),
            (&[24, 6, 1], None, &[24, 30, 31]),
            (&[24, 6, 1], Some(24), &[24, 31]),
            (&[6, 6, 6, 6], Some(12), &[12, 24]),
            (&[6, 6, 6], Some(100), &[18]),
        ] {
            assert_eq!(written_leads(plan, every), want, "{plan:?} every {every:?}");
        }
    }
}
