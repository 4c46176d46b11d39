//! How a row of `width` halves is laid over lanes.
//!
//! Every row kernel moves data in 16-byte vectors (8 halves) so that each
//! lane issues the widest global load both targets have. A row is owned by a
//! group of `lanes` consecutive lanes (a power of two, at most 32 so that the
//! same layout fits a wave32 and a wave64); lane `l` of the group holds the
//! vectors `k * lanes + l` for `k in 0..vecs_per_lane`, so each load
//! instruction of the group covers `lanes * 16` contiguous bytes.
//! Reductions are butterflies over the group (`log2(lanes)` exchanges).
//!
//! [`RowLayout::for_width`] gives every lane three vectors and covers the
//! row exactly. [`RowLayout::with_lanes`] gives the row any power-of-two
//! number of lanes, each taking `ceil(vectors / lanes)` steps; lanes whose
//! vector `k * lanes + l` lies past the row sit that step out
//! ([`RowLayout::wide`] is the 32-lane case: at width 192, 8 of 32 lanes
//! idle). Which one a kernel family uses was chosen by measurement on the
//! H200: add+LayerNorm takes the wide layout (more threads, each with fewer
//! bytes in flight, hid latency better than fewer threads carrying three
//! vectors each), plain LayerNorm three vectors per lane; see
//! [`gather_layout`] for the plain gather.

use crate::Target;

/// Halves per 16-byte vector access.
pub const VEC_HALVES: usize = 8;

/// Threads per workgroup for the row kernels (8 warps on NVIDIA, 4 waves on gfx9).
pub const ROW_BLOCK: u32 = 256;

/// Threads per workgroup of the affine LayerNorm and LayerNorm+gather
/// entries (2 warps on NVIDIA, one wave on gfx9). Their refinement tiers
/// take registers, and a workgroup's warps hold its registers until the
/// last one finishes: smaller workgroups keep more warps resident (64
/// threads at 56 registers against [`ROW_BLOCK`] threads at 64: faster on
/// the H200).
pub const LN_AFFINE_BLOCK: u32 = 64;

/// Workgroups of [`LN_AFFINE_BLOCK`] threads per SM the NVIDIA build's
/// register budget is set for (PTX `.minnctapersm`, written by `cargo
/// xtask kernels`): 56 registers.
pub const LN_AFFINE_MIN_BLOCKS_SM: u32 = 18;

/// Workgroups per SM for the affine entries launched in [`ROW_BLOCK`]-thread
/// workgroups (add+LayerNorm+gather, add+LayerNorm at 768): 64 registers.
pub const ROW_AFFINE_MIN_BLOCKS_SM: u32 = 4;

/// Threads per workgroup of the LayerNorm and LayerNorm+gather entries
/// ([`LN_AFFINE_BLOCK`] with affine, [`ROW_BLOCK`] without): the kernels
/// and the host's launches both read it.
pub const fn ln_block(affine: bool) -> u32 {
    if affine { LN_AFFINE_BLOCK } else { ROW_BLOCK }
}

/// Bytes of workgroup memory per thread in which the affine LayerNorm and
/// LayerNorm+gather entries park three f64 across the fast loop: the row
/// sum and tier 1's root and `K` of the one-pass variance, from which the
/// refinement builds its factors (kept in registers instead, the sums cost
/// the fast path registers and a spill).
pub const LN_PARK_BYTES: u32 = 24;

/// Launch-sized workgroup memory of the LayerNorm and LayerNorm+gather
/// entries: [`LN_PARK_BYTES`] per thread with affine, none without.
pub const fn ln_shared_bytes(affine: bool) -> u32 {
    if affine {
        LN_PARK_BYTES * LN_AFFINE_BLOCK
    } else {
        0
    }
}

/// Lane layout of one row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowLayout {
    /// Row width in elements.
    pub width: usize,
    /// Lanes that share one row (power of two, <= 32).
    pub lanes: usize,
    /// 16-byte vector steps each lane takes (a lane skips a step whose
    /// vector lies past the row).
    pub vecs_per_lane: usize,
}

impl RowLayout {
    /// Layout for a width with compiled kernels, `None` for any other width.
    pub const fn for_width(width: usize) -> Option<RowLayout> {
        // 3 vectors (48 bytes) per lane at every width: enough loads in
        // flight per lane, few registers, and the lane count stays a power
        // of two (192 = 8 lanes x 24 halves).
        let lanes = match width {
            192 => 8,
            384 => 16,
            768 => 32,
            _ => return None,
        };
        Some(RowLayout {
            width,
            lanes,
            vecs_per_lane: width / (lanes * VEC_HALVES),
        })
    }

