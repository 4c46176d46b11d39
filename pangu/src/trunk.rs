//! The trunk: first-scale tokens `[8 h1 w1, C]` to the `2 C` channels the
//! patch recovery reads (`C` = 192 in the released model). Layer 0 (first scale), downsample, layers 1 and 2
//! (second scale), upsample, layer 3 (first scale), then the skip: layer
//! 0's output and layer 3's output concatenated along channels, layer 0's
//! first. Each layer is blocks in the weight file's order (post- or
//! pre-norm), block `j` shifted when `j` is odd, on windowings built once
//! per (grid, shift) and shared by every block that runs on them.
use crate::config::{BlockOrder, Geometry, RELEASED_WIDTH, SLABS};
use crate::downsample::Downsample;
use crate::error::{Error, Result};
use crate::model::{Build, Options};
use crate::stage::config::{SHIFT, WINDOW};
use crate::stage::ops::{Affine, StageOps};
use crate::stage::tables::{Windowing, bias_table_rows, earth_position_index};
use crate::stage::weights::{BlockWeights, EarthBias, Fc1, fold_layer_norm};
use crate::stage::{CandleOps, WavefuseOps};
use crate::upsample::Upsample;
use crate::weights::{TOKENS, Weights};
use candle_core::{DType, Device, Tensor};
use wavefuse_shared::window::{Grid3, Shift3};

#[derive(Debug)]
struct Block {
    shifted: bool,
    heads: usize,
    w: BlockWeights,
}

#[derive(Debug)]
struct Layer {
    dim: usize,
    /// The layer's scale: its windowings are `Trunk::windowings[scale]`.
    scale: usize,
    blocks: Vec<Block>,
}

/// The trunk on one device, in one build.
#[derive(Debug)]
pub struct Trunk {
    order: BlockOrder,
    opts: Options,
    /// The unshifted and shifted windowings of the first and second
    /// scale.
    windowings: Vec<[Windowing; 2]>,
    layers: Vec<Layer>,
    down: Downsample,
    up: Upsample,
    /// Channels of the first scale (the second has twice as many).
    width: usize,
    /// candle's ops at the first and second scale's width.
    ops1: CandleOps,
    ops2: CandleOps,
}

impl Trunk {
    /// Builds the trunk from checked weights (`layers.*`, `downsample.*`,
    /// `upsample.*`, in the file's block order and depths) on `device` for
    /// the geometry `geom`.
    pub fn load(w: &Weights, geom: Geometry, device: &Device, opts: Options) -> Result<Trunk> {
        let dtype = opts.dtype;
        let g = geom;
        let width = w.meta.width;
        if opts.build == Build::Wavefuse && width != RELEASED_WIDTH {
            return Err(Error::invalid(
                "width",
                format!(
                    "{}: the wavefuse build runs the released widths, {RELEASED_WIDTH} and {} channels; this file is {width} wide (use the candle build)",
                    w.file,
                    2 * RELEASED_WIDTH
                ),
            ));
        }
        let act = |x: &Tensor| -> Result<Tensor> { Ok(x.to_dtype(dtype)?.to_device(device)?) };
        let affine = |name: &str| -> Result<Affine> {
            Ok(Affine::new(
                act(w.get(&format!("{name}.weight"))?)?,
                act(w.get(&format!("{name}.bias"))?)?,
            )?)
        };
        // One windowing per (grid, shift): the two scales' unshifted and
        // shifted tables, shared by every block that runs on them (16
        // blocks, 4 windowings).
        let none = Shift3 { z: 0, h: 0, w: 0 };
        let shift = if opts.faults.no_shift { none } else { SHIFT };
        let mut windowings = Vec::with_capacity(2);
        for (h, w) in [(g.h1, g.w1), (g.h2, g.w2)] {
            let grid = Grid3 { z: SLABS, h, w };
            windowings.push([
                Windowing::earth(grid, WINDOW, none, device, dtype)?,
                Windowing::earth(grid, WINDOW, shift, device, dtype)?,
            ]);
        }
        let mut layers = Vec::with_capacity(4);
        for (l, &(n_blocks, dim)) in w.meta.depths.layers(width).iter().enumerate() {
            let scale = usize::from(dim != width);
            let win = &windowings[scale];
            let mut blocks = Vec::with_capacity(n_blocks);
            for j in 0..n_blocks {
                let p = format!("layers.{l}.blocks.{j}");
                let shifted = j % 2 == 1;
                blocks.push(Block {
                    shifted,
                    heads: dim / 32,
                    w: block_weights(w, &p, dim, &win[usize::from(shifted)], device, dtype)?,
                });
            }
            layers.push(Layer { dim, scale, blocks });
        }
        let down = Downsample::new(
            g,
            width,
            opts.build,
            affine("downsample.norm")?,
            act(w.get("downsample.reduction.weight")?)?,
            device,
        )?;
        let up = Upsample::new(
            g,
            width,
            opts.build,
            act(w.get("upsample.linear1.weight")?)?,
            affine("upsample.norm")?,
            act(w.get("upsample.linear2.weight")?)?,
            device,
        )?;
        Ok(Trunk {
            order: w.meta.order,
            opts,
            windowings,
            layers,
            down,
            up,
            width,
            ops1: CandleOps::new(width, dtype, device)?,
            ops2: CandleOps::new(2 * width, dtype, device)?,
        })
    }

