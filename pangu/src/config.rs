//! The network's fixed shapes and the grid geometry derived from the
//! input fields (`MODEL.md`).
use crate::error::{Error, Result};

/// Pressure levels of the upper-air fields, hPa, in file order.
pub const LEVELS: [u32; 13] = [
    1000, 925, 850, 700, 600, 500, 400, 300, 250, 200, 150, 100, 50,
];

/// Upper-air variables in file order.
pub const UPPER_VARS: [&str; 5] = ["Z", "Q", "T", "U", "V"];

/// Surface variables in file order.
pub const SURFACE_VARS: [&str; 4] = ["MSLP", "U10", "V10", "T2M"];

/// Channels of the first scale in the released model (the second scale
/// has twice as many).
pub const RELEASED_WIDTH: usize = 192;

/// Checks a first-scale width: a positive multiple of the head dimension,
/// 32 (the released model's 192; the candle build also runs smaller ones
/// such as 32 or 64, for small fixtures).
pub fn check_width(width: usize) -> Result<usize> {
    if width == 0 || !width.is_multiple_of(32) {
        return Err(Error::invalid(
            "width",
            format!("{width}: expected a positive multiple of 32 (the head dimension), e.g. 192"),
        ));
    }
    Ok(width)
}

/// Blocks of the four layers. Block `j` of a layer is shifted when `j` is
/// odd.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Depths(pub [usize; 4]);

impl Depths {
    /// The released model's 2, 6, 6, 2.
    pub const RELEASED: Depths = Depths([2, 6, 6, 2]);

    /// Parses four comma-separated block counts of at least 1, e.g.
    /// `2,6,6,2`.
    pub fn parse(s: &str) -> Result<Depths> {
        let bad = || {
            Error::invalid(
                "depths",
                format!("`{s}`: expected four block counts of at least 1, e.g. 2,6,6,2"),
            )
        };
        let v: Vec<usize> = s
            .split(',')
            .map(|p| p.trim().parse::<usize>().ok().filter(|&d| d >= 1))
            .collect::<Option<_>>()
            .ok_or_else(bad)?;
        let d: [usize; 4] = v.try_into().map_err(|_| bad())?;
        Ok(Depths(d))
    }

    /// `(blocks, channels)` of each layer for a first-scale `width`:
    /// `width` at the first scale (layers 0 and 3), `2 width` at the second.
    pub fn layers(self, width: usize) -> [(usize, usize); 4] {
        let [a, b, c, d] = self.0;
        [(a, width), (b, 2 * width), (c, 2 * width), (d, width)]
    }

    /// `2,6,6,2` (the metadata's form).
    pub fn name(self) -> String {
        let [a, b, c, d] = self.0;
        format!("{a},{b},{c},{d}")
    }
}

impl Default for Depths {
    fn default() -> Depths {
        Depths::RELEASED
    }
}

/// Token slabs: the surface, then 7 upper-air slabs of two levels.
pub const SLABS: usize = 8;

/// The official grid, 0.25 degrees.
pub const OFFICIAL_LAT: usize = 721;
/// The official grid's longitudes.
pub const OFFICIAL_LON: usize = 1440;

/// The order of a block's norms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockOrder {
    /// `x = x + norm1(attn(x))`, `x = x + norm2(mlp(x))`: the public
    /// pseudocode and the released weights.
    Post,
    /// `x = x + attn(norm1(x))`, `x = x + mlp(norm2(x))`: the profiled
    /// student model.
    Pre,
}

impl BlockOrder {
    /// `post` or `pre`.
    pub fn name(self) -> &'static str {
        match self {
            BlockOrder::Post => "post",
            BlockOrder::Pre => "pre",
        }
    }

    /// Parses `post` or `pre`.
    pub fn parse(s: &str) -> Result<BlockOrder> {
        match s {
            "post" => Ok(BlockOrder::Post),
            "pre" => Ok(BlockOrder::Pre),
            _ => Err(Error::invalid(
                "block order",
                format!("`{s}`: expected post or pre"),
            )),
        }
    }
}

/// The grid of the fields and of the two token scales.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    /// Latitudes of the fields (`H`).
    pub lat: usize,
    /// Longitudes of the fields (`W`).
    pub lon: usize,
    /// Latitudes padded to the patch, `4 ceil(H / 4)`.
    pub lat_padded: usize,
    /// Token latitudes at the first scale, `Hp / 4`.
    pub h1: usize,
    /// Token longitudes at the first scale, `W / 4`.
    pub w1: usize,
    /// Token latitudes at the second scale, `ceil(h1 / 2)`.
    pub h2: usize,
    /// Token longitudes at the second scale, `w1 / 2`.
    pub w2: usize,
}

impl Geometry {
    /// The geometry of fields of `lat` x `lon` points: `lon` must be a
    /// multiple of 96 (windows of 12 tokens tile longitude at both scales,
    /// which wraps around the globe), `lat` at least 1.
    pub fn new(lat: usize, lon: usize) -> Result<Geometry> {
        let bad = |why: &str| Error::Grid {
            lat,
            lon,
            why: why.into(),
        };
        if lat == 0 || lon == 0 {
            return Err(bad("empty"));
        }
        if !lon.is_multiple_of(96) {
            return Err(bad(
                "longitudes must be a multiple of 96 (4-point patches, 2 x 2 merge, 12-token windows)",
            ));
        }
        if lat > 4 * 2048 || lon > 4 * 4096 {
            return Err(bad("larger than the index tables allow"));
        }
        let lat_padded = lat.div_ceil(4) * 4;
        let h1 = lat_padded / 4;
        Ok(Geometry {
            lat,
            lon,
            lat_padded,
            h1,
            w1: lon / 4,
            h2: h1.div_ceil(2),
            w2: lon / 8,
        })
    }

    /// Tokens at the first scale (`8 h1 w1`).
    pub fn n1(&self) -> usize {
        SLABS * self.h1 * self.w1
    }

    /// Tokens at the second scale (`8 h2 w2`).
    pub fn n2(&self) -> usize {
        SLABS * self.h2 * self.w2
    }

    /// Elements of one upper-air field set `[5, 13, H, W]`.
    pub fn upper_len(&self) -> usize {
        5 * 13 * self.lat * self.lon
    }

    /// Elements of one surface field set `[4, H, W]`.
    pub fn surface_len(&self) -> usize {
        4 * self.lat * self.lon
    }
}

/// The 69 output channels' names in order: `Z1000 ... V50`, then the
/// surface.
pub fn channel_names() -> Vec<String> {
    let mut v: Vec<String> = UPPER_VARS
        .iter()
        .flat_map(|var| LEVELS.iter().map(move |l| format!("{var}{l}")))
        .collect();
    v.extend(SURFACE_VARS.iter().map(|s| s.to_string()));
    v
}