    /// `lanes` lanes per row (a power of two, 1..=32), `ceil(width / (8 *
    /// lanes))` vector steps per lane, for the widths with compiled kernels
    /// (`None` otherwise, or for a bad lane count).
    pub const fn with_lanes(width: usize, lanes: usize) -> Option<RowLayout> {
        if !lanes.is_power_of_two() || lanes > 32 {
            return None;
        }
        match width {
            192 | 384 | 768 => Some(RowLayout {
                width,
                lanes,
                vecs_per_lane: (width / VEC_HALVES).div_ceil(lanes),
            }),
            _ => None,
        }
    }

    /// 32 lanes per row, `ceil(width / 256)` vector steps per lane, for the
    /// widths with compiled kernels (`None` otherwise).
    pub const fn wide(width: usize) -> Option<RowLayout> {
        RowLayout::with_lanes(width, 32)
    }

    /// Rows one workgroup of [`ROW_BLOCK`] threads covers.
    pub const fn rows_per_block(&self) -> usize {
        self.rows_per_block_of(ROW_BLOCK)
    }

    /// Workgroups of [`ROW_BLOCK`] threads needed for `rows` rows.
    pub const fn blocks_for(&self, rows: usize) -> usize {
        self.blocks_for_of(rows, ROW_BLOCK)
    }

    /// Rows one workgroup of `block` threads covers.
    pub const fn rows_per_block_of(&self, block: u32) -> usize {
        block as usize / self.lanes
    }

    /// Workgroups of `block` threads needed for `rows` rows.
    pub const fn blocks_for_of(&self, rows: usize, block: u32) -> usize {
        rows.div_ceil(self.rows_per_block_of(block))
    }
}

/// Threads per workgroup of the affine add+LayerNorm entry of width 192:
/// at the 40 registers it then took, 128 threads kept as many warps per SM
/// as 256 and measured faster on the H200.
pub const ADD_LN_AFFINE_192_BLOCK: u32 = 128;

/// Workgroups of [`ADD_LN_AFFINE_192_BLOCK`] threads per SM the NVIDIA
/// build's register budget is set for: 32 registers, 64 warps per SM. The
/// entry's refinement runs as a real call there (`out_of_line!`), so the
/// fast path fits without spilling.
pub const ADD_LN_AFFINE_192_MIN_BLOCKS_SM: u32 = 16;

/// Launch shape of the add+LayerNorm kernels: the 32-lane [`RowLayout::wide`]
/// layout, `rows_per_group` rows per 32-lane group (their loads all in
/// flight before the reductions, which run interleaved), `block` threads
/// per workgroup.
///
/// Chosen by measurement on the H200: at
/// width 384, 2 rows per group in one-warp workgroups (torch.compile's
/// shape) was the fastest; at width 192, 1 row per group in 256-thread
/// workgroups, since more rows per group were slower and one-warp
/// workgroups with 1 row far slower (too many workgroups to launch).
/// Width 768 keeps the 192 shape. On gfx9 the one-warp workgroup becomes
/// one wavefront (two 32-lane groups).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AddLnShape {
    /// Lane layout of one row.
    pub layout: RowLayout,
    /// Rows per 32-lane group.
    pub rows_per_group: usize,
    /// Threads per workgroup.
    pub block: u32,
}

impl AddLnShape {
    /// The shape for a width with compiled kernels (`None` otherwise) in
    /// the build for `target`.
    pub const fn for_width(width: usize, target: Target) -> Option<AddLnShape> {
        AddLnShape::for_entry(width, target, false)
    }

    /// The shape of the entry with or without `affine`: as
    /// [`AddLnShape::for_width`], except the affine entry of width 192, in
    /// [`ADD_LN_AFFINE_192_BLOCK`]-thread workgroups.
    pub const fn for_entry(width: usize, target: Target, affine: bool) -> Option<AddLnShape> {
        let Some(layout) = RowLayout::wide(width) else {
            return None;
        };
        let (rows_per_group, block) = match width {
            384 => (2, target.min_block()),
            192 if affine => (1, ADD_LN_AFFINE_192_BLOCK),
            _ => (1, ROW_BLOCK),
        };
        Some(AddLnShape {
            layout,
            rows_per_group,
            block,
        })
    }

    /// Rows one workgroup covers.
    pub const fn rows_per_block(&self) -> usize {
        self.block as usize / self.layout.lanes * self.rows_per_group
    }

    /// Workgroups needed for `rows` rows.
    pub const fn blocks_for(&self, rows: usize) -> usize {
        rows.div_ceil(self.rows_per_block())
    }
}

/// The layout of the plain gather's fixed-width kernels, chosen by
/// measurement on the H200: at
/// width 192, 16 lanes with two steps (the second one half-idle), ahead of
/// 8 x 3, 4 x 6, 12 x 2, 24 x 1 and 32 x 1; at width 384 the wide layout,
/// ahead of 16 x 3. At 768 the two are the same layout (32 lanes x 3).
pub const fn gather_layout(width: usize) -> Option<RowLayout> {
    match width {
        192 => RowLayout::with_lanes(width, 16),
        384 => RowLayout::wide(width),
        _ => RowLayout::for_width(width),
    }
}

