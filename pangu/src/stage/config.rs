//! Shapes of the Pangu-Weather stages this crate builds.
pub use crate::config::BlockOrder;
use wavefuse_shared::window::{Grid3, Shift3, Window3};

/// Pangu's window, `(2, 6, 12)` = 144 tokens.
pub const WINDOW: Window3 = Window3 { z: 2, h: 6, w: 12 };

/// Pangu's shift of every second block, half a window.
pub const SHIFT: Shift3 = Shift3 { z: 1, h: 3, w: 6 };

/// Channels per attention head in every Pangu stage.
pub const HEAD_DIM: usize = 32;

/// LayerNorm epsilon (PyTorch's default, as in Pangu).
pub const LN_EPS: f32 = 1e-5;

/// The axes along which the shifted block's mask separates regions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MaskAxes {
    /// Level and latitude (9 regions): longitude wraps around the globe,
    /// so the tokens the shift brings round are real neighbours. The
    /// released Pangu-Weather model.
    LevelLatitude,
    /// All three axes (Swin's 27 regions): the profiled student model.
    All,
}

impl MaskAxes {
    /// `level-latitude` or `all`.
    pub fn name(self) -> &'static str {
        match self {
            MaskAxes::LevelLatitude => "level-latitude",
            MaskAxes::All => "all",
        }
    }
}

/// One stage: two Earth-specific blocks, unshifted then shifted, on one
/// token grid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StageConfig {
    /// Token grid `[Z, H, W]`.
    pub grid: Grid3,
    /// Channels per token.
    pub dim: usize,
    /// Attention heads (`dim / HEAD_DIM`).
    pub heads: usize,
    /// Attention window.
    pub window: Window3,
    /// Shift of the second block.
    pub shift: Shift3,
    /// Where the blocks' LayerNorms sit.
    pub order: BlockOrder,
    /// The shifted block's mask.
    pub mask: MaskAxes,
}

impl StageConfig {
    /// Pangu's first scale: 8 x 181 x 360 tokens of 192 channels, 6 heads.
    pub const SCALE1: StageConfig = StageConfig {
        grid: Grid3 {
            z: 8,
            h: 181,
            w: 360,
        },
        dim: 192,
        heads: 6,
        window: WINDOW,
        shift: SHIFT,
        order: BlockOrder::Post,
        mask: MaskAxes::LevelLatitude,
    };

    /// Pangu's second scale: 8 x 91 x 180 tokens of 384 channels, 12 heads.
    pub const SCALE2: StageConfig = StageConfig {
        grid: Grid3 {
            z: 8,
            h: 91,
            w: 180,
        },
        dim: 384,
        heads: 12,
        window: WINDOW,
        shift: SHIFT,
        order: BlockOrder::Post,
        mask: MaskAxes::LevelLatitude,
    };

    /// A grid small enough for the CPU (CI): 672 tokens of 64 channels,
    /// padded along latitude (7 -> 12), 8 windows of Pangu's shape.
    pub const TINY: StageConfig = StageConfig {
        grid: Grid3 { z: 4, h: 7, w: 24 },
        dim: 64,
        heads: 2,
        window: WINDOW,
        shift: SHIFT,
        order: BlockOrder::Post,
        mask: MaskAxes::LevelLatitude,
    };

    /// [`StageConfig::TINY`]'s grid at the first scale's width (192
    /// channels, 6 heads): the smallest stage wavefuse's LayerNorm kernels
    /// run (widths 192, 384, 768), for the wavefuse build on the CPU.
    pub const TINY192: StageConfig = StageConfig {
        grid: Grid3 { z: 4, h: 7, w: 24 },
        dim: 192,
        heads: 6,
        window: WINDOW,
        shift: SHIFT,
        order: BlockOrder::Post,
        mask: MaskAxes::LevelLatitude,
    };

    /// The same grid and widths with the blocks of the released weights
    /// (post-norm, level and latitude mask) or of the profiled student
    /// model (pre-norm, all three axes masked).
    pub const fn with_order(self, order: BlockOrder) -> StageConfig {
        StageConfig {
            order,
            mask: match order {
                BlockOrder::Post => MaskAxes::LevelLatitude,
                BlockOrder::Pre => MaskAxes::All,
            },
            ..self
        }
    }

    /// The configuration named `s1`, `s2`, `tiny` or `tiny192` (the
    /// released model's blocks; see [`StageConfig::with_order`]).
    pub fn by_name(name: &str) -> Option<StageConfig> {
        match name {
            "s1" => Some(Self::SCALE1),
            "s2" => Some(Self::SCALE2),
            "tiny" => Some(Self::TINY),
            "tiny192" => Some(Self::TINY192),
            _ => None,
        }
    }

    /// Tokens of the grid.
    pub fn tokens(&self) -> usize {
        self.grid.z * self.grid.h * self.grid.w
    }

    /// MLP hidden width (4 x dim).
    pub fn hidden(&self) -> usize {
        4 * self.dim
    }

    /// The shift of block `b` (0: none, 1: [`StageConfig::shift`]).
    pub fn block_shift(&self, b: usize) -> Shift3 {
        if b.is_multiple_of(2) {
            Shift3 { z: 0, h: 0, w: 0 }
        } else {
            self.shift
        }
    }
}