    /// First-scale tokens `[8 h1 w1, C]` -> `[8 h1 w1, 2 C]`. `wf` is the
    /// wavefuse build's ops (and the step timer of both builds).
    /// Takes `x` by value: it is freed as soon as the first block has
    /// read it.
    pub fn forward(&self, x: Tensor, wf: &WavefuseOps) -> Result<Tensor> {
        let x0 = self.layer(0, x, wf)?;
        let x = self.down.forward(&x0, wf)?;
        let x = self.layer(1, x, wf)?;
        let x = {
            let y = self.layer(2, x, wf)?;
            self.up.forward(&y, wf)?
        };
        let x3 = self.layer(3, x, wf)?;
        let skip = if self.opts.faults.swap_skip {
            Tensor::cat(&[&x3, &x0], 1)?
        } else {
            Tensor::cat(&[&x0, &x3], 1)?
        };
        wf.mark("skip_concat")?;
        Ok(skip)
    }

    fn ops<'a>(&'a self, dim: usize, wf: &'a WavefuseOps) -> &'a dyn StageOps {
        match self.opts.build {
            Build::Wavefuse => wf,
            Build::Candle if dim == self.width => &self.ops1,
            Build::Candle => &self.ops2,
        }
    }

    /// Takes the residual `x` by value: a post-norm block frees it once
    /// the attention half's sum is made, before the MLP half runs.
    fn block(&self, layer: &Layer, b: &Block, x: Tensor, wf: &WavefuseOps) -> Result<Tensor> {
        let win = &self.windowings[layer.scale][usize::from(b.shifted)];
        let ops = self.ops(layer.dim, wf);
        let w = &b.w;
        match self.order {
            BlockOrder::Post => {
                // The windows, the attention output and the block's input
                // are freed before the MLP half runs.
                let y = {
                    let a = self.attention(ops, ops.partition(&x, win)?, b, win)?;
                    ops.unpartition_norm_add(&x, &a, &w.norm1, win)?
                };
                drop(x);
                Ok(ops.mlp_norm_add(&y, w)?)
            }
            BlockOrder::Pre => {
                let h = ops.norm_partition(&x, &w.norm1, win)?;
                let a = self.attention(ops, h, b, win)?;
                let (x, h) = ops.unpartition_add_norm(&x, &a, &w.norm2, win)?;
                let m = ops.mlp(&h, w)?;
                Ok(ops.add(&x, &m)?)
            }
        }
    }

