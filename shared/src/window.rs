//! The window planner: gather tables for 3D (shifted) window attention.
//!
//! A [`WindowPlan`] describes how Pangu-Weather's 3D Swin blocks move tokens
//! between the token grid `[Z, H, W]` (row-major, token `(z * H + h) * W + w`)
//! and the *windowed* layout `[n_windows, T]`, `T = wz * wh * ww`. The plan
//! is data only: INT32 gather tables in the [`crate::index`] protocol, plus
//! the shifted-window attention mask and Pangu's window-type map.
//!
//! The forward direction ([`WindowPlan::partition_table`]) is exactly this
//! PyTorch sequence on a `[Z, H, W, C]` tensor `x`:
//!
//! ```text
//! x = pad(x)                                   # zeros at the END of each dim,
//!                                              # up to a multiple of the window
//! x = roll(x, shifts=(-sz, -sh, -sw), dims=(0, 1, 2))   # on the padded grid
//! x = x.reshape(Zp/wz, wz, Hp/wh, wh, Wp/ww, ww, C)
//! x = x.permute(0, 2, 4, 1, 3, 5, 6)
//! x = x.reshape(n_windows * T, C)
//! ```
//!
//! so windows are in row-major order of their window coordinates
//! `(z, h, w)` and tokens inside a window in row-major `(z, h, w)` order.
//! The reverse direction ([`WindowPlan::reverse_table`]) un-partitions, rolls
//! back by `+shift` and crops to the original grid.
//!
//! # Student-model token counts
//!
//! The student model's 131,040 grid tokens are `8 * 91 * 180` (Pangu's
//! second-stage grid). Its windowed count 135,360 factors as
//! `2^6 * 3^2 * 5 * 47`; the prime 47 forces it: with a padded grid
//! `Zp * Hp * Wp` where `Zp >= 8`, `Hp >= 91`, `Wp >= 180` and each padded
//! extent less than one window above the original, the only factorisation
//! is `8 * 94 * 180`. Rounding 91 up to 94 needs a latitude window `wh` with
//! `ceil(91 / wh) * wh == 94`, i.e. `wh` in `{47, 94}`; Pangu's `(2, 6, 12)`
//! windows give `8 * 96 * 180 = 138,240` instead, and no `(2, 6, 12)`-style
//! window (any `wh` dividing 6 or 12) reproduces 135,360. The tests check
//! the closest consistent configuration, window `(2, 47, 12)`.

use alloc::vec;
use alloc::vec::Vec;

use crate::index::PAD;

/// Mask value for attention between tokens of different shifted regions
/// (Swin and Pangu use `-100.0`, not `-inf`).
pub const MASK_NEG: f32 = crate::geometry::ATTN_MASK_NEG;

/// Extents of the token grid `[Z, H, W]` (pressure level, latitude,
/// longitude).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Grid3 {
    /// Pressure-level extent.
    pub z: usize,
    /// Latitude extent.
    pub h: usize,
    /// Longitude extent.
    pub w: usize,
}

/// Extents of one attention window.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Window3 {
    /// Window extent along pressure levels.
    pub z: usize,
    /// Window extent along latitude.
    pub h: usize,
    /// Window extent along longitude.
    pub w: usize,
}

/// Cyclic shift of the shifted-window blocks (`0` in every dim: unshifted).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Shift3 {
    /// Shift along pressure levels.
    pub z: usize,
    /// Shift along latitude.
    pub h: usize,
    /// Shift along longitude.
    pub w: usize,
}

/// Why a [`WindowPlan`] could not be built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlanError {
    /// A grid or window extent is zero (`axis`: 0 = z, 1 = h, 2 = w).
    ZeroExtent {
        /// The offending axis.
        axis: usize,
    },
    /// A shift is not smaller than the window along `axis`.
    ShiftTooLarge {
        /// The offending axis.
        axis: usize,
    },
    /// The padded grid overflows `usize` or has more tokens than INT32
    /// token indices can name.
    TooManyTokens,
    /// A periodic axis ([`WindowPlan::periodic_w`]) would be padded.
    PeriodicPadded,
}

/// Tables that move tokens between a grid and its (shifted) windows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WindowPlan {
    grid: Grid3,
    window: Window3,
    shift: Shift3,
    padded: Grid3,
    periodic_w: bool,
}

/// Deduplicated shifted-window attention masks.
#[derive(Clone, Debug, PartialEq)]
pub struct MaskSlots {
    /// For each window, the slot of its mask (`[n_windows]`).
    pub window_to_slot: Vec<i32>,
    /// Number of distinct masks.
    pub n_slots: usize,
    /// The masks, `[n_slots, T, T]` row-major: entry `(i, j)` of a slot is
    /// `0.0` where query `i` and key `j` share a region, [`MASK_NEG`]
    /// otherwise.
    pub slot_masks: Vec<f32>,
    /// The same masks as region labels, `[n_slots, T]`: token `i` of a
    /// slot's windows is in region `slot_labels[slot * T + i]` (numbered in
    /// order of first occurrence, so each label is below `T`), and
    /// `slot_masks` is 0 exactly where two labels are equal.
    pub slot_labels: Vec<i32>,
}

