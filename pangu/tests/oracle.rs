//! An f64 oracle of the Pangu network, written token by token from the
//! definitions and sharing no code with the crate's window planner or
//! candle path: the stage in either block order (the slice regions of
//! Swin's mask, along level and latitude only when longitude wraps; the
//! pseudocode's position index; LayerNorm with its affine; exact GELU),
//! the downsample and upsample, the trunk composed of them, and the patch
//! embedding and recovery with the normalisation.
#![allow(dead_code)]

use candle_core::{DType, Device, Tensor};
use pangu::config::{Depths, Geometry};
use pangu::stage::config::{SHIFT, WINDOW};
use pangu::stage::{BlockOrder, MaskAxes, StageConfig};
use pangu::weights::Weights;
use std::collections::HashMap;
use wavefuse_shared::window::Grid3;

/// A weight from the file layout as f64, row-major.
pub fn w64(t: &HashMap<String, Tensor>, name: &str) -> Vec<f64> {
    t[name]
        .to_dtype(DType::F64)
        .and_then(|x| x.flatten_all())
        .and_then(|x| x.to_vec1::<f64>())
        .expect("weight as f64")
}

fn layer_norm(x: &[f64], g: &[f64], b: &[f64]) -> Vec<f64> {
    let n = x.len() as f64;
    let mean = x.iter().sum::<f64>() / n;
    let var = x.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n;
    let r = 1.0 / (var + 1e-5).sqrt();
    x.iter()
        .zip(g)
        .zip(b)
        .map(|((v, g), b)| (v - mean) * r * g + b)
        .collect()
}

/// `W x + b` with `W` `[out, in]`.
fn linear(x: &[f64], w: &[f64], b: &[f64]) -> Vec<f64> {
    let i = x.len();
    b.iter()
        .enumerate()
        .map(|(o, bo)| {
            bo + w[o * i..(o + 1) * i]
                .iter()
                .zip(x)
                .map(|(a, c)| a * c)
                .sum::<f64>()
        })
        .collect()
}

fn gelu(v: f64) -> f64 {
    0.5 * v * (1.0 + libm::erf(v / std::f64::consts::SQRT_2))
}

/// Swin's region of position `p` on an axis of padded length `len`: the
/// last of the slices `[:-window]`, `[-window:-shift]`, `[-shift:]` that
/// holds it (one region when unshifted).
fn region(p: usize, len: usize, window: usize, shift: usize) -> usize {
    if shift == 0 {
        0
    } else if p >= len - shift {
        2
    } else if p >= len - window {
        1
    } else {
        0
    }
}