    /// Takes the windows `h` by value: they are freed once the QKV GEMM
    /// has read them.
    fn attention(
        &self,
        ops: &dyn StageOps,
        h: Tensor,
        b: &Block,
        win: &Windowing,
    ) -> Result<Tensor> {
        // q, k, v and the expanded bias are freed before the projection.
        let o = {
            let (qkv, bias) = ops.qkv(&h, &b.w)?;
            drop(h);
            ops.mark("qkv_gemm")?;
            // Expanded for this attention only (see `EarthBias`).
            let earth = b.w.earth_bias.expanded()?;
            ops.attention(&qkv, bias, &earth, b.heads, win)?
        };
        Ok(ops.proj(&o, &b.w, win)?)
    }

    fn layer(&self, l: usize, x: Tensor, wf: &WavefuseOps) -> Result<Tensor> {
        let layer = &self.layers[l];
        let mut x = x;
        for b in &layer.blocks {
            x = self.block(layer, b, x, wf)?;
        }
        Ok(x)
    }
}

/// A block's earth-specific bias from the weight file, kept as Pangu's
/// table `[rows, types, heads]` and expanded at each use. A file holds the
/// table (the seeded weights) or, as the released files do, the expansion
/// `[1, types, heads, T, T]`: that is folded back to the table when it is
/// exactly the table's expansion (checked value for value), else kept
/// expanded. Either way the attention adds the same values.
fn earth_bias(
    table: &Tensor,
    what: &str,
    types: usize,
    heads: usize,
    device: &Device,
    dtype: DType,
) -> Result<EarthBias> {
    let rows = bias_table_rows(WINDOW);
    let tt = TOKENS * TOKENS;
    let shape_err = || Error::Shape {
        what: what.to_string(),
        got: table.dims().to_vec(),
        want: format!("[{rows}, {types}, {heads}] or [1, {types}, {heads}, {TOKENS}, {TOKENS}]"),
    };
    let idx = earth_position_index(WINDOW);
    let index = Tensor::from_vec(idx.clone(), tt, &Device::Cpu)?;
    let dev = |x: &Tensor| -> Result<Tensor> { Ok(x.to_dtype(dtype)?.to_device(device)?) };
    let table_t = match table.dims() {
        [r, t, h] if (*r, *t, *h) == (rows, types, heads) => table
            .permute((1, 2, 0))?
            .contiguous()?
            .reshape((types * heads, rows))?,
        [1, t, h, a, b] | [t, h, a, b] if (*t, *h, *a, *b) == (types, heads, TOKENS, TOKENS) => {
            let flat = table.reshape((types * heads, tt))?;
            // The first position of each table row.
            let mut first = vec![u32::MAX; rows];
            for (p, &r) in idx.iter().enumerate() {
                if let Some(f) = first.get_mut(r as usize).filter(|f| **f == u32::MAX) {
                    *f = p as u32;
                }
            }
            let first = Tensor::from_vec(first, rows, &Device::Cpu)?;
            let table_t = flat.index_select(&first, 1)?;
            let same = table_t
                .index_select(&index, 1)?
                .eq(&flat)?
                .to_dtype(DType::U32)?
                .sum_all()?
                .to_scalar::<u32>()?;
            if same as usize != flat.elem_count() {
                return Ok(EarthBias::Expanded(dev(
                    &flat.reshape((types, heads, TOKENS, TOKENS))?
                )?));
            }
            table_t
        }
        _ => return Err(shape_err()),
    };
    Ok(EarthBias::Table {
        table: dev(&table_t)?,
        index: index.to_device(device)?,
        types,
        heads,
        tokens: TOKENS,
    })
}

