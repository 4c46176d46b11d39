//! Load-time constants of one block's windowing: the window plan, the
//! shifted-window mask, the window -> type map and the earth-specific bias
//! position index. Built once per block; both builds of the stage read
//! them (candle's own ops as tensors, wavefuse's kernels as tables).
use super::wavefuse_ops::Tables;
use candle_core::{DType, Device, Result, Tensor};
use std::sync::OnceLock;
use wavefuse_shared::window::{Grid3, MaskSlots, Shift3, Window3, WindowPlan};

/// One block's windowing on one grid.
#[derive(Debug)]
pub struct Windowing {
    plan: WindowPlan,
    slots: Option<MaskSlots>,
    mask: Option<Tensor>,
    device: Device,
    /// The wavefuse build's plans and tables, built on its first use.
    wavefuse: OnceLock<Tables>,
}

impl Windowing {
    /// Plans `grid` in `window`s after a cyclic shift by `shift` and, for a
    /// shifted block, builds its mask on `device` in `dtype` (the stage's
    /// activation type; 0 and -100 are exact in f16).
    pub fn new(
        grid: Grid3,
        window: Window3,
        shift: Shift3,
        device: &Device,
        dtype: DType,
    ) -> Result<Windowing> {
        let plan = WindowPlan::new(grid, window, shift)
            .map_err(|e| candle_core::Error::Msg(format!("window plan: {e:?}")))?;
        Windowing::from_plan(plan, device, dtype)
    }

    /// [`Windowing::new`] for a global grid, longitude periodic
    /// ([`WindowPlan::periodic_w`]): the shift mask cuts level and
    /// latitude regions only, as the released Pangu-Weather model does.
    pub fn earth(
        grid: Grid3,
        window: Window3,
        shift: Shift3,
        device: &Device,
        dtype: DType,
    ) -> Result<Windowing> {
        let plan = WindowPlan::new(grid, window, shift)
            .and_then(|p| p.periodic_w())
            .map_err(|e| candle_core::Error::Msg(format!("window plan: {e:?}")))?;
        Windowing::from_plan(plan, device, dtype)
    }

    /// The windowing of `plan`.
    pub fn from_plan(plan: WindowPlan, device: &Device, dtype: DType) -> Result<Windowing> {
        let (slots, mask) = if plan.is_shifted() {
            let s = plan.mask_slots();
            let t = plan.tokens_per_window();
            let masks =
                Tensor::from_slice(&s.slot_masks, (s.n_slots, t, t), device)?.to_dtype(dtype)?;
            let idx: Vec<u32> = s.window_to_slot.iter().map(|&v| v as u32).collect();
            let idx = Tensor::from_vec(idx, s.window_to_slot.len(), device)?;
            // Swin's [windows, 1, T, T] mask, broadcast over heads.
            let mask = masks.index_select(&idx, 0)?.unsqueeze(1)?;
            (Some(s), Some(mask))
        } else {
            (None, None)
        };
        Ok(Windowing {
            plan,
            slots,
            mask,
            device: device.clone(),
            wavefuse: OnceLock::new(),
        })
    }

    /// The device the windowing's tensors and tables live on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The wavefuse build's plans and tables, built on first use and kept.
    pub(crate) fn wavefuse(&self) -> Result<&Tables> {
        if self.wavefuse.get().is_none() {
            // Two threads racing here build twice and keep one.
            let _ = self.wavefuse.set(Tables::new(self)?);
        }
        self.wavefuse
            .get()
            .ok_or_else(|| candle_core::Error::Msg("windowing: wavefuse tables not built".into()))
    }

    /// The window plan (grid, padding, shift, tables).
    pub fn plan(&self) -> &WindowPlan {
        &self.plan
    }

    /// The shifted-window mask `[windows, 1, T, T]` (0 or -100), `None`
    /// for an unshifted block.
    pub fn mask(&self) -> Option<&Tensor> {
        self.mask.as_ref()
    }

    /// The deduplicated masks and the window -> slot table (what the fused
    /// softmax reads), `None` for an unshifted block.
    pub fn mask_slots(&self) -> Option<&MaskSlots> {
        self.slots.as_ref()
    }

