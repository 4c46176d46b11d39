//! The shifted-window mask as region labels: per mask slot, one label per
//! token of a window; tokens `i` and `j` attend with mask 0 where their
//! labels are equal and `-100` (Swin's and Pangu's value,
//! [`wavefuse_shared::geometry::ATTN_MASK_NEG`]) otherwise. That is exactly
//! the mask tile Swin's and Pangu's code builds from its region image
//! ([`wavefuse_shared::window::WindowPlan::mask_slots`] gives both forms),
//! read by [`crate::window_attention`] as 144 labels instead of a 144 x
//! 144 tile; [`RegionLabels::mask_tile`] writes the tile form for the
//! unfused ops and for checks.
use super::bias_mask_add::WindowTable;
use crate::buffer::{DeviceBuffer, View};
use crate::device::Device;
use crate::{Error, Result};
use half::f16;
use wavefuse_shared::geometry::ATTN_MASK_NEG;

/// Validated region labels on a device: `[slots, tokens]` i32, every label
/// in `0..tokens` (a window has at most `tokens` regions). Only equality
/// between labels matters, so each slot's labels are stored renumbered
/// `0, 1, ..` in order of first occurrence (as the planner numbers its
/// regions): [`crate::window_attention`] then puts a window of up to
/// [`ATTN_ONEHOT_REGIONS`](wavefuse_shared::geometry::ATTN_ONEHOT_REGIONS)
/// regions on the matrix unit as one-hot rows.
pub struct RegionLabels {
    labels: DeviceBuffer<i32>,
    tokens: usize,
}

impl std::fmt::Debug for RegionLabels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegionLabels")
            .field("slots", &self.slots())
            .field("tokens", &self.tokens)
            .finish()
    }
}

impl RegionLabels {
    /// Validates `labels` (`[slots, tokens]`, row-major) and uploads them.
    ///
    /// Errors ([`Error::BadParameter`]): `tokens` of 0 or above
    /// `i32::MAX` (`what == "tokens"`); no slot, or a length that is not a
    /// multiple of `tokens` (`what == "labels"`); a label outside
    /// `0..tokens` (`what == "labels"`, naming the first bad position).
    pub fn new(dev: &Device, labels: &[i32], tokens: usize) -> Result<RegionLabels> {
        const OP: &str = "region_labels";
        if tokens == 0 || tokens > i32::MAX as usize {
            return Err(Error::BadParameter {
                op: OP,
                what: "tokens",
                value: tokens.to_string(),
                why: "must be in 1..=i32::MAX",
            });
        }
        if labels.is_empty() || !labels.len().is_multiple_of(tokens) {
            return Err(Error::BadParameter {
                op: OP,
                what: "labels",
                value: format!("{} labels, {tokens} tokens per slot", labels.len()),
                why: "must be one or more whole slots",
            });
        }
        if let Some((position, &value)) = labels
            .iter()
            .enumerate()
            .find(|&(_, &v)| v < 0 || v as usize >= tokens)
        {
            return Err(Error::BadParameter {
                op: OP,
                what: "labels",
                value: format!("labels[{position}] = {value} ({tokens} tokens)"),
                why: "labels must be in 0..tokens",
            });
        }
        Ok(RegionLabels {
            labels: dev.upload(&renumbered(labels, tokens))?,
            tokens,
        })
    }

    /// The labels a mask tile stands for, validated and uploaded: `masks`
    /// `[slots, tokens, tokens]` must be exactly a region mask (0 where
    /// two tokens share a region, -100 otherwise, as the planner's and
    /// Swin's masks are); each token gets the index of the first token of
    /// its region as its label.
    ///
    /// Errors ([`Error::BadParameter`]): as for [`RegionLabels::new`]
    /// (`what == "tokens"` or `"mask"` for a length that is not whole
    /// slots), and a mask that is not a region mask (`what == "mask"`,
    /// naming the first entry that differs from the region mask of the
    /// labels read from it).
    pub fn from_mask(dev: &Device, masks: &[f32], tokens: usize) -> Result<RegionLabels> {
        const OP: &str = "region_labels";
        let t2 = tokens.saturating_mul(tokens);
        if tokens == 0 || masks.is_empty() || !masks.len().is_multiple_of(t2) {
            return Err(Error::BadParameter {
                op: OP,
                what: if tokens == 0 { "tokens" } else { "mask" },
                value: format!("{} values, {tokens} tokens per window", masks.len()),
                why: "must be one or more whole [tokens, tokens] slots",
            });
        }
        let mut labels = Vec::with_capacity(masks.len() / tokens);
        for (sl, m) in masks.chunks_exact(t2).enumerate() {
            let base = labels.len();
            for (i, row) in m.chunks_exact(tokens).enumerate() {
                // The first key of the query's region; none: the query is
                // not in a region of its own (mask[i][i] != 0).
                let Some(first) = row.iter().position(|&v| v == 0.0) else {
                    return Err(Error::BadParameter {
                        op: OP,
                        what: "mask",
                        value: format!("mask[{sl}][{i}] has no 0"),
                        why: "not a region mask (0 within a region, -100 across)",
                    });
                };
                // < tokens <= i32::MAX.
                labels.push(first as i32);
            }
            let l = &labels[base..];
            for (i, row) in m.chunks_exact(tokens).enumerate() {
                for (j, &v) in row.iter().enumerate() {
                    let want = if l[i] == l[j] { 0.0 } else { ATTN_MASK_NEG };
                    if v != want {
                        return Err(Error::BadParameter {
                            op: OP,
                            what: "mask",
                            value: format!("mask[{sl}][{i}][{j}] = {v}"),
                            why: "not a region mask (0 within a region, -100 across)",
                        });
                    }
                }
            }
        }
        RegionLabels::new(dev, &labels, tokens)
    }

