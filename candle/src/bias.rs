//! A per-column bias added in place to `[rows, C]` f16 rows, through the
//! bias + mask-add kernel ([`wavefuse::bias_mask_add`]): the rows seen as
//! square tiles of `T x T` elements, `T^2` a multiple of `C`, so that every
//! tile holds whole rows and gets the same bias tile (the bias repeated
//! `T^2 / C` times; one bias type, no mask). One rounding,
//! `f16(f32(x) + f32(b))`, as candle's or PyTorch's f16 add.
//!
//! Why: candle's broadcast add uploads the layout of its operands for
//! every launch (a synchronous host-to-device copy), and a Linear bias
//! after a GEMM is exactly such an add.
use crate::attn::AttnTables;
use candle_core::{Device, Result, Tensor};

/// The largest tile side `T` (a multiple of 4, at most 144) with `T^2` a
/// multiple of `width` and of which `rows * width` is a whole number of
/// tiles.
fn tile_side(rows: usize, width: usize) -> Option<usize> {
    (1..=36usize).rev().map(|k| 4 * k).find(|t| {
        width > 0 && (t * t).is_multiple_of(width) && (rows * width).is_multiple_of(t * t)
    })
}

/// A bias of `C` elements to add to `rows` rows: its tile and tables,
/// built once and reused.
#[derive(Clone, Debug)]
pub struct BiasAdd {
    rows: usize,
    width: usize,
    side: usize,
    tile: Tensor,
    tables: AttnTables,
}

impl BiasAdd {
    /// The op adding `bias` (`[C]`, f16) to `[rows, C]` tensors on the
    /// bias's device. Fails when no tile side fits `rows` and `C` (see
    /// [`BiasAdd`]).
    pub fn new(bias: &Tensor, rows: usize) -> Result<BiasAdd> {
        const OP: &str = "wavefuse-bias_add";
        let width = bias.dims1()?;
        let Some(side) = tile_side(rows, width) else {
            candle_core::bail!(
                "{OP}: no tile side T (4..=144) with T^2 a multiple of {width} divides {rows} rows"
            );
        };
        let reps = side * side / width;
        let tile = bias
            .to_dtype(candle_core::DType::F16)?
            .unsqueeze(0)?
            .repeat((reps, 1))?
            .reshape((1, 1, side, side))?
            .contiguous()?;
        let tiles = rows * width / (side * side);
        if tiles > i32::MAX as usize {
            candle_core::bail!("{OP}: {tiles} tiles overflow the index type");
        }
        let tables = AttnTables::new(&vec![0; tiles], 1, None, side, bias.device())?;
        Ok(BiasAdd {
            rows,
            width,
            side,
            tile,
            tables,
        })
    }

    /// `x += bias` per row, in place; `x` is `[rows, C]` as built for.
    pub fn add_(&self, x: &Tensor) -> Result<()> {
        if !x.is_contiguous() {
            // A reshape would copy, and the add would land in the copy.
            candle_core::bail!(
                "wavefuse-bias_add: `x` is not contiguous; call .contiguous() first"
            );
        }
        if x.dims() != [self.rows, self.width] {
            candle_core::bail!(
                "wavefuse-bias_add: `x` is {:?}, the op is for [{}, {}]",
                x.dims(),
                self.rows,
                self.width
            );
        }
        let tiles = self.rows * self.width / (self.side * self.side);
        crate::bias_mask_add(
            &x.reshape((tiles, 1, self.side, self.side))?,
            &self.tile,
            &self.tables,
        )
    }

    /// The device the op was built for.
    pub fn device(&self) -> &Device {
        self.tile.device()
    }
}