/// One block (`i`, shift `s`) on the residual `x` `[N * C]`, in place.
fn block(cfg: &StageConfig, t: &HashMap<String, Tensor>, i: usize, s: [usize; 3], x: &mut [f64]) {
    let c = cfg.dim;
    let heads = cfg.heads;
    let hd = c / heads;
    let g = [cfg.grid.z, cfg.grid.h, cfg.grid.w];
    let w = [cfg.window.z, cfg.window.h, cfg.window.w];
    let p: Vec<usize> = (0..3).map(|a| g[a].div_ceil(w[a]) * w[a]).collect();
    let nw: Vec<usize> = (0..3).map(|a| p[a] / w[a]).collect();
    let tw = w[0] * w[1] * w[2];
    let wt = |n: &str| w64(t, &format!("b{i}.{n}"));
    let (g1, b1, qw, qb) = (
        wt("norm1.weight"),
        wt("norm1.bias"),
        wt("qkv.weight"),
        wt("qkv.bias"),
    );
    let (pw, pb) = (wt("proj.weight"), wt("proj.bias"));
    let (g2, b2, f1w, f1b, f2w, f2b) = (
        wt("norm2.weight"),
        wt("norm2.bias"),
        wt("fc1.weight"),
        wt("fc1.bias"),
        wt("fc2.weight"),
        wt("fc2.bias"),
    );
    let table = wt("earth_bias");
    let types = nw[0] * nw[1];
    let scale = (hd as f64).powf(-0.5);
    let n = x.len() / c;
    let post = cfg.order == BlockOrder::Post;
    // Longitude wraps around the globe in the released model: its shifted
    // tokens are real neighbours, one region.
    let masked_axes = match cfg.mask {
        MaskAxes::LevelLatitude => 2,
        MaskAxes::All => 3,
    };
    // The attention's input per token: the residual itself (post-norm) or
    // norm1 of it (pre-norm).
    let ln1: Vec<Vec<f64>> = (0..n)
        .map(|k| {
            let xk = &x[k * c..(k + 1) * c];
            if post {
                xk.to_vec()
            } else {
                layer_norm(xk, &g1, &b1)
            }
        })
        .collect();
    let mut branch = vec![0.0; x.len()];
    for wz in 0..nw[0] {
        for wh in 0..nw[1] {
            for ww in 0..nw[2] {
                let ty = wz * nw[1] + wh;
                // Window tokens: rolled-grid position, source token (None in
                // the padding), region.
                let mut toks = Vec::new();
                for a in 0..w[0] {
                    for b in 0..w[1] {
                        for cc in 0..w[2] {
                            let r = [wz * w[0] + a, wh * w[1] + b, ww * w[2] + cc];
                            // rolled[r] = padded[(r + s) mod P]
                            let q: Vec<usize> = (0..3).map(|k| (r[k] + s[k]) % p[k]).collect();
                            let src = (q[0] < g[0] && q[1] < g[1] && q[2] < g[2])
                                .then(|| (q[0] * g[1] + q[1]) * g[2] + q[2]);
                            let reg: Vec<usize> = (0..3)
                                .map(|k| {
                                    if k < masked_axes {
                                        region(r[k], p[k], w[k], s[k])
                                    } else {
                                        0
                                    }
                                })
                                .collect();
                            toks.push(((a, b, cc), src, reg));
                        }
                    }
                }
                let qkv: Vec<Vec<f64>> = toks
                    .iter()
                    .map(|(_, src, _)| {
                        let h = match src {
                            Some(k) => ln1[*k].clone(),
                            None => vec![0.0; c],
                        };
                        linear(&h, &qw, &qb)
                    })
                    .collect();
                let mut o = vec![vec![0.0; c]; tw];
                for hh in 0..heads {
                    for qi in 0..tw {
                        let (zi, hi, wi) = toks[qi].0;
                        let mut sc = vec![0.0; tw];
                        for kj in 0..tw {
                            let (zj, hj, wj) = toks[kj].0;
                            let dot: f64 = (0..hd)
                                .map(|d| qkv[qi][hh * hd + d] * scale * qkv[kj][c + hh * hd + d])
                                .sum();
                            let pos = (zi + zj * w[0]) * (2 * w[2] - 1) * w[1] * w[1]
                                + (hi + hj * w[1]) * (2 * w[2] - 1)
                                + (wi + w[2] - 1 - wj);
                            let bias = table[(pos * types + ty) * heads + hh];
                            let mask = if toks[qi].2 == toks[kj].2 {
                                0.0
                            } else {
                                -100.0
                            };
                            sc[kj] = dot + bias + mask;
                        }
                        let m = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                        let e: Vec<f64> = sc.iter().map(|v| (v - m).exp()).collect();
                        let sum: f64 = e.iter().sum();
                        for d in 0..hd {
                            o[qi][hh * hd + d] = (0..tw)
                                .map(|kj| e[kj] / sum * qkv[kj][2 * c + hh * hd + d])
                                .sum();
                        }
                    }
                }
                for (qi, (_, src, _)) in toks.iter().enumerate() {
                    if let Some(k) = src {
                        let y = linear(&o[qi], &pw, &pb);
                        branch[k * c..(k + 1) * c].copy_from_slice(&y);
                    }
                }
            }
        }
    }
    for k in 0..n {
        let bk = &branch[k * c..(k + 1) * c];
        let r = if post {
            layer_norm(bk, &g1, &b1)
        } else {
            bk.to_vec()
        };
        for (xv, rv) in x[k * c..(k + 1) * c].iter_mut().zip(r) {
            *xv += rv;
        }
    }
    for k in 0..n {
        let xk = &x[k * c..(k + 1) * c];
        let h = if post {
            xk.to_vec()
        } else {
            layer_norm(xk, &g2, &b2)
        };
        let a: Vec<f64> = linear(&h, &f1w, &f1b).into_iter().map(gelu).collect();
        let m = linear(&a, &f2w, &f2b);
        let r = if post { layer_norm(&m, &g2, &b2) } else { m };
        for (xv, rv) in x[k * c..(k + 1) * c].iter_mut().zip(r) {
            *xv += rv;
        }
    }
}

/// The stage's blocks `0..blocks` in f64 from the file layout: `[N * C]`.
pub fn stage(cfg: &StageConfig, t: &HashMap<String, Tensor>, blocks: usize) -> Vec<f64> {
    let mut x = w64(t, "x");
    let s = [cfg.shift.z, cfg.shift.h, cfg.shift.w];
    for i in 0..blocks {
        block(cfg, t, i, if i % 2 == 0 { [0; 3] } else { s }, &mut x);
    }
    x
}