    /// Mask slots (rows of labels).
    pub fn slots(&self) -> usize {
        self.labels.len() / self.tokens
    }

    /// Tokens per window (labels per slot).
    pub fn tokens(&self) -> usize {
        self.tokens
    }

    /// The labels on the device.
    pub fn labels(&self) -> View<'_, i32> {
        self.labels.view()
    }

    /// The tile form of host labels `[slots, tokens]`: `[slots, tokens,
    /// tokens]` f16, entry `(i, j)` of a slot 0 where labels `i` and `j`
    /// are equal, -100 otherwise (what [`crate::bias_mask_add`] and
    /// [`crate::bias_mask_softmax`] take). A trailing partial slot is
    /// ignored.
    ///
    /// Errors ([`Error::BadParameter`], `what == "tokens"`): a tile whose
    /// size, `slots * tokens * tokens` halves, overflows what one
    /// allocation can hold.
    pub fn mask_tile(labels: &[i32], tokens: usize) -> Result<Vec<f16>> {
        let neg = f16::from_f32(ATTN_MASK_NEG);
        let slots = labels.len() / tokens.max(1);
        let len = slots
            .checked_mul(tokens)
            .and_then(|n| n.checked_mul(tokens))
            .filter(|&n| n <= isize::MAX as usize / size_of::<f16>())
            .ok_or_else(|| Error::BadParameter {
                op: "region_labels",
                what: "tokens",
                value: format!("{slots} slots of {tokens} tokens"),
                why: "the mask tile's size overflows",
            })?;
        let mut out = Vec::with_capacity(len);
        for slot in labels.chunks_exact(tokens.max(1)) {
            for &li in slot {
                out.extend(
                    slot.iter()
                        .map(|&lj| if li == lj { f16::ZERO } else { neg }),
                );
            }
        }
        Ok(out)
    }
}

/// `labels` with each slot's labels renumbered `0, 1, ..` in order of
/// first occurrence (equal labels stay equal, different ones different).
fn renumbered(labels: &[i32], tokens: usize) -> Vec<i32> {
    let mut out = Vec::with_capacity(labels.len());
    // Label -> its number in the slot; labels are in 0..tokens (checked).
    let mut number = vec![-1i32; tokens];
    for slot in labels.chunks_exact(tokens) {
        number.fill(-1);
        let mut next = 0;
        for &l in slot {
            match number.get_mut(l as usize) {
                Some(n) => {
                    if *n < 0 {
                        *n = next;
                        next += 1;
                    }
                    out.push(*n);
                }
                // Not reached: the caller checked every label.
                None => out.push(l),
            }
        }
    }
    out
}

/// The shift mask as region labels and the window -> slot table that picks
/// a slot of them (`slot.bound() == labels.slots()`).
#[derive(Clone, Copy)]
pub struct RegionMask<'a> {
    /// `[slots, tokens]` labels.
    pub labels: &'a RegionLabels,
    /// Window -> slot.
    pub slot: &'a WindowTable,
}

#[cfg(test)]
mod tests {
    use super::{RegionLabels, renumbered};

    /// Sizes are counted from whole slots, without overflow: a token count
    /// above the labels' length makes no slot (it once multiplied the
    /// labels' length by it and asked for that much memory).
    #[test]
    fn mask_tile_sizes_do_not_overflow() {
        for tokens in [usize::MAX, usize::MAX / 2 + 1, 3] {
            assert_eq!(
                RegionLabels::mask_tile(&[0, 0], tokens)
                    .map(|t| t.len())
                    .ok(),
                Some(0)
            );
        }
        assert_eq!(
            RegionLabels::mask_tile(&[0, 1, 0, 0], 2)
                .map(|t| t.len())
                .ok(),
            Some(8)
        );
    }

    #[test]
    fn labels_are_renumbered_per_slot_in_order_of_first_occurrence() {
        let l = [4, 4, 3, 4, 0, 1, 1, 4, 1, 2];
        assert_eq!(renumbered(&l, 5), [0, 0, 1, 0, 2, 0, 0, 1, 0, 2]);
    }
}
