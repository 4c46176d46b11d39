#!/usr/bin/env python3
"""Peer timings for the wavefuse harness: PyTorch eager, torch.compile and
torch.compile(mode="max-autotune-no-cudagraphs") at the harness's shapes,
timed the way the harness times its kernels, plus a same-byte device copy
measured in the same run.

    python3 benches/peers.py [--out peers.jsonl] [--only SUBSTRING] [--quick]
                             [--no-compile] [--reps N] [--warmup N]
                             [--no-launch-ahead] [--list] [--verbose]

Runs on CUDA and ROCm builds of PyTorch alike (device "cuda", torch APIs only;
triton is only asked for its version).

Method (mirrors src/bench.rs):
  * f16 everywhere; every input set is fresh random data (torch.randn * scale,
    seeded per set).
  * Input sets are rotated launch by launch; their number is
    ceil(4 * L2 / bytes) clamped to [2, 64], L2 from
    torch.cuda.get_device_properties(0).L2_cache_size (0 -> 2 sets), exactly
    as the harness's n_sets(), so the working set is >= 4x the L2.
  * 10 warm-up launches (after the compile call for compiled versions), then
    --reps (default 100) timed launches, each between its own pair of
    torch.cuda.Event(enable_timing=True); median, p10, p90 are
    sorted[round((n - 1) * p)] like the harness; raw samples are kept.
  * Launch-ahead: before the timed loop a torch.cuda._sleep spacer (about
    50 ms of GPU spin) is queued so the CPU can queue the launches ahead of
    the GPU and Python dispatch / guard overhead does not show up as GPU idle
    time inside an event pair (what triton.testing.do_bench gets from its
    L2-flush memset before each launch). --no-launch-ahead turns it off; the
    record says which was used.
  * copy: dst.copy_(src) over f16 buffers of ceil((bytes // 2) / 2) elements
    each (read + written = bytes, rounded up to 4 bytes), rotated over the
    same number of sets, timed the same way, in the same run; its GB/s uses
    the bytes it really moved (4 * elements), as the harness does.
  * GB/s = bytes / median. bytes is the op's minimal traffic: every input
    read once, every output written once (formulas below), never what a
    particular implementation moves.

Byte formulas (f16 = 2 bytes; must equal the harness's Case::bytes()):
  layer_norm [R,C]          2*R*C (x) + 2*R*C (y)                  = 4*R*C
  layer_norm_affine [R,C]   4*R*C + 2*C (gamma) + 2*C (beta)       = 4*R*C + 4*C
  add_layer_norm [R,C]      residual + branch read, r and y written = 8*R*C
  add_layer_norm_affine     8*R*C + 2*C (gamma) + 2*C (beta)       = 8*R*C + 4*C
  gather 8xHxWxC            read the grid once, write the padded windowed
                            tokens once: 2*C*(Z*H*W) + 2*C*(Zp*Hp*Wp)
                            (Zp, Hp, Wp = Z, H, W rounded up to the window
                            (2, 6, 12)); pad tokens are written, never read
  gather_index_select       the same as gather (the op's bytes). The int64
                            index (8 * Zp*Hp*Wp bytes) is an artefact of that
                            implementation and is not counted; it is recorded
                            as index_bytes.
  layer_norm_gather         the same as gather: 2*C*(Z*H*W + Zp*Hp*Wp)
  layer_norm_gather_affine  that + 4*C (gamma and beta)
  bias_gelu [R,C]           x read, y written, bias read once = 4*R*C + 2*C
  qkv_split NxH             qkv [N*144, 3*32*H] read (2*N*144*96*H), q, k, v
                            [N,H,144,32] written (3 * 2*N*H*144*32)
                                                           = 4*N*144*96*H
  bias_mask_add NxH         scores read + out written: 2 * 2*N*H*144*144;
                            bias table read once: 2*T*H*144*144 (T window
                            types); mask table read once: 2*S*144*144
                            (S = 8 slots). The window->type and window->slot
                            maps are functions of the window id and are not
                            counted (8*N bytes each as int64 here).
  bias_mask_softmax NxH     the same as bias_mask_add
  softmax NxH               2 * 2*N*H*144*144
  window_attention NxH      qkv [N*144, 3*32*H] read and out [N*144, 32*H]
                            written (8*N*144*32*H), plus the bias tables
                            read once as for bias_mask_add and the mask's
                            int32 region labels (4*8*144)

Shapes: "[R,C]" for row ops, "ZxHxWxC" (the unpadded grid) for the gather
family, "NxH" (windows x heads) for the attention ops; the grids are
Pangu's (8,91,180) -> padded (8,96,180): N = 4*16*15 = 960 windows, 64
window types, and (8,181,360) -> padded (8,186,360): N = 4*31*30 = 3720
windows, 124 window types (type = z_window * (Hp/6) + h_window). Mask slot of
a window: 4*(last z window) + 2*(last h window) + (last w window), 8 slots.

Implementations worth knowing about:
  gather                 F.pad (zeros at the end of each dim, up to the window)
                         -> torch.roll(shifts=(-1,-3,-6), dims=(0,1,2)) ->
                         view/permute to windows -> .contiguous().view(-1, C)
  gather_index_select    torch.index_select(src, 0, idx): src is the grid as
                         [Z*H*W + 1, C] with a zero last row (built with the
                         input set, not per call), idx the int64 source row of
                         every output token, Z*H*W for pad tokens; the eager
                         run checks it equals gather's output (matches_gather)
  qkv_split              q = (qkv[0] * scale).contiguous(): a pointwise op keeps
                         the permuted input layout, so .contiguous() is needed
                         for the compact [N,H,144,32] layout the harness writes
  bias_mask_*            attn + bias[type_idx].view(N,H,144,144)
                         + mask[slot_idx].view(N,1,144,144), as Pangu writes it
  window_attention       Pangu's / Swin's WindowAttention.forward from the qkv
                         Linear output: reshape/permute to q, k, v, q * scale,
                         q @ k^T, + bias + mask as above, softmax, @ v,
                         transpose(1, 2).reshape(N*144, C); the mask is the
                         tile of random region labels (0 within a region,
                         -100 across), which wavefuse reads as the labels
                         themselves. Extra impl "sdpa":
                         F.scaled_dot_product_attention on the q, k, v views
                         with the bias + mask materialised once per input set
                         as an [N,H,144,144] f16 attn_mask (outside the timed
                         call, as a model could cache it per window type)
Compiled versions record max_abs_diff_vs_eager (on input set 0); --list
prints the cases and their byte counts without a GPU.

Output: JSON lines (--out, default peers.jsonl), one record per
(variant, shape, impl), impl in {eager, compile, compile_max_autotune, copy}
(and a case's extra impls, e.g. "sdpa"; "wavefuse" with --wavefuse-ptx).
A failed implementation gets a record with "error" and null timings.
"""