/// Number of regions one axis contributes to Swin's mask (three slices).
const REGIONS_PER_AXIS: usize = 3;

/// Distinct region ids Swin's mask code can produce (`3^3`).
const N_REGION_IDS: usize = REGIONS_PER_AXIS * REGIONS_PER_AXIS * REGIONS_PER_AXIS;

impl WindowPlan {
    /// Plans `grid` split into `window`s after a cyclic shift by `shift`.
    pub fn new(grid: Grid3, window: Window3, shift: Shift3) -> Result<WindowPlan, PlanError> {
        let g = [grid.z, grid.h, grid.w];
        let win = [window.z, window.h, window.w];
        let s = [shift.z, shift.h, shift.w];
        let mut p = [0usize; 3];
        for axis in 0..3 {
            if g[axis] == 0 || win[axis] == 0 {
                return Err(PlanError::ZeroExtent { axis });
            }
            if s[axis] >= win[axis] {
                return Err(PlanError::ShiftTooLarge { axis });
            }
            p[axis] = g[axis]
                .div_ceil(win[axis])
                .checked_mul(win[axis])
                .ok_or(PlanError::TooManyTokens)?;
        }
        let n = p[0]
            .checked_mul(p[1])
            .and_then(|v| v.checked_mul(p[2]))
            .ok_or(PlanError::TooManyTokens)?;
        if n > i32::MAX as usize {
            return Err(PlanError::TooManyTokens);
        }
        // `mask_slots` holds at most one `[t, t]` mask per window, at most
        // `n * t` values for `t` tokens per window: that product must fit
        // (it always does with 64-bit sizes, as n < 2^31).
        let t = win[0] * win[1] * win[2];
        if n.checked_mul(t).is_none() {
            return Err(PlanError::TooManyTokens);
        }
        Ok(WindowPlan {
            grid,
            window,
            shift,
            padded: Grid3 {
                z: p[0],
                h: p[1],
                w: p[2],
            },
            periodic_w: false,
        })
    }

    /// The same plan with a periodic last axis (longitude on a global
    /// grid, as in Pangu-Weather): the shift wraps real neighbours around,
    /// so the mask of [`WindowPlan::mask_slots`] cuts regions along the
    /// first two axes only (Pangu's 9 level x latitude regions). A periodic
    /// axis must not be padded: its extent must be a multiple of the
    /// window.
    pub fn periodic_w(self) -> Result<WindowPlan, PlanError> {
        if !self.grid.w.is_multiple_of(self.window.w) {
            return Err(PlanError::PeriodicPadded);
        }
        Ok(WindowPlan {
            periodic_w: true,
            ..self
        })
    }

    /// Whether the last axis is periodic ([`WindowPlan::periodic_w`]).
    pub fn is_periodic_w(&self) -> bool {
        self.periodic_w
    }

    /// The original (unpadded) grid.
    pub fn grid(&self) -> Grid3 {
        self.grid
    }

    /// The window extents.
    pub fn window(&self) -> Window3 {
        self.window
    }

    /// The cyclic shift.
    pub fn shift(&self) -> Shift3 {
        self.shift
    }

    /// Whether any axis is shifted (the blocks that need a mask).
    pub fn is_shifted(&self) -> bool {
        self.shift.z != 0 || self.shift.h != 0 || self.shift.w != 0
    }

    /// The grid padded at the end of each dim up to a multiple of the window.
    pub fn padded_grid(&self) -> Grid3 {
        self.padded
    }

    /// Tokens of the original grid (`Z * H * W`).
    pub fn n_tokens_in(&self) -> usize {
        self.grid.z * self.grid.h * self.grid.w
    }

    /// Tokens of the windowed layout (`n_windows * tokens_per_window`, the
    /// padded grid's size).
    pub fn n_tokens_out(&self) -> usize {
        self.padded.z * self.padded.h * self.padded.w
    }

    /// Tokens per window, `T = wz * wh * ww`.
    pub fn tokens_per_window(&self) -> usize {
        self.window.z * self.window.h * self.window.w
    }

    /// Windows along each axis of the padded grid.
    pub fn windows_per_axis(&self) -> Grid3 {
        Grid3 {
            z: self.padded.z / self.window.z,
            h: self.padded.h / self.window.h,
            w: self.padded.w / self.window.w,
        }
    }