/// `W x` with `W` `[out, in]`, no bias.
fn matvec(w: &[f64], x: &[f64]) -> Vec<f64> {
    w.chunks(x.len())
        .map(|r| r.iter().zip(x).map(|(a, b)| a * b).sum())
        .collect()
}

/// A token grid of 8 slabs: `(h1, w1)` at the first scale, `(h2, w2)` at
/// the second (`h2 = ceil(h1 / 2)`, `w2 = w1 / 2`).
#[derive(Clone, Copy, Debug)]
pub struct Scales {
    pub h1: usize,
    pub w1: usize,
    pub h2: usize,
    pub w2: usize,
}

/// The downsample from its definition: coarse token `(z, i, j)` is the
/// concatenation, in order `(dy, dx)` = (0,0), (0,1), (1,0), (1,1), of fine
/// tokens `(z, 2i + dy, 2j + dx)` (zeros past the last latitude), then
/// LayerNorm(4C) with `gamma`, `beta`, then `W` `[2C, 4C]` (`C` =
/// `gamma.len() / 4`, 192 in the released model).
pub fn downsample(x: &[f64], s: Scales, gamma: &[f64], beta: &[f64], w: &[f64]) -> Vec<f64> {
    let c = gamma.len() / 4;
    let mut out = Vec::with_capacity(8 * s.h2 * s.w2 * 2 * c);
    for z in 0..8 {
        for i in 0..s.h2 {
            for j in 0..s.w2 {
                let mut v = vec![0.0; 4 * c];
                for dy in 0..2 {
                    for dx in 0..2 {
                        let (y, xx) = (2 * i + dy, 2 * j + dx);
                        if y < s.h1 {
                            let t = (z * s.h1 + y) * s.w1 + xx;
                            v[(2 * dy + dx) * c..][..c].copy_from_slice(&x[t * c..(t + 1) * c]);
                        }
                    }
                }
                out.extend(matvec(w, &layer_norm(&v, gamma, beta)));
            }
        }
    }
    out
}

/// The upsample from its definition: `W1` `[4C, 2C]` per coarse token;
/// fine token `(z, y, x)` is channels `((y % 2) * 2 + x % 2) * C ..` of
/// coarse token `(z, y / 2, x / 2)` for `y < h1` (the crop), then
/// LayerNorm(C) with `gamma`, `beta`, then `W2` `[C, C]` (`C` =
/// `gamma.len()`).
pub fn upsample(
    x: &[f64],
    s: Scales,
    w1: &[f64],
    gamma: &[f64],
    beta: &[f64],
    w2: &[f64],
) -> Vec<f64> {
    let c = gamma.len();
    let coarse: Vec<Vec<f64>> = x.chunks(2 * c).map(|t| matvec(w1, t)).collect();
    let mut out = Vec::with_capacity(8 * s.h1 * s.w1 * c);
    for z in 0..8 {
        for y in 0..s.h1 {
            for xx in 0..s.w1 {
                let t = &coarse[(z * s.h2 + y / 2) * s.w2 + xx / 2];
                let part = &t[((y % 2) * 2 + xx % 2) * c..][..c];
                out.extend(matvec(w2, &layer_norm(part, gamma, beta)));
            }
        }
    }
    out
}

/// Layer `l`'s blocks by the stage oracle: the weights renamed to the
/// stage's layout, `x` the layer's input.
fn layer(w: &Weights, depths: Depths, l: usize, g: &Geometry, x: &[f64]) -> Vec<f64> {
    let (blocks, dim) = depths.layers(w.meta.width)[l];
    let (h, wd) = if dim == w.meta.width {
        (g.h1, g.w1)
    } else {
        (g.h2, g.w2)
    };
    let cfg = StageConfig {
        grid: Grid3 { z: 8, h, w: wd },
        dim,
        heads: dim / 32,
        window: WINDOW,
        shift: SHIFT,
        order: w.meta.order,
        mask: match w.meta.order {
            BlockOrder::Post => MaskAxes::LevelLatitude,
            BlockOrder::Pre => MaskAxes::All,
        },
    };
    let mut t: HashMap<String, Tensor> = HashMap::new();
    t.insert(
        "x".into(),
        Tensor::from_slice(x, (8, h, wd, dim), &Device::Cpu).unwrap(),
    );
    for j in 0..blocks {
        for (stage_name, file_name) in [
            ("norm1.weight", "norm1.weight"),
            ("norm1.bias", "norm1.bias"),
            ("qkv.weight", "attn.qkv.weight"),
            ("qkv.bias", "attn.qkv.bias"),
            ("earth_bias", "attn.earth_specific_bias"),
            ("proj.weight", "attn.proj.weight"),
            ("proj.bias", "attn.proj.bias"),
            ("norm2.weight", "norm2.weight"),
            ("norm2.bias", "norm2.bias"),
            ("fc1.weight", "mlp.fc1.weight"),
            ("fc1.bias", "mlp.fc1.bias"),
            ("fc2.weight", "mlp.fc2.weight"),
            ("fc2.bias", "mlp.fc2.bias"),
        ] {
            let v = w
                .get(&format!("layers.{l}.blocks.{j}.{file_name}"))
                .unwrap()
                .clone();
            t.insert(format!("b{j}.{stage_name}"), v);
        }
    }
    stage(&cfg, &t, blocks)
}