/// Widths that have compiled LayerNorm kernels.
pub const LN_WIDTHS: [usize; 3] = [192, 384, 768];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_cover_rows_exactly() {
        for w in LN_WIDTHS {
            let l = RowLayout::for_width(w).expect("supported");
            assert_eq!(l.lanes * l.vecs_per_lane * VEC_HALVES, w);
            assert!(l.lanes.is_power_of_two() && l.lanes <= 32);
            assert_eq!(ROW_BLOCK as usize % l.lanes, 0);
        }
        assert_eq!(RowLayout::for_width(100), None);
        assert_eq!(RowLayout::for_width(0), None);
    }

    #[test]
    fn wide_layouts_cover_rows_with_the_fewest_steps() {
        for w in LN_WIDTHS {
            let l = RowLayout::wide(w).expect("supported");
            let vecs = w / VEC_HALVES;
            assert_eq!(l.lanes, 32);
            assert!(l.lanes * l.vecs_per_lane >= vecs);
            assert!(l.lanes * (l.vecs_per_lane - 1) < vecs);
        }
        assert_eq!(RowLayout::wide(768), RowLayout::for_width(768));
        assert_eq!(RowLayout::wide(100), None);
    }

    #[test]
    fn lane_counts_cover_rows_with_the_fewest_steps() {
        for w in LN_WIDTHS {
            for lanes in [1, 2, 4, 8, 16, 32] {
                let l = RowLayout::with_lanes(w, lanes).expect("supported");
                let vecs = w / VEC_HALVES;
                assert_eq!(l.lanes, lanes);
                assert!(l.lanes * l.vecs_per_lane >= vecs);
                assert!(l.lanes * (l.vecs_per_lane - 1) < vecs);
                assert_eq!(ROW_BLOCK as usize % l.lanes, 0);
            }
            for bad in [0, 3, 12, 24, 64] {
                assert_eq!(RowLayout::with_lanes(w, bad), None);
            }
        }
        assert_eq!(RowLayout::with_lanes(100, 16), None);
    }

    #[test]
    fn gather_layouts() {
        assert_eq!(gather_layout(192), RowLayout::with_lanes(192, 16));
        assert_eq!(gather_layout(384), RowLayout::wide(384));
        assert_eq!(gather_layout(768), RowLayout::for_width(768));
        assert_eq!(gather_layout(200), None);
    }

    #[test]
    fn add_ln_shapes_fill_whole_groups() {
        for w in LN_WIDTHS {
            for t in [Target::Nvptx, Target::Amdgpu, Target::Host] {
                for affine in [false, true] {
                    let s = AddLnShape::for_entry(w, t, affine).expect("supported");
                    assert_eq!(Some(s.layout), RowLayout::wide(w));
                    assert_eq!(s.block as usize % s.layout.lanes, 0);
                    assert_eq!(s.block % t.min_block(), 0);
                    assert!(s.rows_per_group >= 1 && s.rows_per_block() >= 1);
                    assert_eq!(s.blocks_for(1), 1);
                    assert_eq!(s.blocks_for(s.rows_per_block()), 1);
                    assert_eq!(s.blocks_for(s.rows_per_block() + 1), 2);
                }
            }
        }
        let s = AddLnShape::for_entry(192, Target::Nvptx, true).expect("supported");
        assert_eq!((s.rows_per_group, s.block, s.rows_per_block()), (1, 128, 4));
        assert_eq!(
            AddLnShape::for_entry(192, Target::Nvptx, false),
            AddLnShape::for_width(192, Target::Nvptx)
        );
        let s = AddLnShape::for_width(384, Target::Nvptx).expect("supported");
        assert_eq!((s.rows_per_group, s.block, s.rows_per_block()), (2, 32, 2));
        let s = AddLnShape::for_width(384, Target::Amdgpu).expect("supported");
        assert_eq!((s.rows_per_group, s.block, s.rows_per_block()), (2, 64, 4));
        assert_eq!(AddLnShape::for_width(100, Target::Nvptx), None);
    }

    #[test]
    fn blocks_round_up() {
        let l = RowLayout::for_width(192).expect("supported");
        assert_eq!(l.blocks_for(1), 1);
        assert_eq!(l.blocks_for(l.rows_per_block()), 1);
        assert_eq!(l.blocks_for(l.rows_per_block() + 1), 2);
        for w in LN_WIDTHS {
            let l = RowLayout::for_width(w).expect("supported");
            for affine in [false, true] {
                let b = ln_block(affine);
                assert_eq!(b as usize % l.lanes, 0, "W {w} block {b}");
                assert_eq!(b % Target::Amdgpu.min_block(), 0);
                assert_eq!(l.blocks_for_of(l.rows_per_block_of(b), b), 1);
                assert_eq!(l.blocks_for_of(l.rows_per_block_of(b) + 1, b), 2);
            }
        }
        assert_eq!(ln_block(false), ROW_BLOCK);
    }
}