    /// Number of windows.
    pub fn n_windows(&self) -> usize {
        let n = self.windows_per_axis();
        n.z * n.h * n.w
    }

    /// Calls `f(out, pz, ph, pw)` for every windowed token `out` in order,
    /// with `(pz, ph, pw)` its position in the rolled, padded grid.
    fn for_each_out(&self, mut f: impl FnMut(usize, usize, usize, usize)) {
        let n = self.windows_per_axis();
        let win = self.window;
        let mut out = 0;
        for iz in 0..n.z {
            for ih in 0..n.h {
                for iw in 0..n.w {
                    for a in 0..win.z {
                        for b in 0..win.h {
                            for c in 0..win.w {
                                f(out, iz * win.z + a, ih * win.h + b, iw * win.w + c);
                                out += 1;
                            }
                        }
                    }
                }
            }
        }
    }

    /// Windowed token index of position `(pz, ph, pw)` of the rolled,
    /// padded grid.
    fn out_index(&self, pz: usize, ph: usize, pw: usize) -> usize {
        let n = self.windows_per_axis();
        let win = self.window;
        let window = ((pz / win.z) * n.h + ph / win.h) * n.w + pw / win.w;
        let inner = ((pz % win.z) * win.h + ph % win.h) * win.w + pw % win.w;
        window * self.tokens_per_window() + inner
    }

    /// For every windowed token, its source token in the original grid or
    /// [`PAD`] where it lies in padding (`[n_tokens_out]`).
    pub fn partition_table(&self) -> Vec<i32> {
        let (g, p, s) = (self.grid, self.padded, self.shift);
        let mut table = vec![PAD; self.n_tokens_out()];
        self.for_each_out(|out, pz, ph, pw| {
            // roll by -s: rolled[p] = padded[(p + s) mod P].
            let qz = (pz + s.z) % p.z;
            let qh = (ph + s.h) % p.h;
            let qw = (pw + s.w) % p.w;
            if qz < g.z && qh < g.h && qw < g.w {
                // < n_tokens_in <= n_tokens_out <= i32::MAX.
                table[out] = ((qz * g.h + qh) * g.w + qw) as i32;
            }
        });
        table
    }

    /// For every token of the original grid (row-major), the windowed token
    /// it was moved to (`[n_tokens_in]`, every entry `>= 0`): gathering the
    /// windowed layout with this table un-partitions, rolls back by
    /// `+shift` and crops.
    pub fn reverse_table(&self) -> Vec<i32> {
        let (g, p, s) = (self.grid, self.padded, self.shift);
        let mut table = Vec::with_capacity(self.n_tokens_in());
        for qz in 0..g.z {
            let pz = (qz + p.z - s.z) % p.z;
            for qh in 0..g.h {
                let ph = (qh + p.h - s.h) % p.h;
                for qw in 0..g.w {
                    let pw = (qw + p.w - s.w) % p.w;
                    // < n_tokens_out <= i32::MAX.
                    table.push(self.out_index(pz, ph, pw) as i32);
                }
            }
        }
        table
    }

    /// Swin's region id for every windowed token (`[n_windows, T]`).
    ///
    /// Computed exactly like Swin's (and Pangu's) mask code on the padded
    /// grid: each axis is cut into the Python slices `[:-window]`,
    /// `[-window:-shift]`, `[-shift:]`, every product of slices is assigned
    /// the next id in order (later assignments overwrite earlier ones, so an
    /// unshifted axis contributes one region), and the id image is
    /// window-partitioned. As in Swin, the id image is already in the rolled
    /// frame, so it is partitioned without a further roll: the windowed
    /// token at rolled position `p` gets the id of `p`. Unshifted plans get
    /// one id everywhere.
    pub fn window_region_ids(&self) -> Vec<u16> {
        let (p, win, s) = (self.padded, self.window, self.shift);
        let mut ids = vec![0u16; self.n_tokens_out()];
        self.for_each_out(|out, pz, ph, pw| {
            let rz = axis_region(pz, p.z, win.z, s.z);
            let rh = axis_region(ph, p.h, win.h, s.h);
            // A periodic axis is one region: its shifted tokens are real
            // neighbours.
            let rw = if self.periodic_w {
                0
            } else {
                axis_region(pw, p.w, win.w, s.w)
            };
            // < 27.
            ids[out] = ((rz * REGIONS_PER_AXIS + rh) * REGIONS_PER_AXIS + rw) as u16;
        });
        ids
    }