/// Weight `name` of `w` as f64, row-major.
pub fn v(w: &Weights, name: &str) -> Vec<f64> {
    w.get(name)
        .and_then(|t| Ok(t.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()?))
        .expect("weight as f64")
}

/// The trunk from its parts: layer 0, downsample, layers 1 and 2,
/// upsample, layer 3, then the skip: layer 0's output first, `2 C`
/// channels.
pub fn trunk(w: &Weights, g: &Geometry, depths: Depths, x: &[f64]) -> Vec<f64> {
    let s = Scales {
        h1: g.h1,
        w1: g.w1,
        h2: g.h2,
        w2: g.w2,
    };
    let x0 = layer(w, depths, 0, g, x);
    let d = downsample(
        &x0,
        s,
        &v(w, "downsample.norm.weight"),
        &v(w, "downsample.norm.bias"),
        &v(w, "downsample.reduction.weight"),
    );
    let d = layer(w, depths, 1, g, &d);
    let d = layer(w, depths, 2, g, &d);
    let u = upsample(
        &d,
        s,
        &v(w, "upsample.linear1.weight"),
        &v(w, "upsample.norm.weight"),
        &v(w, "upsample.norm.bias"),
        &v(w, "upsample.linear2.weight"),
    );
    let x3 = layer(w, depths, 3, g, &u);
    let c = w.meta.width;
    x0.chunks(c)
        .zip(x3.chunks(c))
        .flat_map(|(a, b)| a.iter().chain(b).copied())
        .collect()
}

/// The patch embedding from its definition, token by token: normalised
/// fields, the constant maps and channel, zero padding past the last
/// level and latitude, the convolutions' weights read by their 4-D / 5-D
/// indices. Tokens `[8, h1, w1, C]`, the surface slab first.
pub fn embed(w: &Weights, g: &Geometry, upper: &[f64], surface: &[f64]) -> Vec<f64> {
    let (h, wd, hp, h1, w1) = (g.lat, g.lon, g.lat_padded, g.h1, g.w1);
    let (um, us) = (v(w, "upper_mean"), v(w, "upper_std"));
    let (sm, ss) = (v(w, "surface_mean"), v(w, "surface_std"));
    let (uc, sc) = (v(w, "upper_constants"), v(w, "surface_constants"));
    let (wu, bu) = (
        v(w, "patch_embed.conv.weight"),
        v(w, "patch_embed.conv.bias"),
    );
    let (wsf, bsf) = (
        v(w, "patch_embed.conv_surface.weight"),
        v(w, "patch_embed.conv_surface.bias"),
    );
    // Input channel c at (level, lat, lon) of the upper stack, 0 in the pad.
    let up = |c: usize, l: usize, y: usize, x: usize| -> f64 {
        if l >= 13 || y >= h {
            0.0
        } else if c < 5 {
            (upper[((c * 13 + l) * h + y) * wd + x] - um[c * 13 + l]) / us[c * 13 + l]
        } else {
            uc[(l * h + y) * wd + x]
        }
    };
    // Surface channel c: 4 normalised fields (0 past H), then 3 maps [3, Hp, W].
    let sf = |c: usize, y: usize, x: usize| -> f64 {
        if c < 4 {
            if y >= h {
                0.0
            } else {
                (surface[(c * h + y) * wd + x] - sm[c]) / ss[c]
            }
        } else {
            sc[((c - 4) * hp + y) * wd + x]
        }
    };
    let c1 = bu.len();
    let mut out = Vec::with_capacity(8 * h1 * w1 * c1);
    for z in 0..8 {
        for i in 0..h1 {
            for j in 0..w1 {
                for o in 0..c1 {
                    let mut acc = if z == 0 { bsf[o] } else { bu[o] };
                    for dy in 0..4 {
                        for dx in 0..4 {
                            let (y, x) = (4 * i + dy, 4 * j + dx);
                            if z == 0 {
                                for c in 0..7 {
                                    acc += wsf[((o * 7 + c) * 4 + dy) * 4 + dx] * sf(c, y, x);
                                }
                            } else {
                                for c in 0..6 {
                                    for dz in 0..2 {
                                        let k = (((o * 6 + c) * 2 + dz) * 4 + dy) * 4 + dx;
                                        acc += wu[k] * up(c, 2 * (z - 1) + dz, y, x);
                                    }
                                }
                            }
                        }
                    }
                    out.push(acc);
                }
            }
        }
    }
    out
}