    /// Windows of the padded grid.
    pub fn n_windows(&self) -> usize {
        self.plan.n_windows()
    }

    /// Tokens per window.
    pub fn tokens_per_window(&self) -> usize {
        self.plan.tokens_per_window()
    }

    /// Pangu window types (`(Zp / wz) * (Hp / wh)`).
    pub fn n_types(&self) -> usize {
        self.plan.n_window_types()
    }
}

/// Rows of Pangu's earth-specific bias table for `window`:
/// `(2 ww - 1) * wh^2 * wz^2`.
pub fn bias_table_rows(window: Window3) -> usize {
    (2 * window.w - 1) * window.h * window.h * window.z * window.z
}

/// The earth-specific bias position index (`[T * T]`, query-major), as the
/// public Pangu pseudocode's `_construct_index` builds it: for query
/// `(zi, hi, wi)` and key `(zj, hj, wj)`,
/// `(zi + zj wz) (2 ww - 1) wh^2 + (hi + hj wh) (2 ww - 1) + (wi - wj + ww - 1)`.
/// Pressure level and latitude are absolute (Earth-specific), longitude
/// relative.
pub fn earth_position_index(window: Window3) -> Vec<u32> {
    let (wz, wh, ww) = (window.z, window.h, window.w);
    let coords: Vec<(usize, usize, usize)> = (0..wz)
        .flat_map(|z| (0..wh).flat_map(move |h| (0..ww).map(move |w| (z, h, w))))
        .collect();
    let mut index = Vec::with_capacity(coords.len() * coords.len());
    for &(zi, hi, wi) in &coords {
        for &(zj, hj, wj) in &coords {
            let z = zi + zj * wz;
            let h = hi + hj * wh;
            let w = wi + ww - 1 - wj;
            // < bias_table_rows(window), far below u32::MAX for any window
            // that fits a kernel.
            index.push((z * (2 * ww - 1) * wh * wh + h * (2 * ww - 1) + w) as u32);
        }
    }
    index
}

/// Expands Pangu's bias table `[rows, types, heads]` to the per-type bias
/// the attention adds, `[types, heads, T, T]` (contiguous, the table's
/// dtype): `table[position_index]`, reshaped and permuted as in the
/// pseudocode.
pub fn expand_earth_bias(table: &Tensor, window: Window3) -> Result<Tensor> {
    let (rows, types, heads) = table.dims3()?;
    if rows != bias_table_rows(window) {
        candle_core::bail!(
            "earth bias table has {rows} rows, window {window:?} needs {}",
            bias_table_rows(window)
        );
    }
    let t = window.z * window.h * window.w;
    let idx = earth_position_index(window);
    let idx = Tensor::from_vec(idx, t * t, table.device())?;
    table
        .index_select(&idx, 0)?
        .reshape((t, t, types, heads))?
        .permute((2, 3, 0, 1))?
        .contiguous()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stage::config::WINDOW;

    #[test]
    fn position_index_covers_the_table() {
        let idx = earth_position_index(WINDOW);
        let rows = bias_table_rows(WINDOW);
        assert_eq!(rows, 3312);
        assert_eq!(idx.len(), 144 * 144);
        let mut seen = vec![false; rows];
        for &i in &idx {
            seen[i as usize] = true;
        }
        // Every (query level/lat, key level/lat, lon offset) combination
        // occurs, so every table row is used.
        assert!(seen.iter().all(|&s| s));
        // Same longitude offset, same absolute level/latitude pair: same row.
        let t = |z: usize, h: usize, w: usize| (z * 6 + h) * 12 + w;
        assert_eq!(
            idx[t(1, 2, 3) * 144 + t(0, 4, 1)],
            idx[t(1, 2, 9) * 144 + t(0, 4, 7)]
        );
        assert_ne!(
            idx[t(1, 2, 3) * 144 + t(0, 4, 1)],
            idx[t(0, 2, 3) * 144 + t(1, 4, 1)]
        );
    }
}