    /// The shifted-window attention masks, identical window masks shared in
    /// one slot. An unshifted plan has one slot of zeros.
    pub fn mask_slots(&self) -> MaskSlots {
        let t = self.tokens_per_window();
        let ids = self.window_region_ids();
        // Masks depend only on which tokens share a region: key slots by the
        // region ids relabelled in order of first occurrence.
        let mut patterns: Vec<Vec<u8>> = Vec::new();
        let mut window_to_slot = Vec::with_capacity(self.n_windows());
        let mut canon = vec![0u8; t];
        for window_ids in ids.chunks_exact(t) {
            let mut label = [u8::MAX; N_REGION_IDS];
            let mut next = 0u8;
            for (c, &id) in canon.iter_mut().zip(window_ids) {
                let l = &mut label[id as usize];
                if *l == u8::MAX {
                    *l = next;
                    next += 1;
                }
                *c = *l;
            }
            let slot = match patterns.iter().position(|pat| *pat == canon) {
                Some(slot) => slot,
                None => {
                    patterns.push(canon.clone());
                    patterns.len() - 1
                }
            };
            // <= n_windows <= i32::MAX.
            window_to_slot.push(slot as i32);
        }
        let mut slot_masks = Vec::with_capacity(patterns.len() * t * t);
        let slot_labels = patterns.iter().flatten().map(|&l| i32::from(l)).collect();
        for pat in &patterns {
            for &qi in pat {
                slot_masks.extend(pat.iter().map(|&kj| if qi == kj { 0.0 } else { MASK_NEG }));
            }
        }
        MaskSlots {
            window_to_slot,
            n_slots: patterns.len(),
            slot_masks,
            slot_labels,
        }
    }

    /// Number of Pangu window types: windows at the same pressure-level and
    /// latitude position share the earth-specific bias, longitude windows do
    /// not add types (`(Zp / wz) * (Hp / wh)`).
    pub fn n_window_types(&self) -> usize {
        let n = self.windows_per_axis();
        n.z * n.h
    }

    /// For every window (`[n_windows]`), its Pangu window type
    /// `wz_index * (Hp / wh) + wh_index`, the earth-specific-bias index.
    pub fn window_type_table(&self) -> Vec<i32> {
        let n = self.windows_per_axis();
        let mut table = Vec::with_capacity(self.n_windows());
        for iz in 0..n.z {
            for ih in 0..n.h {
                // < n_windows <= i32::MAX.
                let ty = (iz * n.h + ih) as i32;
                table.extend(core::iter::repeat_n(ty, n.w));
            }
        }
        table
    }
}

