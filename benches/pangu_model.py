#!/usr/bin/env python3
"""The whole Pangu-Weather network in PyTorch, as pangu/MODEL.md specifies it.

nn.Module classes whose state_dict names are MODEL.md's weight table, the
seeded generator the Rust model shares (fnv1a64 / splitmix64, bit for bit),
and the commands that make weights, inputs, references, the CI fixture,
the accuracy gate and the benchmark.

Commands (every one appends a JSON line of what it measured to --log FILE):
  selftest
      known values of the generator and of the seeded weights / inputs
  init --out FILE --lat H --lon W --order post|pre --seed N [--interval 24]
      the seeded f32 weight file (safetensors; metadata format, block_order,
      interval_hours, lat, lon)
  inputs --dir D --lat H --lon W --seed N
      D/input_upper.npy [5, 13, H, W], D/input_surface.npy [4, H, W] (f32)
  reference --weights FILE --upper U.npy --surface S.npy --out DIR
            [--device cpu|cuda] [--steps K] [--no-f16]
      K-step autoregressive rollout of the f32 and the f16 model:
      DIR/f32/output_upper_{h:03d}h.npy, output_surface_{h:03d}h.npy and
      DIR/f16/..., h = step * interval_hours
  check --ref DIR --rust DIR2 [--json OUT] [--margin 1.0] [--swap-test]
      per channel (Z1000 ... V50, MSLP, U10, V10, T2M) max abs and RMS error
      of DIR2's outputs and of DIR/f16's against DIR/f32; a channel passes
      when the Rust errors are at most margin times PyTorch f16's; exit 1
      if any channel fails (--swap-test: also exit 1 if the Rust output with
      two channels swapped would pass)
  fixture --dir tests/data/pangu [--check [--break skip|shift]]
      the CI oracle at lat 25, lon 96, seed 1, computed in float64 and
      stored as float32: input_upper/surface.npy, post_/pre_upper/surface.npy,
      fixture.json; --check recomputes and compares (--break: with a wiring
      bug planted, to show the comparison fails)
  bench --weights FILE --lat H --lon W [--modes eager,default,max-autotune]
        [--warmup 5] [--steps 20] [--json OUT] [--compile-timeout S]
      CUDA, the f16 model, one GPU-resident step per sample: CUDA-event
      times (median and raw), peak device memory, compile time per mode
      (--device cpu: a smoke test of the harness)
"""
import argparse
import hashlib
import json
import math
import os
import signal
import subprocess
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

# ---------------------------------------------------------------- constants
LEVELS = (1000, 925, 850, 700, 600, 500, 400, 300, 250, 200, 150, 100, 50)
UPPER_VARS = ("Z", "Q", "T", "U", "V")
SURFACE_VARS = ("MSLP", "U10", "V10", "T2M")
CHANNELS = [f"{v}{p}" for v in UPPER_VARS for p in LEVELS] + list(SURFACE_VARS)
LAYERS = ((2, 192), (6, 384), (6, 384), (2, 192))  # (blocks, channels)
SLABS = 8  # the surface slab and 7 upper-air slabs of two levels
WINDOW = (2, 6, 12)
SHIFT = (1, 3, 6)
TOKENS = WINDOW[0] * WINDOW[1] * WINDOW[2]  # 144
HEAD_DIM = 32
EPS = 1e-5
MASK_NEG = -100.0
BIAS_ROWS = (2 * WINDOW[2] - 1) * WINDOW[1] * WINDOW[1] * WINDOW[0] * WINDOW[0]  # 3312
STAT_NAMES = ("upper_mean", "upper_std", "surface_mean", "surface_std")
FIXTURE_GRID = (25, 96)
FIXTURE_SEED = 1