/// One block's parameters in the stage's layout: the earth bias as a
/// table expanded at each use ([`earth_bias`]), norm2 kept (and folded
/// into fc1 for the candle pre-norm build).
fn block_weights(
    w: &Weights,
    p: &str,
    c: usize,
    win: &Windowing,
    device: &Device,
    dtype: DType,
) -> Result<BlockWeights> {
    let get = |s: &str| w.get(&format!("{p}.{s}"));
    let dev = |x: &Tensor| -> Result<Tensor> { Ok(x.to_dtype(dtype)?.to_device(device)?) };
    let heads = c / 32;
    let earth = earth_bias(
        get("attn.earth_specific_bias")?,
        &format!("{}: `{p}.attn.earth_specific_bias`", w.file),
        win.n_types(),
        heads,
        device,
        dtype,
    )?;
    let (fc1_w, fc1_b) = fold_layer_norm(
        get("norm2.weight")?,
        get("norm2.bias")?,
        get("mlp.fc1.weight")?,
        get("mlp.fc1.bias")?,
    )?;
    let affine = |n: &str| -> Result<Affine> {
        Ok(Affine::new(
            dev(get(&format!("{n}.weight"))?)?,
            dev(get(&format!("{n}.bias"))?)?,
        )?)
    };
    Ok(BlockWeights {
        norm1: affine("norm1")?,
        qkv_w: dev(get("attn.qkv.weight")?)?,
        qkv_b: dev(get("attn.qkv.bias")?)?,
        earth_bias: earth,
        proj_w: dev(get("attn.proj.weight")?)?,
        proj_b: dev(get("attn.proj.bias")?)?,
        norm2: affine("norm2")?,
        fc1_w: dev(&fc1_w)?,
        fc1_b: dev(&fc1_b)?,
        fc2_w: dev(get("mlp.fc2.weight")?)?,
        fc2_b: dev(get("mlp.fc2.bias")?)?,
        fc1: Fc1 {
            w: dev(get("mlp.fc1.weight")?)?,
            b: dev(get("mlp.fc1.bias")?)?,
            zero: Tensor::zeros(4 * c, dtype, device)?,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stage::tables::expand_earth_bias;

    fn values(t: &Tensor) -> Vec<f32> {
        t.to_dtype(DType::F32)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap()
    }

    /// Each form a file may hold gives, at each use, the expansion the
    /// attention needs: the table; its released expansion (folded back to
    /// the table); and an "expansion" that is not one (kept as it is).
    #[test]
    fn earth_bias_expands_to_what_the_file_means() {
        let (types, heads) = (3, 2);
        let rows = bias_table_rows(WINDOW);
        let n = rows * types * heads;
        let data: Vec<f32> = (0..n)
            .map(|i| ((i * 7919) % 1000) as f32 / 100.0 - 5.0)
            .collect();
        let table = Tensor::from_vec(data, (rows, types, heads), &Device::Cpu).unwrap();
        let want = expand_earth_bias(&table, WINDOW).unwrap();
        let dev = Device::Cpu;

        let b = earth_bias(&table, "t", types, heads, &dev, DType::F32).unwrap();
        assert!(matches!(b, EarthBias::Table { .. }));
        assert_eq!(values(&b.expanded().unwrap()), values(&want));

        let released = want.unsqueeze(0).unwrap();
        let b = earth_bias(&released, "t", types, heads, &dev, DType::F32).unwrap();
        assert!(
            matches!(b, EarthBias::Table { .. }),
            "a true expansion folds back"
        );
        assert_eq!(values(&b.expanded().unwrap()), values(&want));

        // One value changed: no table expands to it, so it is kept.
        let mut v = values(&want);
        v[12345] += 1.0;
        let odd = Tensor::from_vec(v.clone(), (1, types, heads, TOKENS, TOKENS), &dev).unwrap();
        let b = earth_bias(&odd, "t", types, heads, &dev, DType::F32).unwrap();
        assert!(matches!(b, EarthBias::Expanded(_)));
        assert_eq!(values(&b.expanded().unwrap()), v);

        // Wrong shapes are refused.
        for bad in [
            Tensor::zeros((rows, types, heads + 1), DType::F32, &dev).unwrap(),
            Tensor::zeros((1, types, heads, TOKENS, TOKENS - 1), DType::F32, &dev).unwrap(),
        ] {
            assert!(earth_bias(&bad, "t", types, heads, &dev, DType::F32).is_err());
        }
    }
}
