//! Where a forward's time goes: a timestamp at every step boundary
//! ([`crate::stage::StageOps::mark`]). On CUDA the timestamps are events
//! recorded on candle's stream, so a step's time is the device time of the
//! work queued between two marks (its launches, GEMMs included); on the
//! CPU they are host clock readings (every op there runs to completion
//! before it returns).
use candle_core::{Device, Result};
use std::cell::RefCell;
use std::time::Instant;

enum Stamp {
    Cpu(Instant),
    #[cfg(feature = "cuda")]
    Cuda(candle_core::cuda_backend::cudarc::driver::CudaEvent),
}

/// The stamps of one timed forward on one device.
struct Run {
    dev: Device,
    stamps: Vec<(&'static str, Stamp)>,
}

/// Step timestamps of one forward at a time; off until [`Probe::start`].
#[derive(Default)]
pub struct Probe {
    on: RefCell<Option<Run>>,
}

impl std::fmt::Debug for Probe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Probe")
            .field("on", &self.on.borrow().is_some())
            .finish()
    }
}

fn stamp(dev: &Device) -> Result<Stamp> {
    #[cfg(feature = "cuda")]
    if let Device::Cuda(c) = dev {
        use candle_core::cuda_backend::cudarc::driver::sys::CUevent_flags;
        let e = c
            .cuda_stream()
            .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(|e| candle_core::Error::Msg(format!("probe: {e:?}")))?;
        return Ok(Stamp::Cuda(e));
    }
    let _ = dev;
    Ok(Stamp::Cpu(Instant::now()))
}

impl Probe {
    /// Starts timing the steps on `device` (the stage's).
    pub fn start(&self, device: &Device) -> Result<()> {
        let s = stamp(device)?;
        *self.on.borrow_mut() = Some(Run {
            dev: device.clone(),
            stamps: vec![("start", s)],
        });
        Ok(())
    }

    /// Marks the end of `step` (nothing when not started).
    pub fn mark(&self, step: &'static str) -> Result<()> {
        let mut on = self.on.borrow_mut();
        if let Some(r) = on.as_mut() {
            let s = stamp(&r.dev)?;
            r.stamps.push((step, s));
        }
        Ok(())
    }

    /// Stops, waits for the work, and returns each step's microseconds in
    /// order (a step marked twice appears twice).
    pub fn finish(&self) -> Result<Vec<(&'static str, f64)>> {
        let Some(Run { dev, stamps }) = self.on.borrow_mut().take() else {
            return Ok(Vec::new());
        };
        dev.synchronize()?;
        let mut out = Vec::with_capacity(stamps.len());
        for w in stamps.windows(2) {
            let us = match (&w[0].1, &w[1].1) {
                (Stamp::Cpu(a), Stamp::Cpu(b)) => b.duration_since(*a).as_secs_f64() * 1e6,
                #[cfg(feature = "cuda")]
                (Stamp::Cuda(a), Stamp::Cuda(b)) => {
                    f64::from(
                        a.elapsed_ms(b)
                            .map_err(|e| candle_core::Error::Msg(format!("probe: {e:?}")))?,
                    ) * 1e3
                }
                #[cfg(feature = "cuda")]
                _ => candle_core::bail!("probe: stamps of two kinds"),
            };
            out.push((w[1].0, us));
        }
        Ok(out)
    }
}