/// The patch recovery from its definition, output point by output point:
/// the transposed convolutions (weights `[2C, V, (2,) 4, 4]`, a bias per
/// output variable or per patch position) on slabs 1..8 and 0, the crop to 13 levels and `H`
/// latitudes, then de-normalisation. Returns (upper `[5, 13, H, W]`,
/// surface `[4, H, W]`).
pub fn recover(w: &Weights, g: &Geometry, x: &[f64]) -> (Vec<f64>, Vec<f64>) {
    let (h, wd, h1, w1) = (g.lat, g.lon, g.h1, g.w1);
    let (um, us) = (v(w, "upper_mean"), v(w, "upper_std"));
    let (sm, ss) = (v(w, "surface_mean"), v(w, "surface_std"));
    let (wu, bu) = (
        v(w, "patch_recovery.conv.weight"),
        v(w, "patch_recovery.conv.bias"),
    );
    let (wsf, bsf) = (
        v(w, "patch_recovery.conv_surface.weight"),
        v(w, "patch_recovery.conv_surface.bias"),
    );
    let c2 = wsf.len() / 64;
    let token = |z: usize, y: usize, xx: usize| &x[((z * h1 + y / 4) * w1 + xx / 4) * c2..][..c2];
    let mut upper = Vec::with_capacity(5 * 13 * h * wd);
    for c in 0..5 {
        for l in 0..13 {
            for y in 0..h {
                for xx in 0..wd {
                    let t = token(1 + l / 2, y, xx);
                    let (dz, dy, dx) = (l % 2, y % 4, xx % 4);
                    // One bias per variable, or per patch position.
                    let mut acc = if bu.len() == 5 {
                        bu[c]
                    } else {
                        bu[((c * 2 + dz) * 4 + dy) * 4 + dx]
                    };
                    for (i, ti) in t.iter().enumerate() {
                        acc += ti * wu[(((i * 5 + c) * 2 + dz) * 4 + dy) * 4 + dx];
                    }
                    upper.push(acc * us[c * 13 + l] + um[c * 13 + l]);
                }
            }
        }
    }
    let mut surface = Vec::with_capacity(4 * h * wd);
    for c in 0..4 {
        for y in 0..h {
            for xx in 0..wd {
                let t = token(0, y, xx);
                let mut acc = if bsf.len() == 4 {
                    bsf[c]
                } else {
                    bsf[(c * 4 + y % 4) * 4 + xx % 4]
                };
                for (i, ti) in t.iter().enumerate() {
                    acc += ti * wsf[((i * 4 + c) * 4 + y % 4) * 4 + xx % 4];
                }
                surface.push(acc * ss[c] + sm[c]);
            }
        }
    }
    (upper, surface)
}

/// One forecast step of the whole network.
pub fn network(
    w: &Weights,
    g: &Geometry,
    depths: Depths,
    upper: &[f64],
    surface: &[f64],
) -> (Vec<f64>, Vec<f64>) {
    let x = embed(w, g, upper, surface);
    let skip = trunk(w, g, depths, &x);
    recover(w, g, &skip)
}

/// Max and RMS of `got - want`.
pub fn errors(got: &[f64], want: &[f64]) -> (f64, f64) {
    assert_eq!(got.len(), want.len());
    let mut max = 0.0f64;
    let mut sq = 0.0;
    for (g, w) in got.iter().zip(want) {
        let d = (g - w).abs();
        max = max.max(if d.is_nan() { f64::INFINITY } else { d });
        sq += d * d;
    }
    (max, (sq / got.len() as f64).sqrt())
}