import argparse
import datetime
import importlib
import json
import math
import sys
import time
import traceback

import torch
import torch.nn.functional as F

WINDOW = (2, 6, 12)
SHIFT = (1, 3, 6)
TOKENS = WINDOW[0] * WINDOW[1] * WINDOW[2]  # 144
HEAD_DIM = 32
N_SLOTS = 8
DEV = "cuda"
F16 = torch.float16


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def ceil_to(n, m):
    return -(-n // m) * m


def percentile(sorted_vals, p):
    """sorted[round((n - 1) * p)], rounding half away from zero (Rust's f64::round)."""
    if not sorted_vals:
        return float("nan")
    return sorted_vals[int(math.floor((len(sorted_vals) - 1) * p + 0.5))]


def n_sets(l2_bytes, nbytes):
    """The harness's n_sets(): ceil(4 * L2 / bytes) clamped to [2, 64]."""
    if l2_bytes <= 0:
        return 2
    return max(2, min(64, -(-(4 * l2_bytes) // max(nbytes, 1))))


def randn(shape, scale=1.0, offset=0.0):
    t = torch.randn(shape, device=DEV, dtype=F16)
    if scale != 1.0:
        t.mul_(scale)
    if offset != 0.0:
        t.add_(offset)
    return t


# ---------------------------------------------------------------- the ops
# Written as the model code writes them; each returns its output(s).

def op_layer_norm(x):
    return F.layer_norm(x, (x.shape[-1],), eps=1e-5)


def op_layer_norm_affine(x, w, b):
    return F.layer_norm(x, (x.shape[-1],), w, b, eps=1e-5)


def op_add_layer_norm(residual, branch):
    r = residual + branch
    return r, F.layer_norm(r, (r.shape[-1],), eps=1e-5)


def op_add_layer_norm_affine(residual, branch, w, b):
    r = residual + branch
    return r, F.layer_norm(r, (r.shape[-1],), w, b, eps=1e-5)


def window_partition(x):
    """Pangu's pad + roll + window partition of a [Z, H, W, C] tensor to
    [n_windows * 144, C] (windows row-major in (z, h, w), tokens row-major
    inside a window)."""
    z, h, w, c = x.shape
    wz, wh, ww = WINDOW
    pz, ph, pw = (-z) % wz, (-h) % wh, (-w) % ww
    x = F.pad(x, (0, 0, 0, pw, 0, ph, 0, pz))
    x = torch.roll(x, shifts=(-SHIFT[0], -SHIFT[1], -SHIFT[2]), dims=(0, 1, 2))
    zp, hp, wp = z + pz, h + ph, w + pw
    x = x.view(zp // wz, wz, hp // wh, wh, wp // ww, ww, c)
    x = x.permute(0, 2, 4, 1, 3, 5, 6)
    return x.contiguous().view(-1, c)


def op_gather(x):
    return window_partition(x)


def op_layer_norm_gather(x):
    return window_partition(F.layer_norm(x, (x.shape[-1],), eps=1e-5))


def op_layer_norm_gather_affine(x, w, b):
    return window_partition(F.layer_norm(x, (x.shape[-1],), w, b, eps=1e-5))


def op_gather_index_select(src_ext, idx):
    return torch.index_select(src_ext, 0, idx)


def partition_index(z, h, w):
    """int64 [Zp*Hp*Wp]: for every output token of window_partition, the
    source row of x.view(-1, C), or Z*H*W (the appended zero row) for a pad
    token. torch.roll by -s gives out[i] = in[(i + s) % n]."""
    wz, wh, ww = WINDOW
    zp, hp, wp = ceil_to(z, wz), ceil_to(h, wh), ceil_to(w, ww)
    sz = (torch.arange(zp, device=DEV) + SHIFT[0]) % zp
    sh = (torch.arange(hp, device=DEV) + SHIFT[1]) % hp
    sw = (torch.arange(wp, device=DEV) + SHIFT[2]) % wp
    valid = (sz < z).view(-1, 1, 1) & (sh < h).view(1, -1, 1) & (sw < w).view(1, 1, -1)
    lin = sz.view(-1, 1, 1) * (h * w) + sh.view(1, -1, 1) * w + sw.view(1, 1, -1)
    lin = torch.where(valid, lin, torch.full_like(lin, z * h * w))
    lin = lin.view(zp // wz, wz, hp // wh, wh, wp // ww, ww).permute(0, 2, 4, 1, 3, 5)
    return lin.reshape(-1).contiguous()


def op_bias_gelu(x, b):
    return F.gelu(x + b)  # approximate='none' (erf)


def make_qkv_split(windows, heads):
    scale = HEAD_DIM ** -0.5

    def op_qkv_split(qkv):
        t = qkv.view(windows, TOKENS, 3, heads, HEAD_DIM).permute(2, 0, 3, 1, 4)
        # A pointwise op keeps its input's (permuted) memory layout, so the
        # scaled q needs .contiguous() to land in the compact [N, H, 144, 32]
        # layout the harness writes (in eager that is a second pass).
        q = (t[0] * scale).contiguous()
        k = t[1].contiguous()
        v = t[2].contiguous()
        return q, k, v

    return op_qkv_split


def bias_mask(attn, bias, mask, type_idx, slot_idx):
    n, h, t, _ = attn.shape
    attn = attn + bias[type_idx].view(n, h, t, t)
    attn = attn + mask[slot_idx].view(n, 1, t, t)
    return attn


def op_bias_mask_add(attn, bias, mask, type_idx, slot_idx):
    return bias_mask(attn, bias, mask, type_idx, slot_idx)


def op_bias_mask_softmax(attn, bias, mask, type_idx, slot_idx):
    return torch.softmax(bias_mask(attn, bias, mask, type_idx, slot_idx), dim=-1)


def op_softmax(attn):
    return torch.softmax(attn, dim=-1)


def make_window_attention(windows, heads):
    """Pangu's / Swin's window attention from the qkv Linear output."""
    scale = HEAD_DIM ** -0.5

    def op_window_attention(qkv, bias, mask, type_idx, slot_idx, labels=None):
        t = qkv.view(windows, TOKENS, 3, heads, HEAD_DIM).permute(2, 0, 3, 1, 4)
        q, k, v = t[0] * scale, t[1], t[2]
        attn = bias_mask(q @ k.transpose(-2, -1), bias, mask, type_idx, slot_idx)
        attn = torch.softmax(attn, dim=-1)
        return (attn @ v).transpose(1, 2).reshape(windows * TOKENS, heads * HEAD_DIM)
    return op_window_attention


def make_window_attention_sdpa(windows, heads):
    """(prepare, fn): SDPA with the bias + mask materialised by prepare."""
    def prepare(qkv, bias, mask, type_idx, slot_idx, labels=None):
        t = qkv.view(windows, TOKENS, 3, heads, HEAD_DIM).permute(2, 0, 3, 1, 4)
        am = (bias[type_idx].view(windows, heads, TOKENS, TOKENS)
              + mask[slot_idx].view(windows, 1, TOKENS, TOKENS)).contiguous()
        return (t[0], t[1], t[2], am)

    def op_sdpa(q, k, v, am):
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=am, scale=HEAD_DIM ** -0.5)
        return o.transpose(1, 2).reshape(windows * TOKENS, heads * HEAD_DIM)
    return prepare, op_sdpa


# ---------------------------------------------------------------- cases

class Case:
    """variant, shape string, bytes, a function, and a maker of one input
    set (a tuple of tensors; tensors shared by all sets may be reused)."""

    def __init__(self, variant, shape, nbytes, fn, make_set, extra=None, alt=None):
        self.variant = variant
        self.shape = shape
        self.bytes = nbytes
        self.fn = fn
        self.make_set = make_set
        self.extra = extra or {}
        # Extra implementations, impl -> (prepare, fn): prepare turns an
        # input set into fn's arguments once, outside the timed calls.
        self.alt = alt or {}
        self.wavefuse = None  # wavefuse's kernel on the same tensors (--wavefuse-ptx)


def row_cases():
    out = []
    ln = [(131040, 192), (32760, 384), (521280, 192), (131040, 384)]
    for r, c in ln:
        out.append(Case("layer_norm", f"[{r},{c}]", 4 * r * c, op_layer_norm,
                        lambda r=r, c=c: (randn((r, c), 2.0, 0.25),)))
    r, c = ln[0]
    out.append(Case("layer_norm_affine", f"[{r},{c}]", 4 * r * c + 4 * c, op_layer_norm_affine,
                    lambda r=r, c=c: (randn((r, c), 2.0, 0.25), randn((c,), 0.5, 1.0), randn((c,), 0.5))))
    for r, c in ln:
        out.append(Case("add_layer_norm", f"[{r},{c}]", 8 * r * c, op_add_layer_norm,
                        lambda r=r, c=c: (randn((r, c), 2.0), randn((r, c), 1.0))))
    r, c = ln[0]
    out.append(Case("add_layer_norm_affine", f"[{r},{c}]", 8 * r * c + 4 * c, op_add_layer_norm_affine,
                    lambda r=r, c=c: (randn((r, c), 2.0), randn((r, c), 1.0), randn((c,), 0.5, 1.0),
                                      randn((c,), 0.5))))
    return out


GRIDS = [(8, 91, 180, 192), (8, 181, 360, 192), (8, 91, 180, 384)]


def gather_bytes(z, h, w, c):
    zp, hp, wp = ceil_to(z, WINDOW[0]), ceil_to(h, WINDOW[1]), ceil_to(w, WINDOW[2])
    return 2 * c * (z * h * w) + 2 * c * (zp * hp * wp)


def gather_cases():
    out = []
    for z, h, w, c in GRIDS:
        shape = f"{z}x{h}x{w}x{c}"
        nb = gather_bytes(z, h, w, c)
        out.append(Case("gather", shape, nb, op_gather,
                        lambda z=z, h=h, w=w, c=c: (randn((z, h, w, c)),)))
    for z, h, w, c in GRIDS:
        shape = f"{z}x{h}x{w}x{c}"
        nb = gather_bytes(z, h, w, c)
        holder = {}

        def make(z=z, h=h, w=w, c=c, holder=holder):
            if "idx" not in holder:
                holder["idx"] = partition_index(z, h, w)
            src = torch.empty((z * h * w + 1, c), device=DEV, dtype=F16)
            src[:-1].normal_()
            src[-1].zero_()
            return (src, holder["idx"])

        npad = ceil_to(z, WINDOW[0]) * ceil_to(h, WINDOW[1]) * ceil_to(w, WINDOW[2])
        case = Case("gather_index_select", shape, nb, op_gather_index_select, make,
                    {"index_bytes": 8 * npad})
        case.grid = (z, h, w, c)
        out.append(case)
    for z, h, w, c in GRIDS:
        shape = f"{z}x{h}x{w}x{c}"
        out.append(Case("layer_norm_gather", shape, gather_bytes(z, h, w, c), op_layer_norm_gather,
                        lambda z=z, h=h, w=w, c=c: (randn((z, h, w, c), 2.0, 0.25),)))
    z, h, w, c = GRIDS[0]
    out.append(Case("layer_norm_gather_affine", f"{z}x{h}x{w}x{c}", gather_bytes(z, h, w, c) + 4 * c,
                    op_layer_norm_gather_affine,
                    lambda z=z, h=h, w=w, c=c: (randn((z, h, w, c), 2.0, 0.25), randn((c,), 0.5, 1.0),
                                                randn((c,), 0.5))))
    return out


def bias_gelu_cases():
    out = []
    for r, c in [(521280, 768), (131040, 1536), (131040, 768)]:
        out.append(Case("bias_gelu", f"[{r},{c}]", 4 * r * c + 2 * c, op_bias_gelu,
                        lambda r=r, c=c: (randn((r, c)), randn((c,), 0.5))))
    return out


# (windows, heads, padded grid (Zp, Hp, Wp)) for the attention ops.
ATTN = [(3720, 6, (8, 186, 360)), (960, 12, (8, 96, 180))]


def window_maps(grid):
    """(type_idx, slot_idx, n_types) for the windows of a padded grid."""
    nz, nh, nw = grid[0] // WINDOW[0], grid[1] // WINDOW[1], grid[2] // WINDOW[2]
    iz = torch.arange(nz, device=DEV).view(-1, 1, 1).expand(nz, nh, nw)
    ih = torch.arange(nh, device=DEV).view(1, -1, 1).expand(nz, nh, nw)
    iw = torch.arange(nw, device=DEV).view(1, 1, -1).expand(nz, nh, nw)
    type_idx = (iz * nh + ih).reshape(-1).contiguous()
    slot_idx = (4 * (iz == nz - 1).long() + 2 * (ih == nh - 1).long() + (iw == nw - 1).long()).reshape(-1).contiguous()
    return type_idx, slot_idx, nz * nh


def region_labels(n_slots):
    """(labels, mask): [n_slots, 144] int32 region labels (slot 0 one
    region, as Pangu's inner windows; slot s > 0 tokens in 2 + s % 7 random
    regions) and the f16 mask tile they stand for, [n_slots, 144, 144]: 0
    between tokens of one region, -100 otherwise (Swin's / Pangu's)."""
    regions = torch.tensor([1] + [2 + s % 7 for s in range(1, n_slots)], device=DEV).view(-1, 1)
    labels = (torch.rand((n_slots, TOKENS), device=DEV) * regions).floor().clamp_max(regions - 1)
    labels = labels.to(torch.int32).contiguous()
    mask = torch.where(labels[:, :, None] == labels[:, None, :], 0.0, -100.0).to(F16)
    return labels, mask


def attn_cases():
    out = []
    for n, h, grid in ATTN:
        nz, nh, nw = grid[0] // WINDOW[0], grid[1] // WINDOW[1], grid[2] // WINDOW[2]
        assert nz * nh * nw == n, (grid, n)
        c = 3 * HEAD_DIM * h
        out.append(Case("qkv_split", f"{n}x{h}", 2 * 2 * n * TOKENS * c, make_qkv_split(n, h),
                        lambda n=n, c=c: (randn((n * TOKENS, c)),)))
    tt = TOKENS * TOKENS
    for n, h, grid in ATTN:
        n_types = (grid[0] // WINDOW[0]) * (grid[1] // WINDOW[1])
        nb = 2 * 2 * n * h * tt + 2 * n_types * h * tt + 2 * N_SLOTS * tt
        holder = {}

        def make(n=n, h=h, grid=grid, holder=holder):
            if "maps" not in holder:
                holder["maps"] = window_maps(grid)
            type_idx, slot_idx, n_types = holder["maps"]
            attn = randn((n, h, TOKENS, TOKENS), 2.0)
            bias = randn((n_types, h, TOKENS, TOKENS), 0.5)
            # Swin/Pangu masks hold 0 and -100 (never -inf).
            mask = torch.where(torch.rand((N_SLOTS, TOKENS, TOKENS), device=DEV) < 0.25,
                               -100.0, 0.0).to(F16)
            mask[0].zero_()
            return (attn, bias, mask, type_idx, slot_idx)

        extra = {"n_types": n_types, "n_slots": N_SLOTS}
        out.append(Case("bias_mask_add", f"{n}x{h}", nb, op_bias_mask_add, make, extra))
        out.append(Case("bias_mask_softmax", f"{n}x{h}", nb, op_bias_mask_softmax, make, extra))
        out.append(Case("softmax", f"{n}x{h}", 2 * 2 * n * h * tt, op_softmax,
                        lambda n=n, h=h: (randn((n, h, TOKENS, TOKENS), 2.0),)))
    for n, h, grid in ATTN:
        n_types = (grid[0] // WINDOW[0]) * (grid[1] // WINDOW[1])
        c = HEAD_DIM * h
        nb = 8 * n * TOKENS * c + 2 * n_types * h * tt + 4 * N_SLOTS * TOKENS
        holder = {}

        def make(n=n, h=h, c=c, grid=grid, holder=holder):
            if "maps" not in holder:
                holder["maps"] = window_maps(grid)
            type_idx, slot_idx, n_types = holder["maps"]
            qkv = randn((n * TOKENS, 3 * c))
            bias = randn((n_types, h, TOKENS, TOKENS), 0.5)
            labels, mask = region_labels(N_SLOTS)
            return (qkv, bias, mask, type_idx, slot_idx, labels)

        extra = {"n_types": n_types, "n_slots": N_SLOTS}
        out.append(Case("window_attention", f"{n}x{h}", nb, make_window_attention(n, h), make,
                        extra, alt={"sdpa": make_window_attention_sdpa(n, h)}))
    return out


def all_cases():
    return row_cases() + gather_cases() + bias_gelu_cases() + attn_cases()


# ---------------------------------------------------------------- timing

class Ahead:
    """Queues ~50 ms of GPU spin (torch.cuda._sleep) before a timed loop so
    the CPU runs ahead of the GPU. Calibrated once; disabled if unavailable."""

    def __init__(self, enabled, ms=50.0):
        self.cycles = 0
        if not enabled or not hasattr(torch.cuda, "_sleep"):
            return
        try:
            probe = 1_000_000
            torch.cuda._sleep(probe)  # first call loads the kernel
            torch.cuda.synchronize()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            torch.cuda._sleep(probe)
            b.record()
            torch.cuda.synchronize()
            per_ms = probe / max(a.elapsed_time(b), 1e-3)
            self.cycles = int(per_ms * ms)
        except Exception as e:  # pragma: no cover - device dependent
            log(f"launch-ahead spacer unavailable: {e}")
            self.cycles = 0

    def __call__(self):
        if self.cycles:
            torch.cuda._sleep(self.cycles)

    @property
    def on(self):
        return self.cycles > 0


def time_loop(fn, sets, reps, warmup, ahead):
    n = len(sets)
    for i in range(warmup):
        fn(*sets[i % n])
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ahead()
    for i in range(reps):
        starts[i].record()
        fn(*sets[i % n])
        ends[i].record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends)]


def summary(raw, moved_bytes):
    s = sorted(raw)
    med = percentile(s, 0.5)
    return {
        "median_us": med,
        "p10_us": percentile(s, 0.1),
        "p90_us": percentile(s, 0.9),
        "raw_us": raw,
        "gbps": moved_bytes / (med * 1e-6) / 1e9 if med > 0 else None,
    }


def max_abs_diff(a, b):
    """Largest |a - b| (computed in the tensors' own dtype to spare memory)."""
    if isinstance(a, (tuple, list)):
        return max(max_abs_diff(x, y) for x, y in zip(a, b))
    if a.shape != b.shape:
        return float("inf")
    if a.numel() == 0:
        return 0.0
    return float((a - b).abs().max().float())


def short_error(e):
    msg = f"{type(e).__name__}: {e}"
    lines = [l for l in msg.strip().splitlines() if l.strip()]
    if len(lines) > 12:
        lines = lines[:6] + ["..."] + lines[-5:]
    return "\n".join(lines)[:4000]


def env_fields(l2):
    try:
        import triton  # noqa: F401
        triton_v = triton.__version__
    except Exception:
        triton_v = None
    try:  # CUDA builds only (e.g. 13000 for CUDA 13.0); None elsewhere
        driver = int(torch._C._cuda_getDriverVersion())
    except Exception:
        driver = None
    return {
        "torch": torch.__version__,
        "cuda_driver": driver,
        "triton": triton_v,
        "cuda": torch.version.cuda,
        "hip": getattr(torch.version, "hip", None),
        "device": torch.cuda.get_device_name(0),
        "l2_bytes": l2,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def finite(v):
    """JSON-safe: non-finite floats become strings ("nan", "inf")."""
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    if isinstance(v, list):
        return [finite(x) for x in v]
    return v


def reset_compiler():
    try:
        importlib.import_module("torch._dynamo").reset()
    except Exception:
        pass


def run_case(case, impls, args, l2, ahead, env, emit):
    sets_n = n_sets(l2, case.bytes)
    base = {"variant": case.variant, "shape": case.shape, "bytes": case.bytes,
            "dtype": "f16", "sets": sets_n, "reps": args.reps, "warmup": args.warmup,
            "launch_ahead": ahead.on}
    base.update(case.extra)

    def rec(impl, **kw):
        r = dict(base)
        r["impl"] = impl
        r.update({"median_us": None, "p10_us": None, "p90_us": None, "raw_us": [], "gbps": None})
        r.update(kw)
        r.update(env)
        r["date"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        emit(r)
        return r

    try:
        torch.manual_seed(0x5EED)
        sets = []
        for s in range(sets_n):
            torch.manual_seed(0x5EED ^ s)
            sets.append(case.make_set())
        torch.cuda.synchronize()
    except Exception as e:
        err = short_error(e)
        log(f"  setup failed: {err}")
        for impl in impls + ["copy"]:
            rec(impl, error="setup: " + err)
        return

    ref = None
    for impl in impls:
        if impl == "wavefuse" and case.wavefuse is None:
            continue
        t0 = time.time()
        try:
            if impl == "eager":
                fn = case.fn
                first_s = None
            elif impl == "wavefuse":
                fn = case.wavefuse
                first_s = None
            else:
                reset_compiler()
                if impl == "compile":
                    fn = torch.compile(case.fn, dynamic=False)
                else:
                    fn = torch.compile(case.fn, mode="max-autotune-no-cudagraphs", dynamic=False)
                fn(*sets[0])  # compiles
                torch.cuda.synchronize()
                first_s = time.time() - t0
            out0 = fn(*sets[0])
            torch.cuda.synchronize()
            extra = {}
            if impl == "eager":
                ref = out0
                if case.variant == "gather_index_select":
                    # The index path must produce exactly the pad/roll/partition output.
                    z, h, w, c = case.grid
                    want = op_gather(sets[0][0][:-1].view(z, h, w, c))
                    extra["matches_gather"] = bool(torch.equal(out0, want))
                    del want
            elif ref is not None:
                extra["max_abs_diff_vs_eager"] = max_abs_diff(out0, ref)
            del out0
            raw = time_loop(fn, sets, args.reps, args.warmup, ahead)
            r = rec(impl, compile_s=first_s, **extra, **summary(raw, case.bytes))
            log(f"  {impl:<22} {r['median_us']:10.1f} us  {r['gbps']:8.0f} GB/s"
                + (f"  (compile {first_s:.1f} s)" if first_s else "")
                + ("" if extra.get("matches_gather", True) else "  INDEX MISMATCH"))
        except Exception as e:
            err = short_error(e)
            if args.verbose:
                traceback.print_exc()
            log(f"  {impl:<22} FAILED: {err.splitlines()[0] if err else ''}")
            rec(impl, error=err, compile_s=time.time() - t0)
            reset_compiler()
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        if impl == "eager":
            # The same-byte copy, measured right after eager in the same run.
            try:
                half = -(-(case.bytes // 2) // 2)
                cs = [(torch.empty(half, device=DEV, dtype=F16),
                       torch.full((half,), 1.5, device=DEV, dtype=F16)) for _ in range(sets_n)]
                raw = time_loop(lambda d, s: d.copy_(s), cs, args.reps, args.warmup, ahead)
                del cs
                r = rec("copy", copy_bytes=4 * half, **summary(raw, 4 * half))
                log(f"  {'copy':<22} {r['median_us']:10.1f} us  {r['gbps']:8.0f} GB/s")
            except Exception as e:
                err = short_error(e)
                log(f"  copy FAILED: {err}")
                rec("copy", error=err)
            torch.cuda.empty_cache()
    for impl, (prepare, fn) in case.alt.items():
        try:
            alt_sets = [prepare(*st) for st in sets]
            out0 = fn(*alt_sets[0])
            torch.cuda.synchronize()
            extra = {} if ref is None else {"max_abs_diff_vs_eager": max_abs_diff(out0, ref)}
            del out0
            raw = time_loop(fn, alt_sets, args.reps, args.warmup, ahead)
            del alt_sets
            r = rec(impl, **extra, **summary(raw, case.bytes))
            log(f"  {impl:<22} {r['median_us']:10.1f} us  {r['gbps']:8.0f} GB/s")
        except Exception as e:
            err = short_error(e)
            log(f"  {impl:<22} FAILED: {err.splitlines()[0] if err else ''}")
            rec(impl, error=err)
        torch.cuda.empty_cache()
    del ref, sets
    reset_compiler()
    torch.cuda.empty_cache()


def attach_wavefuse(cases, ptx):
    import wf_launch
    drv = wf_launch.Driver(ptx)
    for c in cases:
        if c.variant == "add_layer_norm":
            c.wavefuse = wf_launch.add_layer_norm(drv)
        elif c.variant == "gather":
            z, h, w, _ = (int(v) for v in c.shape.split("x"))
            lin = partition_index(z, h, w)
            table = torch.where(lin == z * h * w, torch.full_like(lin, -1), lin).to(torch.int32)
            c.wavefuse = wf_launch.gather(drv, table.contiguous())
        elif c.variant == "window_attention":
            n, h = (int(v) for v in c.shape.split("x"))
            c.wavefuse = wf_launch.window_attention(drv, n, h, c.extra["n_types"], c.extra["n_slots"])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="peers.jsonl", help="JSON lines output (default peers.jsonl)")
    ap.add_argument("--only", default=None, help="run variants whose name contains SUBSTRING")
    ap.add_argument("--quick", action="store_true", help="fewer reps (20) and warm-ups (3)")
    ap.add_argument("--no-compile", action="store_true", help="eager and copy only")
    ap.add_argument("--no-autotune", action="store_true",
                    help="skip torch.compile(mode='max-autotune-no-cudagraphs') (its autotuning takes minutes)")
    ap.add_argument("--reps", type=int, default=None, help="timed launches (default 100, --quick 20)")
    ap.add_argument("--warmup", type=int, default=None, help="warm-up launches (default 10, --quick 3)")
    ap.add_argument("--no-launch-ahead", action="store_true",
                    help="no torch.cuda._sleep spacer before each timed loop")
    ap.add_argument("--wavefuse-ptx", default=None, metavar="PTX",
                    help="also time wavefuse's add_layer_norm, gather and window_attention kernels from this PTX "
                         "in this process, on the same tensors (impl 'wavefuse')")
    ap.add_argument("--list", action="store_true", help="list the cases and exit (no GPU needed)")
    ap.add_argument("--verbose", action="store_true", help="full tracebacks on failures")
    args = ap.parse_args(argv)
    if args.reps is None:
        args.reps = 20 if args.quick else 100
    if args.warmup is None:
        args.warmup = 3 if args.quick else 10

    cases = [c for c in all_cases() if args.only is None or args.only in c.variant]
    if args.list:
        for c in cases:
            print(f"{c.variant:<22} {c.shape:<18} {c.bytes:>12} bytes")
        return 0
    if not torch.cuda.is_available():
        log("no GPU visible to PyTorch (torch.cuda.is_available() is False)")
        return 1
    # Inference only; set once so compiled graphs are not re-guarded on grad mode.
    torch.set_grad_enabled(False)
    impls = ["eager"] if args.no_compile else ["eager", "compile", "compile_max_autotune"]
    if args.no_autotune and "compile_max_autotune" in impls:
        impls.remove("compile_max_autotune")
    if args.wavefuse_ptx:
        try:
            attach_wavefuse(cases, args.wavefuse_ptx)
            impls.append("wavefuse")
        except Exception as e:
            log(f"--wavefuse-ptx: not loaded, timing the peers only: {short_error(e)}")
    props = torch.cuda.get_device_properties(0)
    l2 = int(getattr(props, "L2_cache_size", 0) or 0)
    try:
        cfg = importlib.import_module("torch._dynamo").config
        cfg.cache_size_limit = max(64, cfg.cache_size_limit)
    except Exception:
        pass
    env = env_fields(l2)
    ahead = Ahead(not args.no_launch_ahead)
    log(f"device: {env['device']}, L2 {l2 / 2**20:.1f} MiB, torch {env['torch']}, "
        f"triton {env['triton']}, launch-ahead {'on' if ahead.on else 'off'}, "
        f"{len(cases)} case(s) x {impls + ['copy']}, reps {args.reps}")

    n_err = 0
    with open(args.out, "w") as f:
        def emit(r):
            nonlocal n_err
            if r.get("error"):
                n_err += 1
            f.write(json.dumps({k: finite(v) for k, v in r.items()}) + "\n")
            f.flush()

        for i, case in enumerate(cases):
            log(f"[{i + 1}/{len(cases)}] {case.variant} {case.shape} "
                f"({case.bytes / 1e6:.1f} MB, {n_sets(l2, case.bytes)} sets)")
            run_case(case, impls, args, l2, ahead, env, emit)
    log(f"wrote {args.out}" + (f" ({n_err} failed record(s))" if n_err else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