/// Index of the last of Swin's three slices `[:-window]`, `[-window:-shift]`,
/// `[-shift:]` (Python semantics on an axis of `len`, `-0 == 0`) that holds
/// `x`.
fn axis_region(x: usize, len: usize, window: usize, shift: usize) -> usize {
    // `[-shift:]` is `[len - shift, len)`, or the whole axis when shift == 0.
    if shift == 0 || x >= len - shift {
        2
    } else if x >= len - window {
        // `[-window:-shift]` with shift > 0.
        1
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    extern crate std;

    use super::*;
    use crate::index::validate;
    use std::vec::Vec;

    /// xorshift64* test PRNG.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }

        fn range(&mut self, lo: usize, hi: usize) -> usize {
            lo + (self.next() % (hi - lo + 1) as u64) as usize
        }
    }

    /// A dense row-major 3D array.
    #[derive(Clone, Debug, PartialEq)]
    struct A3<T> {
        d: [usize; 3],
        v: Vec<T>,
    }

    impl<T: Copy> A3<T> {
        fn at(&self, i: usize, j: usize, k: usize) -> T {
            self.v[(i * self.d[1] + j) * self.d[2] + k]
        }

        fn set(&mut self, i: usize, j: usize, k: usize, x: T) {
            self.v[(i * self.d[1] + j) * self.d[2] + k] = x;
        }
    }

    /// `torch.nn.functional.pad` with zeros (here `fill`) at the end.
    fn ref_pad<T: Copy>(x: &A3<T>, d: [usize; 3], fill: T) -> A3<T> {
        let mut y = A3 {
            d,
            v: vec![fill; d[0] * d[1] * d[2]],
        };
        for i in 0..x.d[0] {
            for j in 0..x.d[1] {
                for k in 0..x.d[2] {
                    y.set(i, j, k, x.at(i, j, k));
                }
            }
        }
        y
    }

    /// `torch.roll(x, shifts, dims=(0, 1, 2))`: `out[(i + s) mod n] = x[i]`.
    fn ref_roll<T: Copy>(x: &A3<T>, s: [isize; 3]) -> A3<T> {
        let mut y = x.clone();
        let m = |i: usize, a: usize| (i as isize + s[a]).rem_euclid(x.d[a] as isize) as usize;
        for i in 0..x.d[0] {
            for j in 0..x.d[1] {
                for k in 0..x.d[2] {
                    y.set(m(i, 0), m(j, 1), m(k, 2), x.at(i, j, k));
                }
            }
        }
        y
    }

    /// reshape [Z/wz, wz, H/wh, wh, W/ww, ww] -> permute(0, 2, 4, 1, 3, 5)
    /// -> flatten.
    fn ref_partition<T: Copy>(x: &A3<T>, w: [usize; 3]) -> Vec<T> {
        let n = [x.d[0] / w[0], x.d[1] / w[1], x.d[2] / w[2]];
        let mut out = Vec::new();
        for a in 0..n[0] {
            for b in 0..n[1] {
                for c in 0..n[2] {
                    for i in 0..w[0] {
                        for j in 0..w[1] {
                            for k in 0..w[2] {
                                out.push(x.at(a * w[0] + i, b * w[1] + j, c * w[2] + k));
                            }
                        }
                    }
                }
            }
        }
        out
    }

    /// The inverse of [`ref_partition`] (Swin's `window_reverse`).
    fn ref_unpartition<T: Copy + Default>(v: &[T], d: [usize; 3], w: [usize; 3]) -> A3<T> {
        let n = [d[0] / w[0], d[1] / w[1], d[2] / w[2]];
        let mut y = A3 {
            d,
            v: vec![T::default(); d[0] * d[1] * d[2]],
        };
        let mut it = v.iter();
        for a in 0..n[0] {
            for b in 0..n[1] {
                for c in 0..n[2] {
                    for i in 0..w[0] {
                        for j in 0..w[1] {
                            for k in 0..w[2] {
                                let x = *it.next().unwrap();
                                y.set(a * w[0] + i, b * w[1] + j, c * w[2] + k, x);
                            }
                        }
                    }
                }
            }
        }
        assert!(it.next().is_none());
        y
    }

    fn dims(g: Grid3) -> [usize; 3] {
        [g.z, g.h, g.w]
    }

    /// Reference forward table: pad an image of source indices, roll by
    /// -shift, partition.
    fn ref_partition_table(plan: &WindowPlan) -> Vec<i32> {
        let g = dims(plan.grid());
        let src = A3 {
            d: g,
            v: (0..g[0] * g[1] * g[2]).map(|i| i as i32).collect(),
        };
        let padded = ref_pad(&src, dims(plan.padded_grid()), PAD);
        let s = plan.shift();
        let rolled = ref_roll(&padded, [-(s.z as isize), -(s.h as isize), -(s.w as isize)]);
        let w = plan.window();
        ref_partition(&rolled, [w.z, w.h, w.w])
    }

    /// Reference reverse table: un-partition the windowed indices, roll by
    /// +shift, crop.
    fn ref_reverse_table(plan: &WindowPlan) -> Vec<i32> {
        let ids: Vec<i32> = (0..plan.n_tokens_out()).map(|i| i as i32).collect();
        let w = plan.window();
        let grid = ref_unpartition(&ids, dims(plan.padded_grid()), [w.z, w.h, w.w]);
        let s = plan.shift();
        let rolled = ref_roll(&grid, [s.z as isize, s.h as isize, s.w as isize]);
        let g = dims(plan.grid());
        let mut out = Vec::new();
        for i in 0..g[0] {
            for j in 0..g[1] {
                for k in 0..g[2] {
                    out.push(rolled.at(i, j, k));
                }
            }
        }
        out
    }

    /// Python's `range(len)[start:stop]` for the slice bounds Swin uses.
    fn py_slice(start: Option<isize>, stop: Option<isize>, len: usize) -> std::ops::Range<usize> {
        let n = len as isize;
        let fix = |b: isize| if b < 0 { (b + n).max(0) } else { b.min(n) };
        let a = start.map_or(0, fix);
        let b = stop.map_or(n, fix);
        a as usize..(b.max(a)) as usize
    }

    /// Swin / Video-Swin / Pangu mask code, literally:
    ///
    /// ```text
    /// img_mask = zeros((Dp, Hp, Wp)); cnt = 0
    /// for d in (slice(-wd), slice(-wd, -sd), slice(-sd, None)):
    ///   for h in (...): for w in (...):
    ///     img_mask[d, h, w] = cnt; cnt += 1
    /// mask_windows = window_partition(img_mask, window)   # [nW, T]
    /// attn_mask = mask_windows[:, None, :] - mask_windows[:, :, None]
    /// attn_mask = masked_fill(attn_mask != 0, -100.0).masked_fill(== 0, 0.0)
    /// ```
    ///
    /// Returns the partitioned ids and the `[nW, T, T]` mask.
    fn ref_swin_mask(plan: &WindowPlan) -> (Vec<u16>, Vec<f32>) {
        let p = dims(plan.padded_grid());
        let w = plan.window();
        let w = [w.z, w.h, w.w];
        let s = plan.shift();
        let s = [s.z, s.h, s.w];
        let slices = |a: usize| {
            let (wi, si) = (w[a] as isize, s[a] as isize);
            [
                py_slice(None, Some(-wi), p[a]),
                py_slice(Some(-wi), Some(-si), p[a]),
                py_slice(Some(-si), None, p[a]),
            ]
        };
        let mut img = A3 {
            d: p,
            v: vec![0u16; p[0] * p[1] * p[2]],
        };
        let mut cnt = 0u16;
        for d in slices(0) {
            for h in slices(1) {
                for ww in slices(2) {
                    for i in d.clone() {
                        for j in h.clone() {
                            for k in ww.clone() {
                                img.set(i, j, k, cnt);
                            }
                        }
                    }
                    cnt += 1;
                }
            }
        }
        let ids = ref_partition(&img, w);
        let t = plan.tokens_per_window();
        let mut mask = Vec::with_capacity(plan.n_windows() * t * t);
        for win in ids.chunks_exact(t) {
            for i in 0..t {
                for j in 0..t {
                    let diff = win[j] as i32 - win[i] as i32;
                    mask.push(if diff != 0 { -100.0 } else { 0.0 });
                }
            }
        }
        (ids, mask)
    }

    fn plan(
        g: (usize, usize, usize),
        w: (usize, usize, usize),
        s: (usize, usize, usize),
    ) -> WindowPlan {
        WindowPlan::new(
            Grid3 {
                z: g.0,
                h: g.1,
                w: g.2,
            },
            Window3 {
                z: w.0,
                h: w.1,
                w: w.2,
            },
            Shift3 {
                z: s.0,
                h: s.1,
                w: s.2,
            },
        )
        .unwrap()
    }

    /// Checks the tables against the references.
    fn check_tables(plan: &WindowPlan) {
        let part = plan.partition_table();
        assert_eq!(part.len(), plan.n_tokens_out());
        assert_eq!(
            plan.n_tokens_out(),
            plan.n_windows() * plan.tokens_per_window()
        );
        assert_eq!(part, ref_partition_table(plan), "{plan:?}");
        assert_eq!(validate(&part, plan.n_tokens_in()), Ok(()));
        // Every source token appears exactly once.
        assert_eq!(
            part.iter().filter(|&&v| v != PAD).count(),
            plan.n_tokens_in()
        );

        let rev = plan.reverse_table();
        assert_eq!(rev, ref_reverse_table(plan), "{plan:?}");
        assert_eq!(validate(&rev, plan.n_tokens_out()), Ok(()));
        assert!(rev.iter().all(|&v| v >= 0));
        // reverse(partition(x)) == x, with x the source indices themselves.
        for (i, &r) in rev.iter().enumerate() {
            assert_eq!(part[r as usize], i as i32);
        }
    }

    /// Checks the mask against Swin's code and the window types.
    fn check_mask(plan: &WindowPlan) {
        let (ref_ids, ref_mask) = ref_swin_mask(plan);
        assert_eq!(plan.window_region_ids(), ref_ids, "{plan:?}");
        let t = plan.tokens_per_window();
        let slots = plan.mask_slots();
        assert_eq!(slots.window_to_slot.len(), plan.n_windows());
        assert_eq!(slots.slot_masks.len(), slots.n_slots * t * t);
        assert_eq!(validate(&slots.window_to_slot, slots.n_slots), Ok(()));
        for (win, &slot) in slots.window_to_slot.iter().enumerate() {
            let got = &slots.slot_masks[slot as usize * t * t..][..t * t];
            assert_eq!(
                got,
                &ref_mask[win * t * t..][..t * t],
                "{plan:?} window {win}"
            );
        }
        // Slots are distinct.
        assert_eq!(slots.slot_labels.len(), slots.n_slots * t);
        for (sl, labels) in slots.slot_labels.chunks_exact(t).enumerate() {
            for (i, &li) in labels.iter().enumerate() {
                assert!((0..t as i32).contains(&li));
                for (j, &lj) in labels.iter().enumerate() {
                    let want = if li == lj { 0.0 } else { MASK_NEG };
                    assert_eq!(slots.slot_masks[(sl * t + i) * t + j], want);
                }
            }
        }
        for a in 0..slots.n_slots {
            for b in 0..a {
                assert_ne!(
                    slots.slot_masks[a * t * t..][..t * t],
                    slots.slot_masks[b * t * t..][..t * t]
                );
            }
        }
        if !plan.is_shifted() {
            assert_eq!(slots.n_slots, 1);
            assert!(slots.slot_masks.iter().all(|&m| m == 0.0));
        }

        let types = plan.window_type_table();
        let n = plan.windows_per_axis();
        assert_eq!(types.len(), plan.n_windows());
        assert_eq!(validate(&types, plan.n_window_types()), Ok(()));
        for (win, &ty) in types.iter().enumerate() {
            let (iz, ih) = (win / (n.h * n.w), win / n.w % n.h);
            assert_eq!(ty as usize, iz * n.h + ih);
        }
    }

    #[test]
    fn random_plans_match_reference() {
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        let mut shifted = 0;
        for case in 0..200 {
            let w = (rng.range(1, 4), rng.range(1, 5), rng.range(1, 6));
            let g = if case % 4 == 0 {
                // Already a multiple of the window.
                (
                    w.0 * rng.range(1, 3),
                    w.1 * rng.range(1, 3),
                    w.2 * rng.range(1, 3),
                )
            } else {
                (rng.range(1, 9), rng.range(1, 11), rng.range(1, 13))
            };
            let s = if case % 5 == 0 {
                (0, 0, 0)
            } else {
                (
                    rng.range(0, w.0 - 1),
                    rng.range(0, w.1 - 1),
                    rng.range(0, w.2 - 1),
                )
            };
            let p = plan(g, w, s);
            shifted += usize::from(p.is_shifted());
            check_tables(&p);
            check_mask(&p);
        }
        assert!(shifted > 100);
    }

    #[test]
    fn pangu_grids() {
        for (g, padded, n_out) in [
            ((8, 181, 360), (8, 186, 360), 535_680),
            ((8, 91, 180), (8, 96, 180), 138_240),
        ] {
            for s in [(1, 3, 6), (0, 0, 0)] {
                let p = plan(g, (2, 6, 12), s);
                let pg = p.padded_grid();
                assert_eq!((pg.z, pg.h, pg.w), padded);
                assert_eq!(p.n_tokens_out(), n_out);
                assert_eq!(p.n_tokens_in(), g.0 * g.1 * g.2);
                assert_eq!(p.tokens_per_window(), 144);
                assert_eq!(p.n_windows(), n_out / 144);
                assert_eq!(p.n_window_types(), (padded.0 / 2) * (padded.1 / 6));
                check_tables(&p);
                let slots = p.mask_slots();
                if s == (0, 0, 0) {
                    assert_eq!(slots.n_slots, 1);
                } else {
                    // Interior / last window along each of three axes.
                    assert_eq!(slots.n_slots, 8);
                }
            }
        }
        // The full mask reference on the smaller shifted grid.
        check_mask(&plan((8, 91, 180), (2, 6, 12), (1, 3, 6)));
    }

    #[test]
    fn periodic_longitude_masks_level_and_latitude_only() {
        let p = plan((8, 181, 360), (2, 6, 12), (1, 3, 6))
            .periodic_w()
            .expect("360 is a multiple of 12");
        assert!(p.is_periodic_w());
        let ids = p.window_region_ids();
        let t = p.tokens_per_window();
        let n = p.windows_per_axis();
        let mut distinct: Vec<u16> = ids.clone();
        distinct.sort_unstable();
        distinct.dedup();
        // 3 level x 3 latitude regions.
        assert_eq!(distinct.len(), 9);
        // The last longitude window of an interior (level, latitude) window
        // row is one region (the non-periodic plan splits it in two).
        let last_lon = n.w - 1;
        let w = last_lon;
        assert!(ids[w * t..(w + 1) * t].iter().all(|&r| r == ids[w * t]));
        let swin = plan((8, 181, 360), (2, 6, 12), (1, 3, 6));
        let sids = swin.window_region_ids();
        assert!(sids[w * t..(w + 1) * t].iter().any(|&r| r != sids[w * t]));
        // Interior / last window along level and latitude only.
        assert_eq!(p.mask_slots().n_slots, 4);
        // A padded periodic axis is refused.
        assert_eq!(
            plan((8, 181, 350), (2, 6, 12), (1, 3, 6)).periodic_w(),
            Err(PlanError::PeriodicPadded)
        );
    }

    /// Pangu's mask on a periodic-longitude plan against its definition,
    /// built slice by slice: on the padded grid, level is cut into
    /// `[:-2], [-2:-1], [-1:]` and latitude into `[:-6], [-6:-3], [-3:]`
    /// (9 regions; the id image is not rolled, as in Swin), longitude is
    /// one region; each window's mask is 0 between tokens of one region and
    /// `MASK_NEG` otherwise. Both of Pangu's windowings, tables only.
    fn check_pangu_mask(grid: (usize, usize, usize)) {
        let p = plan(grid, (2, 6, 12), (1, 3, 6)).periodic_w().unwrap();
        let pd = p.padded_grid();
        let cut = |pos: usize, len: usize, a: usize, b: usize| -> usize {
            if pos < len - a {
                0
            } else if pos < len - b {
                1
            } else {
                2
            }
        };
        let mut image = vec![0usize; pd.z * pd.h * pd.w];
        for z in 0..pd.z {
            for h in 0..pd.h {
                for w in 0..pd.w {
                    image[(z * pd.h + h) * pd.w + w] = cut(z, pd.z, 2, 1) * 3 + cut(h, pd.h, 6, 3);
                }
            }
        }
        let (nh, nw) = (pd.h / 6, pd.w / 12);
        let t = p.tokens_per_window();
        let slots = p.mask_slots();
        let mut regions = vec![0usize; t];
        for win in 0..p.n_windows() {
            let (wz, wh, ww) = (win / (nh * nw), win / nw % nh, win % nw);
            let mut k = 0;
            for a in 0..2 {
                for b in 0..6 {
                    for c in 0..12 {
                        regions[k] = image[((wz * 2 + a) * pd.h + wh * 6 + b) * pd.w + ww * 12 + c];
                        k += 1;
                    }
                }
            }
            let got = &slots.slot_masks[slots.window_to_slot[win] as usize * t * t..][..t * t];
            for i in 0..t {
                for j in 0..t {
                    let want = if regions[i] == regions[j] {
                        0.0
                    } else {
                        MASK_NEG
                    };
                    assert_eq!(got[i * t + j], want, "{grid:?} window {win} ({i}, {j})");
                }
            }
        }
    }

    #[test]
    fn pangu_mask_matches_slices_first_scale() {
        check_pangu_mask((8, 181, 360));
    }

    #[test]
    fn pangu_mask_matches_slices_second_scale() {
        check_pangu_mask((8, 91, 180));
    }

    #[test]
    fn student_model_token_counts() {
        // 131,040 grid tokens = 8 * 91 * 180. Pangu's (2, 6, 12) window pads
        // them to 138,240, not the student model's 135,360.
        let pangu = plan((8, 91, 180), (2, 6, 12), (1, 3, 6));
        assert_eq!(pangu.n_tokens_in(), 131_040);
        assert_eq!(pangu.n_tokens_out(), 138_240);
        // 135,360 = 8 * 94 * 180 is the only padded grid of 8 * 91 * 180
        // (47 is prime): the latitude window must be 47 or 94.
        let mut found = Vec::new();
        for wz in 1..=8 {
            for wh in 1..=94 {
                for ww in 1..=180 {
                    let p = plan((8, 91, 180), (wz, wh, ww), (0, 0, 0));
                    if p.n_tokens_out() == 135_360 {
                        let pg = p.padded_grid();
                        assert_eq!((pg.z, pg.h, pg.w), (8, 94, 180));
                        found.push(wh);
                    }
                }
            }
        }
        assert!(!found.is_empty());
        assert!(found.contains(&47) && found.contains(&94));
        assert!(found.iter().all(|&wh| wh == 47 || wh == 94));
        // The closest consistent configuration, checked end to end.
        for s in [(1, 23, 6), (0, 0, 0)] {
            let p = plan((8, 91, 180), (2, 47, 12), s);
            assert_eq!(p.n_tokens_out(), 135_360);
            check_tables(&p);
        }
    }

    #[test]
    fn rejects_bad_plans() {
        let g = Grid3 {
            z: 8,
            h: 91,
            w: 180,
        };
        let w = Window3 { z: 2, h: 6, w: 12 };
        let s = Shift3 { z: 1, h: 3, w: 6 };
        assert_eq!(
            WindowPlan::new(Grid3 { h: 0, ..g }, w, s),
            Err(PlanError::ZeroExtent { axis: 1 })
        );
        assert_eq!(
            WindowPlan::new(g, Window3 { w: 0, ..w }, Shift3 { w: 0, ..s }),
            Err(PlanError::ZeroExtent { axis: 2 })
        );
        assert_eq!(
            WindowPlan::new(g, w, Shift3 { z: 2, ..s }),
            Err(PlanError::ShiftTooLarge { axis: 0 })
        );
        assert_eq!(
            WindowPlan::new(g, w, Shift3 { w: 12, ..s }),
            Err(PlanError::ShiftTooLarge { axis: 2 })
        );
        let huge = Grid3 {
            z: 2048,
            h: 1024,
            w: 1024,
        };
        assert_eq!(WindowPlan::new(huge, w, s), Err(PlanError::TooManyTokens));
        let over = Grid3 {
            z: usize::MAX,
            h: 1,
            w: 1,
        };
        assert_eq!(WindowPlan::new(over, w, s), Err(PlanError::TooManyTokens));
        let max = Grid3 {
            z: 1,
            h: 1,
            w: i32::MAX as usize,
        };
        let one = Window3 { z: 1, h: 1, w: 1 };
        let none = Shift3 { z: 0, h: 0, w: 0 };
        assert!(WindowPlan::new(max, one, none).is_ok());
    }
}