def ceil_to(n, m):
    return -(-n // m) * m


def geometry(lat, lon):
    """MODEL.md's grid: Hp, h1, w1, h2, w2."""
    if lat < 1 or lon < 1 or lon % 96 != 0:
        raise ValueError(f"grid {lat} x {lon}: lon must be a positive multiple of 96 and lat >= 1")
    hp = ceil_to(lat, 4)
    h1, w1 = hp // 4, lon // 4
    return {"Hp": hp, "h1": h1, "w1": w1, "h2": -(-h1 // 2), "w2": w1 // 2}


def window_types(h):
    """(8 / 2) * (Hpad / 6) at a scale of h token latitudes."""
    return (SLABS // WINDOW[0]) * (ceil_to(h, WINDOW[1]) // WINDOW[1])


# ---------------------------------------------------------------- seeded generator
_M64 = (1 << 64) - 1


def fnv1a64(data):
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & _M64
    return h


def splitmix64(z):
    """Vectorised over numpy uint64 (wrapping); a Python int gives an int."""
    scalar = not isinstance(z, np.ndarray)
    z = np.asarray(z & _M64 if scalar else z, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = z + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return int(z) if scalar else z


def seeded_unit(name, n, seed, start=0):
    """Elements start .. start + n of tensor `name`: r in [-1, 1), f64."""
    key = np.uint64((fnv1a64(name.encode()) ^ seed) & _M64)
    i = np.arange(start, start + n, dtype=np.uint64)
    with np.errstate(over="ignore"):
        u = splitmix64(key + i)
    return (u >> np.uint64(40)).astype(np.float64) / float(1 << 24) * 2.0 - 1.0


def seeded(name, shape, center, scale, seed, chunk=1 << 22):
    """f32(center + scale * r), computed in f64, row-major over shape."""
    n = int(np.prod(shape, dtype=np.int64))
    out = np.empty(n, dtype=np.float32)
    for a in range(0, n, chunk):
        b = min(n, a + chunk)
        out[a:b] = center + scale * seeded_unit(name, b - a, seed, a)
    return out.reshape(shape)


def statistics():
    """(upper_mean [5, 13], upper_std, surface_mean [4], surface_std), f64."""
    mean = np.zeros((5, 13))
    std = np.zeros((5, 13))
    for li, p in enumerate(LEVELS):
        p = float(p)
        L = math.log(1013.25 / p)
        q = p / 1000.0
        qm = 0.01 * (q * q * q)
        mean[:, li] = [9.80665 * 7000.0 * L, qm, max(210.0, 288.0 - 6.5e-3 * 7000.0 * L), 5.0, 0.0]
        std[:, li] = [1000.0, 0.5 * qm + 1e-6, 10.0, 10.0 + 0.01 * (1000.0 - p), 8.0]
    return mean, std, np.array([101325.0, 0.0, 0.0, 278.0]), np.array([1000.0, 5.0, 4.0, 20.0])


def state_entries(lat, lon):
    """[(name, shape, center, scale)] of every seeded tensor (stats excluded)."""
    g = geometry(lat, lon)
    lin = lambda fan_in: (0.0, 1.0 / math.sqrt(fan_in))  # noqa: E731
    bias, lnw, lnb = (0.0, 0.02), (1.0, 0.2), (0.0, 0.1)
    e = [("surface_constants", (3, g["Hp"], lon), 0.0, 1.0),
         ("upper_constants", (13, lat, lon), 0.0, 1.0),
         ("patch_embed.conv.weight", (192, 6, 2, 4, 4), *lin(192)),
         ("patch_embed.conv.bias", (192,), *bias),
         ("patch_embed.conv_surface.weight", (192, 7, 4, 4), *lin(112)),
         ("patch_embed.conv_surface.bias", (192,), *bias)]
    for li, (blocks, c) in enumerate(LAYERS):
        types = window_types(g["h1"] if c == 192 else g["h2"])
        for j in range(blocks):
            p = f"layers.{li}.blocks.{j}."
            e += [(p + "norm1.weight", (c,), *lnw), (p + "norm1.bias", (c,), *lnb),
                  (p + "attn.qkv.weight", (3 * c, c), *lin(c)), (p + "attn.qkv.bias", (3 * c,), *bias),
                  (p + "attn.earth_specific_bias", (BIAS_ROWS, types, c // HEAD_DIM), 0.0, 0.5),
                  (p + "attn.proj.weight", (c, c), *lin(c)), (p + "attn.proj.bias", (c,), *bias),
                  (p + "norm2.weight", (c,), *lnw), (p + "norm2.bias", (c,), *lnb),
                  (p + "mlp.fc1.weight", (4 * c, c), *lin(c)), (p + "mlp.fc1.bias", (4 * c,), *bias),
                  (p + "mlp.fc2.weight", (c, 4 * c), *lin(4 * c)), (p + "mlp.fc2.bias", (c,), *bias)]
    e += [("downsample.norm.weight", (768,), *lnw), ("downsample.norm.bias", (768,), *lnb),
          ("downsample.reduction.weight", (384, 768), *lin(768)),
          ("upsample.linear1.weight", (768, 384), *lin(384)),
          ("upsample.norm.weight", (192,), *lnw), ("upsample.norm.bias", (192,), *lnb),
          ("upsample.linear2.weight", (192, 192), *lin(192)),
          ("patch_recovery.conv.weight", (384, 5, 2, 4, 4), *lin(384)),
          ("patch_recovery.conv.bias", (5,), *bias),
          ("patch_recovery.conv_surface.weight", (384, 4, 4, 4), *lin(384)),
          ("patch_recovery.conv_surface.bias", (4,), *bias)]
    return e


def init_state(lat, lon, order="post", seed=1):
    """The full seeded state dict as f32 numpy arrays (the earth bias in its
    compact form). The block order changes no value (same names)."""
    if order not in ("post", "pre"):
        raise ValueError(f"block order {order!r}: expected post or pre")
    um, us, sm, ss = statistics()
    sd = {"upper_mean": um.astype(np.float32), "upper_std": us.astype(np.float32),
          "surface_mean": sm.astype(np.float32), "surface_std": ss.astype(np.float32)}
    for name, shape, center, scale in state_entries(lat, lon):
        sd[name] = seeded(name, shape, center, scale, seed)
    return sd


def seeded_inputs(lat, lon, seed):
    """(input_upper [5, 13, H, W], input_surface [4, H, W]), f32."""
    geometry(lat, lon)
    um, us, sm, ss = statistics()
    plane = lat * lon
    r = seeded_unit("input_upper", 65 * plane, seed).reshape(5, 13, lat, lon)
    upper = (um[:, :, None, None] + us[:, :, None, None] * r).astype(np.float32)
    r = seeded_unit("input_surface", 4 * plane, seed).reshape(4, lat, lon)
    surface = (sm[:, None, None] + ss[:, None, None] * r).astype(np.float32)
    return upper, surface


def bits_checksum(a):
    """Order-free exact checksum: the sum of the f32 bit patterns mod 2^64."""
    return int(np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64).sum(dtype=np.uint64))


# ---------------------------------------------------------------- geometry helpers
def position_index():
    """MODEL.md: (zi + 2 zj) 23 36 + (hi + 6 hj) 23 + (wi - wj + 11), query
    i and key j in (z, h, w) order inside the window: [144 * 144]."""
    wz, wh, ww = WINDOW
    z, h, w = torch.meshgrid(torch.arange(wz), torch.arange(wh), torch.arange(ww), indexing="ij")
    z, h, w = z.flatten(), h.flatten(), w.flatten()
    idx = ((z[:, None] + wz * z[None, :]) * (2 * ww - 1) * wh * wh
           + (h[:, None] + wh * h[None, :]) * (2 * ww - 1)
           + (w[:, None] - w[None, :] + ww - 1))
    return idx.flatten()


def window_partition(x):
    """[Zp, Hp, Wp, C] -> [types = nz * nh, nw, 144, C], windows (z, h, w)-major."""
    zp, hp, wp, c = x.shape
    wz, wh, ww = WINDOW
    x = x.reshape(zp // wz, wz, hp // wh, wh, wp // ww, ww, c).permute(0, 2, 4, 1, 3, 5, 6)
    return x.reshape((zp // wz) * (hp // wh), wp // ww, TOKENS, c)


def window_reverse(x, padded):
    zp, hp, wp = padded
    wz, wh, ww = WINDOW
    c = x.shape[-1]
    x = x.reshape(zp // wz, hp // wh, wp // ww, wz, wh, ww, c).permute(0, 3, 1, 4, 2, 5, 6)
    return x.reshape(zp, hp, wp, c)


def shift_mask(zp, hp):
    """[types, 1, 1, 144, 144]: 0 within a region, -100 across; 9 (level,
    latitude) regions on the padded grid; longitude is not masked."""
    img = torch.zeros(zp, hp, WINDOW[2], 1)
    cnt = 0
    for z in (slice(None, -WINDOW[0]), slice(-WINDOW[0], -SHIFT[0]), slice(-SHIFT[0], None)):
        for h in (slice(None, -WINDOW[1]), slice(-WINDOW[1], -SHIFT[1]), slice(-SHIFT[1], None)):
            img[z, h] = cnt
            cnt += 1
    ids = window_partition(img)[:, 0, :, 0]  # [types, 144]
    diff = ids[:, :, None] != ids[:, None, :]
    return torch.where(diff, MASK_NEG, 0.0)[:, None, None]


# ---------------------------------------------------------------- the model
class Mlp(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, dim)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class EarthAttention3D(nn.Module):
    """Window attention with the earth-specific bias, on [types, nw, 144, C]."""

    def __init__(self, dim, heads, types, expanded_bias=False):
        super().__init__()
        self.heads, self.types, self.expanded_bias = heads, types, expanded_bias
        self.scale = (dim // heads) ** -0.5
        self.qkv = nn.Linear(dim, 3 * dim)
        if expanded_bias:
            self.earth_specific_bias = nn.Parameter(torch.zeros(1, types, heads, TOKENS, TOKENS))
        else:
            self.earth_specific_bias = nn.Parameter(torch.zeros(BIAS_ROWS, types, heads))
        nn.init.trunc_normal_(self.earth_specific_bias, std=0.02)
        self.proj = nn.Linear(dim, dim)
        self.register_buffer("position_index", position_index(), persistent=False)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # An expanded module also loads the compact table (and the ONNX
        # graph's [types, heads, 144, 144] form).
        key = prefix + "earth_specific_bias"
        t = state_dict.get(key)
        if self.expanded_bias and t is not None:
            if t.dim() == 3:
                state_dict[key] = expand_earth_bias(t, self.position_index.to(t.device))
            elif t.dim() == 4:
                state_dict[key] = t.unsqueeze(0)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def bias(self):
        """[types, heads, 144, 144]."""
        if self.expanded_bias:
            return self.earth_specific_bias[0]
        b = self.earth_specific_bias[self.position_index]  # [144 * 144, types, heads]
        return b.reshape(TOKENS, TOKENS, self.types, self.heads).permute(2, 3, 0, 1)

    def forward(self, x, mask=None):
        types, nw, t, c = x.shape
        qkv = self.qkv(x).reshape(types, nw, t, 3, self.heads, c // self.heads).permute(3, 0, 1, 4, 2, 5)
        q, k, v = qkv[0], qkv[1], qkv[2]  # [types, nw, heads, 144, 32]
        q = q * self.scale
        attn = q @ k.transpose(-2, -1) + self.bias().unsqueeze(1)
        if mask is not None:
            attn = attn + mask
        attn = attn.softmax(dim=-1)
        y = (attn @ v).transpose(2, 3).reshape(types, nw, t, c)
        return self.proj(y)


def expand_earth_bias(table, index=None):
    """Compact [3312, types, heads] -> [1, types, heads, 144, 144] (torch)."""
    index = position_index().to(table.device) if index is None else index
    r, types, heads = table.shape
    return table[index].reshape(TOKENS, TOKENS, types, heads).permute(2, 3, 0, 1).unsqueeze(0).contiguous()


class EarthSpecificBlock(nn.Module):
    def __init__(self, dim, heads, grid, shifted, block_order, expanded_bias=False):
        super().__init__()
        self.grid = tuple(grid)
        self.padded = tuple(ceil_to(g, w) for g, w in zip(grid, WINDOW))
        self.shifted, self.pre = shifted, block_order == "pre"
        types = (self.padded[0] // WINDOW[0]) * (self.padded[1] // WINDOW[1])
        self.norm1 = nn.LayerNorm(dim, eps=EPS)
        self.attn = EarthAttention3D(dim, heads, types, expanded_bias)
        self.norm2 = nn.LayerNorm(dim, eps=EPS)
        self.mlp = Mlp(dim)
        if shifted:
            self.register_buffer("mask", shift_mask(self.padded[0], self.padded[1]), persistent=False)
        else:
            self.mask = None

    def window_attention(self, x):
        """[Z, H, W, C]: pad, roll, partition, attend, reverse, roll back, crop."""
        (z, h, w), (zp, hp, wp) = self.grid, self.padded
        x = F.pad(x, (0, 0, 0, wp - w, 0, hp - h, 0, zp - z))
        if self.shifted:
            x = torch.roll(x, shifts=(-SHIFT[0], -SHIFT[1], -SHIFT[2]), dims=(0, 1, 2))
        x = window_reverse(self.attn(window_partition(x), self.mask if self.shifted else None), self.padded)
        if self.shifted:
            x = torch.roll(x, shifts=SHIFT, dims=(0, 1, 2))
        return x[:z, :h, :w]

    def forward(self, x):
        if self.pre:
            x = x + self.window_attention(self.norm1(x))
            return x + self.mlp(self.norm2(x))
        x = x + self.norm1(self.window_attention(x))
        return x + self.norm2(self.mlp(x))


class EarthSpecificLayer(nn.Module):
    def __init__(self, depth, dim, grid, block_order, expanded_bias=False):
        super().__init__()
        self.blocks = nn.ModuleList([
            EarthSpecificBlock(dim, dim // HEAD_DIM, grid, j % 2 == 1, block_order, expanded_bias)
            for j in range(depth)])

    def forward(self, x):
        for blk in self.blocks:
            x = blk(x)
        return x


class PatchEmbedding(nn.Module):
    def __init__(self, lat, lon):
        super().__init__()
        self.lat, self.hp = lat, ceil_to(lat, 4)
        self.conv = nn.Conv3d(6, 192, (2, 4, 4), stride=(2, 4, 4))
        self.conv_surface = nn.Conv2d(7, 192, 4, stride=4)

    def forward(self, upper, surface, upper_constants, surface_constants):
        """Normalised upper [5, 13, H, W], surface [4, H, W] -> [8, h1, w1, 192]."""
        s = F.pad(surface, (0, 0, 0, self.hp - self.lat))
        s = self.conv_surface(torch.cat([s, surface_constants], dim=0).unsqueeze(0))  # [1, 192, h1, w1]
        u = torch.cat([upper, upper_constants.unsqueeze(0)], dim=0)  # [6, 13, H, W]
        u = F.pad(u, (0, 0, 0, self.hp - self.lat, 0, 1))  # [6, 14, Hp, W]
        u = self.conv(u.unsqueeze(0))  # [1, 192, 7, h1, w1]
        x = torch.cat([s.unsqueeze(2), u], dim=2)[0]  # [192, 8, h1, w1]
        return x.permute(1, 2, 3, 0)


class DownSample(nn.Module):
    def __init__(self, h1, h2):
        super().__init__()
        self.h1, self.h2 = h1, h2
        self.norm = nn.LayerNorm(768, eps=EPS)
        self.reduction = nn.Linear(768, 384, bias=False)

    def forward(self, x):
        z, _, w, c = x.shape
        x = F.pad(x, (0, 0, 0, 0, 0, 2 * self.h2 - self.h1))
        x = x.reshape(z, self.h2, 2, w // 2, 2, c).permute(0, 1, 3, 2, 4, 5).reshape(z, self.h2, w // 2, 4 * c)
        return self.reduction(self.norm(x))


class UpSample(nn.Module):
    def __init__(self, h1):
        super().__init__()
        self.h1 = h1
        self.linear1 = nn.Linear(384, 768, bias=False)
        self.norm = nn.LayerNorm(192, eps=EPS)
        self.linear2 = nn.Linear(192, 192, bias=False)

    def forward(self, x):
        z, h, w, _ = x.shape
        x = self.linear1(x).reshape(z, h, w, 2, 2, 192).permute(0, 1, 3, 2, 4, 5).reshape(z, 2 * h, 2 * w, 192)
        return self.linear2(self.norm(x[:, :self.h1]))


class PatchRecovery(nn.Module):
    def __init__(self, lat):
        super().__init__()
        self.lat = lat
        self.conv = nn.ConvTranspose3d(384, 5, (2, 4, 4), stride=(2, 4, 4))
        self.conv_surface = nn.ConvTranspose2d(384, 4, 4, stride=4)

    def forward(self, x):
        """[8, h1, w1, 384] -> upper [5, 13, H, W], surface [4, H, W]."""
        x = x.permute(3, 0, 1, 2).unsqueeze(0)  # [1, 384, 8, h1, w1]
        upper = self.conv(x[:, :, 1:])[0, :, :13, :self.lat]
        surface = self.conv_surface(x[:, :, 0])[0, :, :self.lat]
        return upper, surface


class Pangu(nn.Module):
    """forward(upper [5, 13, H, W] f32, surface [4, H, W] f32) -> the same
    shapes one lead later (a leading batch dim of 1 is accepted). The
    statistics stay f32 under .half() (f64 under .double()): normalising
    and de-normalising run in them; the body runs in the parameters' dtype."""

    def __init__(self, lat, lon, block_order="post", expanded_bias=False):
        super().__init__()
        if block_order not in ("post", "pre"):
            raise ValueError(f"block order {block_order!r}: expected post or pre")
        g = geometry(lat, lon)
        self.lat, self.lon, self.block_order = lat, lon, block_order
        um, us, sm, ss = statistics()
        for n, v in zip(STAT_NAMES, (um, us, sm, ss)):
            self.register_buffer(n, torch.tensor(v, dtype=torch.float32))
        self.register_buffer("surface_constants", torch.zeros(3, g["Hp"], lon))
        self.register_buffer("upper_constants", torch.zeros(13, lat, lon))
        self.patch_embed = PatchEmbedding(lat, lon)
        fine, coarse = (SLABS, g["h1"], g["w1"]), (SLABS, g["h2"], g["w2"])
        self.layers = nn.ModuleList([
            EarthSpecificLayer(depth, dim, fine if dim == 192 else coarse, block_order, expanded_bias)
            for depth, dim in LAYERS])
        self.downsample = DownSample(g["h1"], g["h2"])
        self.upsample = UpSample(g["h1"])
        self.patch_recovery = PatchRecovery(lat)

    def _apply(self, fn, recurse=True):
        stats = {n: getattr(self, n) for n in STAT_NAMES}
        super()._apply(fn, recurse)
        for n, old in stats.items():
            new = getattr(self, n)
            keep = torch.float64 if new.dtype == torch.float64 else torch.float32
            self._buffers[n] = old.to(device=new.device, dtype=keep)
        return self

    def skip(self, x0, x3):
        """Layer 0's output first, then layer 3's: 384 channels."""
        return torch.cat([x0, x3], dim=-1)

    def forward(self, upper, surface):
        batched = upper.dim() == 5
        if batched:
            if upper.shape[0] != 1 or surface.dim() != 4 or surface.shape[0] != 1:
                raise ValueError("only a batch of 1 is supported")
            upper, surface = upper[0], surface[0]
        if tuple(upper.shape) != (5, 13, self.lat, self.lon) or tuple(surface.shape) != (4, self.lat, self.lon):
            raise ValueError(f"inputs {tuple(upper.shape)}, {tuple(surface.shape)}: the model is for "
                             f"[5, 13, {self.lat}, {self.lon}] and [4, {self.lat}, {self.lon}]")
        sd = self.upper_mean.dtype
        dt = self.patch_embed.conv.weight.dtype
        um, us = self.upper_mean[:, :, None, None], self.upper_std[:, :, None, None]
        sm, ss = self.surface_mean[:, None, None], self.surface_std[:, None, None]
        u = ((upper.to(sd) - um) / us).to(dt)
        s = ((surface.to(sd) - sm) / ss).to(dt)
        x = self.patch_embed(u, s, self.upper_constants.to(dt), self.surface_constants.to(dt))
        x0 = self.layers[0](x)
        x = self.layers[2](self.layers[1](self.downsample(x0)))
        x = self.layers[3](self.upsample(x))
        yu, ys = self.patch_recovery(self.skip(x0, x))
        yu = yu.to(sd) * us + um
        ys = ys.to(sd) * ss + sm
        if batched:
            yu, ys = yu.unsqueeze(0), ys.unsqueeze(0)
        return yu, ys


def model_from_state(state, lat, lon, order, dtype=torch.float32, device="cpu"):
    """A Pangu module with `state` (numpy or torch tensors) loaded."""
    sd = {k: torch.as_tensor(np.ascontiguousarray(v)) if isinstance(v, np.ndarray) else v
          for k, v in state.items()}
    expanded = any(k.endswith("earth_specific_bias") and v.dim() >= 4 for k, v in sd.items())
    m = Pangu(lat, lon, order, expanded_bias=expanded)
    sd = {k: v.float() for k, v in sd.items()}
    m.load_state_dict(sd, strict=True)
    m = m.to(device=device)
    if dtype != torch.float32:
        m = m.to(dtype=dtype)
    return m.eval().requires_grad_(False)


def load_weights(path):
    """(state dict of torch tensors, metadata dict)."""
    from safetensors import safe_open
    sd = {}
    with safe_open(path, framework="pt") as f:
        meta = dict(f.metadata() or {})
        for k in f.keys():
            sd[k] = f.get_tensor(k)
    if meta.get("format", "pangu-weather") != "pangu-weather":
        raise ValueError(f"{path}: format {meta.get('format')!r}, expected pangu-weather")
    return sd, meta


def grid_of(sd, meta):
    if "lat" in meta and "lon" in meta:
        return int(meta["lat"]), int(meta["lon"])
    c = sd["upper_constants"]
    return int(c.shape[1]), int(c.shape[2])


# ---------------------------------------------------------------- commands
def log(args, rec):
    if getattr(args, "log", None):
        with open(args.log, "a") as f:
            f.write(json.dumps(rec) + "\n")


def device_of(name):
    if name:
        return torch.device(name)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def strict_f32():
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def f32_hex(x):
    return f"0x{int(np.float32(x).view(np.uint32)):08x}"


def cmd_selftest(args):
    ok = True
    rec = {"cmd": "selftest"}
    f = fnv1a64(b"abc")
    s = splitmix64(0)
    ok &= f == 0xE71FA2190541574B and s == 0xE220A8397B1DCDAF
    print(f"fnv1a64(b'abc') = 0x{f:016x}  (expected 0xe71fa2190541574b)")
    print(f"splitmix64(0)   = 0x{s:016x}  (expected 0xe220a8397b1dcdaf)")
    rec.update(fnv1a64_abc=f"0x{f:016x}", splitmix64_0=f"0x{s:016x}")
    k = fnv1a64(b"patch_embed.conv.bias") ^ 1
    print(f"key('patch_embed.conv.bias', 1) = 0x{k:016x}; splitmix64(key) = 0x{splitmix64(k):016x}")
    v = seeded("patch_embed.conv.bias", [192], 0.0, 0.02, 1)[:4]
    print("seeded('patch_embed.conv.bias', [192], 0, 0.02, 1)[:4] =",
          ", ".join(f"{x:.9g} ({f32_hex(x)})" for x in v))
    rec["patch_embed.conv.bias[:4]"] = [f32_hex(x) for x in v]
    um, us, sm, ss = statistics()
    for name, val in [("upper_mean Z500", um[0, 5]), ("upper_mean Z50", um[0, 12]), ("upper_mean Q1000", um[1, 0]),
                      ("upper_std Q50", us[1, 12]), ("upper_mean T50", um[2, 12]), ("upper_std U50", us[3, 12])]:
        print(f"{name:17} = {float(val)!r} (f32 {f32_hex(val)})")
        rec[name] = f32_hex(val)
    lat, lon = FIXTURE_GRID
    upper, surface = seeded_inputs(lat, lon, FIXTURE_SEED)
    print(f"input_upper[0, 0, 0, :4] ({lat}x{lon}, seed {FIXTURE_SEED}) =",
          ", ".join(f"{float(x)!r} ({f32_hex(x)})" for x in upper[0, 0, 0, :4]))
    print("input_surface[0, 0, :4] =", ", ".join(f"{float(x)!r} ({f32_hex(x)})" for x in surface[0, 0, :4]))
    rec["input_upper[0,0,0,:4]"] = [f32_hex(x) for x in upper[0, 0, 0, :4]]
    rec["input_surface[0,0,:4]"] = [f32_hex(x) for x in surface[0, 0, :4]]
    sd = init_state(lat, lon, "post", FIXTURE_SEED)
    total = 0
    for n in sorted(sd):
        total = (total + bits_checksum(sd[n])) & _M64
    n_params = sum(a.size for a in sd.values())
    print(f"init_state({lat}, {lon}, seed {FIXTURE_SEED}): {len(sd)} tensors, {n_params} values; "
          f"sum of f32 bit patterns mod 2^64 = {total}")
    for n in ["layers.0.blocks.1.attn.earth_specific_bias", "patch_recovery.conv.weight", "upper_constants"]:
        print(f"  bits checksum {n} {list(sd[n].shape)} = {bits_checksum(sd[n])}")
        rec[f"checksum {n}"] = bits_checksum(sd[n])
    rec.update(checksum_total=total, tensors=len(sd), values=int(n_params))
    pos = position_index()
    ok &= int(pos.max()) == BIAS_ROWS - 1 and int(pos.min()) == 0 and len(torch.unique(pos)) == BIAS_ROWS
    print(f"position_index: {pos.numel()} entries, min {int(pos.min())}, max {int(pos.max())}, "
          f"{len(torch.unique(pos))} distinct; first 4 {pos[:4].tolist()}, [144] {int(pos[144])}")
    rec["ok"] = bool(ok)
    log(args, rec)
    print("selftest", "ok" if ok else "FAILED")
    return 0 if ok else 1


def cmd_init(args):
    from safetensors.numpy import save_file
    t0 = time.perf_counter()
    sd = init_state(args.lat, args.lon, args.order, args.seed)
    t1 = time.perf_counter()
    meta = {"format": "pangu-weather", "block_order": args.order, "interval_hours": str(args.interval),
            "lat": str(args.lat), "lon": str(args.lon), "seed": str(args.seed)}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    save_file(sd, args.out, metadata=meta)
    t2 = time.perf_counter()
    n = int(sum(a.size for a in sd.values()))
    params = int(sum(a.size for k, a in sd.items() if k not in STAT_NAMES and not k.endswith("_constants")))
    size = os.path.getsize(args.out)
    print(f"wrote {args.out}: {len(sd)} tensors, {n} values ({params} parameters), {size / 1e6:.1f} MB; "
          f"generate {t1 - t0:.1f} s, write {t2 - t1:.1f} s", flush=True)
    log(args, {"cmd": "init", "out": args.out, "lat": args.lat, "lon": args.lon, "order": args.order,
               "seed": args.seed, "tensors": len(sd), "values": n, "parameters": params, "bytes": size,
               "generate_s": t1 - t0, "write_s": t2 - t1})
    return 0


def cmd_inputs(args):
    os.makedirs(args.dir, exist_ok=True)
    t0 = time.perf_counter()
    upper, surface = seeded_inputs(args.lat, args.lon, args.seed)
    np.save(os.path.join(args.dir, "input_upper.npy"), upper)
    np.save(os.path.join(args.dir, "input_surface.npy"), surface)
    dt = time.perf_counter() - t0
    print(f"wrote {args.dir}/input_upper.npy {list(upper.shape)}, input_surface.npy {list(surface.shape)} "
          f"({dt:.1f} s)")
    log(args, {"cmd": "inputs", "dir": args.dir, "lat": args.lat, "lon": args.lon, "seed": args.seed,
               "seconds": dt})
    return 0


def out_name(kind, hours):
    return f"output_{kind}_{hours:03d}h.npy"


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize()


def cmd_reference(args):
    dev = device_of(args.device)
    strict_f32()
    sd, meta = load_weights(args.weights)
    lat, lon = grid_of(sd, meta)
    order = meta.get("block_order", "post")
    interval = int(meta.get("interval_hours", "24"))
    u0 = np.load(args.upper).astype(np.float32)
    s0 = np.load(args.surface).astype(np.float32)
    rec = {"cmd": "reference", "weights": args.weights, "device": str(dev), "lat": lat, "lon": lon,
           "order": order, "steps": args.steps, "interval_hours": interval, "torch": torch.__version__}
    precisions = [("f32", torch.float32)] + ([] if args.no_f16 else [("f16", torch.float16)])
    for tag, dtype in precisions:
        out_dir = os.path.join(args.out, tag)
        os.makedirs(out_dir, exist_ok=True)
        m = model_from_state(sd, lat, lon, order, dtype, dev)
        u = torch.from_numpy(u0).to(dev)
        s = torch.from_numpy(s0).to(dev)
        times = []
        with torch.inference_mode():
            for k in range(1, args.steps + 1):
                sync(dev)
                t0 = time.perf_counter()
                u, s = m(u, s)
                sync(dev)
                times.append(time.perf_counter() - t0)
                h = k * interval
                un, sn = u.float().cpu().numpy(), s.float().cpu().numpy()
                np.save(os.path.join(out_dir, out_name("upper", h)), un)
                np.save(os.path.join(out_dir, out_name("surface", h)), sn)
                finite = bool(np.isfinite(un).all() and np.isfinite(sn).all())
                print(f"{tag} step {k} (+{h} h): {times[-1]:.2f} s, finite {finite}", flush=True)
        rec[f"{tag}_step_s"] = times
        del m
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    log(args, rec)
    return 0


def channel_errors(got_u, got_s, ref_u, ref_s):
    """[(max abs, rms)] per channel, 69 rows; NaN gives inf."""
    g = np.concatenate([got_u.reshape(65, -1), got_s.reshape(4, -1)]).astype(np.float64)
    r = np.concatenate([ref_u.reshape(65, -1), ref_s.reshape(4, -1)]).astype(np.float64)
    d = np.abs(g - r)
    mx = np.where(np.isnan(d).any(axis=1), np.inf, np.nanmax(d, axis=1))
    rms = np.where(np.isnan(d).any(axis=1), np.inf, np.sqrt(np.mean(d * d, axis=1)))
    return mx, rms


def _steps_in(d):
    hs = []
    for n in os.listdir(d):
        if n.startswith("output_upper_") and n.endswith("h.npy"):
            hs.append(int(n[len("output_upper_"):-len("h.npy")]))
    return sorted(hs)


def run_check(ref_dir, rust_dir, margin, swap=None, quiet=False):
    """(ok, rows): every (step, channel) row with the errors and the verdict."""
    ref_hours = _steps_in(os.path.join(ref_dir, "f32"))
    hours = [h for h in ref_hours if os.path.exists(os.path.join(rust_dir, out_name("upper", h)))]
    if not hours:
        raise SystemExit(f"no step of {ref_dir}/f32 ({ref_hours}) has a Rust output in {rust_dir}")
    rows, ok = [], True
    for h in hours:
        load = lambda d, k: np.load(os.path.join(d, out_name(k, h)))  # noqa: E731
        ru, rs = load(os.path.join(ref_dir, "f32"), "upper"), load(os.path.join(ref_dir, "f32"), "surface")
        fu, fs = load(os.path.join(ref_dir, "f16"), "upper"), load(os.path.join(ref_dir, "f16"), "surface")
        gu, gs = load(rust_dir, "upper"), load(rust_dir, "surface")
        if gu.shape != ru.shape or gs.shape != rs.shape:
            raise SystemExit(f"+{h} h: Rust shapes {gu.shape}, {gs.shape} != reference {ru.shape}, {rs.shape}")
        if swap is not None:
            flat = np.concatenate([gu.reshape(65, -1), gs.reshape(4, -1)]).copy()
            a, b = swap
            flat[[a, b]] = flat[[b, a]]
            gu, gs = flat[:65].reshape(gu.shape), flat[65:].reshape(gs.shape)
        rmx, rrms = channel_errors(gu, gs, ru, rs)
        fmx, frms = channel_errors(fu, fs, ru, rs)
        for c, name in enumerate(CHANNELS):
            passed = bool(rmx[c] <= margin * fmx[c] and rrms[c] <= margin * frms[c])
            ok &= passed
            rows.append({"hours": h, "channel": name, "rust_max_abs": float(rmx[c]), "rust_rms": float(rrms[c]),
                         "torch_f16_max_abs": float(fmx[c]), "torch_f16_rms": float(frms[c]), "pass": passed})
    if not quiet:
        print(f"{'lead':>5} {'channel':8} {'rust max':>11} {'f16 max':>11} {'rust rms':>11} {'f16 rms':>11}  verdict")
        for r in rows:
            print(f"{r['hours']:4d}h {r['channel']:8} {r['rust_max_abs']:11.4e} {r['torch_f16_max_abs']:11.4e} "
                  f"{r['rust_rms']:11.4e} {r['torch_f16_rms']:11.4e}  {'ok' if r['pass'] else 'FAIL'}")
    return ok, rows, hours


def cmd_check(args):
    ok, rows, hours = run_check(args.ref, args.rust, args.margin)
    fails = [f"{r['channel']}@{r['hours']}h" for r in rows if not r["pass"]]
    worst = max(rows, key=lambda r: max(r["rust_max_abs"] / max(r["torch_f16_max_abs"], 1e-300),
                                        r["rust_rms"] / max(r["torch_f16_rms"], 1e-300)))
    print(f"gate (rust <= {args.margin} x torch f16, max abs and rms, every channel, leads {hours}): "
          f"{'PASSED' if ok else f'FAILED ({len(fails)}): ' + ', '.join(fails[:12]) + (' ...' if len(fails) > 12 else '')}")
    print(f"worst ratio: {worst['channel']}@{worst['hours']}h max {worst['rust_max_abs']:.3e}/"
          f"{worst['torch_f16_max_abs']:.3e}, rms {worst['rust_rms']:.3e}/{worst['torch_f16_rms']:.3e}")
    result = {"cmd": "check", "ref": args.ref, "rust": args.rust, "margin": args.margin, "hours": hours,
              "pass": bool(ok), "failed": fails, "channels": rows}
    code = 0 if ok else 1
    if args.swap_test:
        a, b = (CHANNELS.index(n) for n in args.swap.split(","))
        sok, _, _ = run_check(args.ref, args.rust, args.margin, swap=(a, b), quiet=True)
        print(f"swap test ({args.swap} exchanged in the Rust output): "
              f"{'wrongly PASSES: the gate cannot see a channel mix-up' if sok else 'fails, as it must'}")
        result["swap_test"] = {"swapped": args.swap, "swapped_passes": bool(sok)}
        if sok:
            code = 1
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    log(args, {k: v for k, v in result.items() if k != "channels"})
    return code


# ---------------------------------------------------------------- fixture
def fixture_outputs(orders=("post", "pre"), breaks=None):
    """{order: (upper, surface)} float64 one-step outputs at the fixture grid."""
    lat, lon = FIXTURE_GRID
    sd = init_state(lat, lon, "post", FIXTURE_SEED)
    upper, surface = seeded_inputs(lat, lon, FIXTURE_SEED)
    out = {}
    for order in orders:
        m = model_from_state(sd, lat, lon, order, torch.float64)
        if breaks == "skip":
            m.skip = lambda x0, x3: torch.cat([x3, x0], dim=-1)
        elif breaks == "shift":
            for layer in m.layers:
                for blk in layer.blocks:
                    blk.shifted = False
        with torch.inference_mode():
            u, s = m(torch.from_numpy(upper), torch.from_numpy(surface))
        out[order] = (u.numpy(), s.numpy())
    return upper, surface, out


def fixture_files():
    return ["input_upper.npy", "input_surface.npy", "post_upper.npy", "post_surface.npy",
            "pre_upper.npy", "pre_surface.npy"]


def cmd_fixture(args):
    lat, lon = FIXTURE_GRID
    t0 = time.perf_counter()
    upper, surface, out = fixture_outputs(breaks=args.break_ if args.check else None)
    dt = time.perf_counter() - t0
    arrays = {"input_upper.npy": upper, "input_surface.npy": surface}
    for order, (u, s) in out.items():
        arrays[f"{order}_upper.npy"] = u
        arrays[f"{order}_surface.npy"] = s
    if not args.check:
        os.makedirs(args.dir, exist_ok=True)
        files = {}
        for name, a in arrays.items():
            p = os.path.join(args.dir, name)
            np.save(p, a.astype(np.float32))
            with open(p, "rb") as f:
                files[name] = {"bytes": os.path.getsize(p), "sha256": hashlib.sha256(f.read()).hexdigest()}
        desc = {"lat": lat, "lon": lon, "seed": FIXTURE_SEED, "steps": 1, "orders": ["post", "pre"],
                "computed_in": "float64", "stored_as": "float32", "torch": torch.__version__,
                "numpy": np.__version__, "spec": "pangu/MODEL.md",
                "generator": "benches/pangu_model.py fixture", "files": files}
        with open(os.path.join(args.dir, "fixture.json"), "w") as f:
            json.dump(desc, f, indent=1)
            f.write("\n")
        total = sum(v["bytes"] for v in files.values())
        for name, v in files.items():
            print(f"{name:20} {v['bytes']:8d} bytes")
        print(f"wrote {args.dir} ({total / 1e6:.2f} MB, computed in {dt:.1f} s)")
        log(args, {"cmd": "fixture", "dir": args.dir, "bytes": total, "seconds": dt, "torch": torch.__version__})
        return 0
    # --check: inputs bit for bit, outputs within 1e-4 of each channel's std.
    _, us, _, ss = statistics()
    scale = np.concatenate([us.reshape(65), ss])
    ok, worst = True, {}
    for name, a in arrays.items():
        ref = np.load(os.path.join(args.dir, name))
        if ref.shape != a.shape:
            print(f"{name}: shape {ref.shape} != {a.shape}")
            ok = False
            continue
        if name.startswith("input_"):
            same = np.array_equal(ref, a.astype(np.float32))
            print(f"{name:20} {'bit-identical' if same else 'DIFFERS (generator mismatch)'}")
            ok &= same
            continue
        d = np.abs(a.astype(np.float64) - ref.astype(np.float64))
        chans = CHANNELS[:65] if "upper" in name else CHANNELS[65:]
        sc = scale[:65] if "upper" in name else scale[65:]
        rel = d.reshape(len(chans), -1).max(axis=1) / sc
        c = int(np.argmax(rel))
        good = bool(rel.max() < 1e-4) and bool(np.isfinite(a).all())
        ok &= good
        worst[name] = {"channel": chans[c], "max_abs_over_std": float(rel.max())}
        print(f"{name:20} max |diff| / channel std = {rel.max():.3e} (at {chans[c]}) {'ok' if good else 'MISMATCH'}")
    tag = f" with --break {args.break_}" if args.break_ else ""
    print(f"fixture check{tag}: {'ok' if ok else 'FAILED'}")
    log(args, {"cmd": "fixture-check", "dir": args.dir, "break": args.break_, "pass": bool(ok), "worst": worst,
               "seconds": dt, "torch": torch.__version__})
    return 0 if ok else 1


# ---------------------------------------------------------------- bench
def gpu_info():
    info = {"torch": torch.__version__, "cuda": torch.version.cuda}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
    try:
        q = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
                            "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
        if q.returncode == 0:
            info["nvidia_smi"] = q.stdout.strip().splitlines()[0]
            info["driver"] = info["nvidia_smi"].split(",")[1].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return info


class _Timeout(BaseException):  # not swallowed by an `except Exception` inside the compiler
    pass


def cmd_bench(args):
    import gc
    import torch._dynamo
    dev = device_of(args.device)
    cuda = dev.type == "cuda"  # cpu: a smoke test of the harness (wall-clock times, no memory figures)
    info = gpu_info() if cuda else {"torch": torch.__version__, "cuda": torch.version.cuda, "gpu": "cpu"}
    print(f"torch {info['torch']} (CUDA {info['cuda']}), {info.get('gpu')}, driver {info.get('driver')}", flush=True)
    sd, meta = load_weights(args.weights)
    lat, lon = grid_of(sd, meta)
    if (lat, lon) != (args.lat, args.lon):
        raise SystemExit(f"{args.weights} is for {lat} x {lon}, not {args.lat} x {args.lon}")
    order = meta.get("block_order", "post")
    m = model_from_state(sd, lat, lon, order, torch.float16, dev)
    del sd
    u0, s0 = seeded_inputs(lat, lon, args.seed)
    u = torch.from_numpy(u0).to(dev)  # GPU-resident inputs; the outputs stay on the device
    s = torch.from_numpy(s0).to(dev)
    resident = torch.cuda.memory_allocated() if cuda else 0
    results = {"cmd": "bench", "weights": args.weights, "lat": lat, "lon": lon, "order": order,
               "device": str(dev), "dtype": "float16", "warmup": args.warmup, "steps": args.steps,
               **info, "eager_outputs": "host", "modes": {}}
    eager_out = None
    for mode in args.modes.split(","):
        torch._dynamo.reset()
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
        rec = {}
        compiled = mode != "eager"
        print(f"[{mode}] {'compiling + first call' if compiled else 'first call'} ...", flush=True)
        fn = None
        try:
            fn = m if not compiled else torch.compile(m, mode=None if mode == "default" else mode)

            def step():
                if compiled:
                    torch.compiler.cudagraph_mark_step_begin()
                return fn(u, s)

            if args.compile_timeout:
                def on_alarm(*_):
                    raise _Timeout()
                signal.signal(signal.SIGALRM, on_alarm)
                signal.alarm(args.compile_timeout)
            t0 = time.perf_counter()
            with torch.inference_mode():
                out = step()
                sync(dev)
                rec["first_call_s"] = time.perf_counter() - t0
                if args.compile_timeout:
                    signal.alarm(0)
                print(f"[{mode}] first call {rec['first_call_s']:.1f} s; warm-up x{args.warmup}", flush=True)
                # Eager's outputs are kept on the host for the later modes'
                # comparison: on the device they would count in those modes'
                # peak memory.
                ou, os_ = out[0].float().cpu(), out[1].float().cpu()
                del out
                if eager_out is None and not compiled:
                    eager_out = (ou, os_)
                elif eager_out is not None:
                    rec["max_abs_vs_eager"] = [float((ou - eager_out[0]).abs().max()),
                                               float((os_ - eager_out[1]).abs().max())]
                del ou, os_
                # The warm-up's peak too: a mode that replays CUDA graphs
                # (max-autotune) records them here, in a private pool whose
                # memory max_memory_allocated no longer counts while the
                # graphs replay in the timed steps.
                if cuda:
                    torch.cuda.reset_peak_memory_stats()
                for _ in range(args.warmup):
                    step()
                sync(dev)
                rec["warmup_max_allocated_bytes"] = torch.cuda.max_memory_allocated() if cuda else 0
                rec["first_call_plus_warmup_s"] = time.perf_counter() - t0
                if cuda:
                    torch.cuda.reset_peak_memory_stats()
                samples = []
                for i in range(args.steps):
                    if cuda:
                        a = torch.cuda.Event(enable_timing=True)
                        b = torch.cuda.Event(enable_timing=True)
                        a.record()
                        step()
                        b.record()
                        b.synchronize()
                        samples.append(a.elapsed_time(b))
                    else:
                        t1 = time.perf_counter()
                        step()
                        samples.append((time.perf_counter() - t1) * 1e3)
                    if i == 0 or (i + 1) % 10 == 0:
                        print(f"[{mode}] step {i + 1}/{args.steps}: {samples[-1]:.2f} ms", flush=True)
                sync(dev)
            rec.update(samples_ms=samples, median_ms=float(np.median(samples)), min_ms=float(min(samples)),
                       max_allocated_bytes=torch.cuda.max_memory_allocated() if cuda else 0,
                       max_reserved_bytes=torch.cuda.max_memory_reserved() if cuda else 0,
                       resident_bytes=resident)
            print(f"[{mode}] median {rec['median_ms']:.2f} ms (min {rec['min_ms']:.2f}) over {args.steps}; "
                  f"peak allocated {rec['max_allocated_bytes'] / 2**30:.2f} GiB, reserved "
                  f"{rec['max_reserved_bytes'] / 2**30:.2f} GiB (weights + inputs {resident / 2**30:.2f} GiB)",
                  flush=True)
        except _Timeout:
            rec["error"] = f"first call (compile) exceeded {args.compile_timeout} s"
            print(f"[{mode}] {rec['error']}", flush=True)
        except Exception as e:  # one failing mode must not lose the others
            rec["error"] = f"{type(e).__name__}: {e}"[:2000]
            print(f"[{mode}] failed: {rec['error'][:500]}", flush=True)
        finally:
            if args.compile_timeout:
                signal.alarm(0)
        results["modes"][mode] = rec
        fn = step = None
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    log(args, results)
    return 0 if all("error" not in r for r in results["modes"].values()) else 1


# ---------------------------------------------------------------- main
def main(argv=None):
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--log", help="append a JSON line of what was measured to this file")
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("selftest", parents=[common])
    p = sub.add_parser("init", parents=[common])
    p.add_argument("--out", required=True)
    p.add_argument("--lat", type=int, default=721)
    p.add_argument("--lon", type=int, default=1440)
    p.add_argument("--order", choices=["post", "pre"], default="post")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--interval", type=int, default=24)
    p = sub.add_parser("inputs", parents=[common])
    p.add_argument("--dir", required=True)
    p.add_argument("--lat", type=int, default=721)
    p.add_argument("--lon", type=int, default=1440)
    p.add_argument("--seed", type=int, default=1)
    p = sub.add_parser("reference", parents=[common])
    p.add_argument("--weights", required=True)
    p.add_argument("--upper", required=True)
    p.add_argument("--surface", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--device", choices=["cpu", "cuda"], default=None)
    p.add_argument("--steps", type=int, default=1)
    p.add_argument("--no-f16", action="store_true")
    p = sub.add_parser("check", parents=[common])
    p.add_argument("--ref", required=True)
    p.add_argument("--rust", required=True)
    p.add_argument("--json")
    p.add_argument("--margin", type=float, default=1.0)
    p.add_argument("--swap-test", action="store_true")
    p.add_argument("--swap", default="T850,T700", help="the two channels --swap-test exchanges")
    p = sub.add_parser("fixture", parents=[common])
    p.add_argument("--dir", default="tests/data/pangu")
    p.add_argument("--check", action="store_true")
    p.add_argument("--break", dest="break_", choices=["skip", "shift"],
                   help="with --check: plant a wiring bug (skip: concatenation order; shift: no shifted windows)")
    p = sub.add_parser("bench", parents=[common])
    p.add_argument("--weights", required=True)
    p.add_argument("--lat", type=int, default=721)
    p.add_argument("--lon", type=int, default=1440)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--modes", default="eager,default,max-autotune")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--json")
    p.add_argument("--compile-timeout", type=int, default=0, help="seconds for a mode's first call; 0: none")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="cpu: a smoke test of the harness")
    args = ap.parse_args(argv)
    if args.cmd == "fixture" and args.break_ and not args.check:
        ap.error("--break only goes with --check")
    return {"selftest": cmd_selftest, "init": cmd_init, "inputs": cmd_inputs, "reference": cmd_reference,
            "check": cmd_check, "fixture": cmd_fixture, "bench": cmd_bench}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
