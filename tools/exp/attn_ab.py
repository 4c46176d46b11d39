"""A/B timing of window-attention PTX builds in one process on one GPU.

    python3 attn_ab.py NAME=PATH.ptx[@BYTES][%THREADS][#1d|#2d|#2h] [...] [--qkv-bias] [--compile]
                       [--slot-maps] [--reps N] [--out FILE.jsonl]

A build is an sm_90 PTX of the device crate (`host/kernels/sm_90.ptx` of a
commit, or `cargo xtask kernels` in a worktree). For each build, both
entries (`wf_window_attention_mask_144`, `wf_window_attention_144`) run at
Pangu's 3720 windows x 6 heads and 960 x 12 (benches/peers.py's ATTN
cases, its window -> type and slot maps and region labels) on the same
tensors, with `--qkv-bias` also with a random QKV bias [3C]. Each timing
is the median of N launches over two input sets, queued behind a sleep
kernel (peers.py's method); a same-byte device copy is timed in the same
process, and `--compile` adds torch.compile of PyTorch's unfused chain.
`--slot-maps` also times each build's masked entry with every window in
slot 0 (one region: no window masked) and with every window masked (slot
`1 + w % 7`), to split the entry's time by window kind (BENCHMARKS.md,
twentieth session).

Every variant's output is checked once against the f64 attention of 40
windows and 24 masked ones, with the bound of window_attention's module
docs (the sixteenth session's terms: the weights normalised by their own
rounded sum, BENCHMARKS.md), as "max err/bound" (above 1: a wrong kernel). With a
QKV bias the reference adds it as the kernel does, f16(x + b).

`@BYTES` launches that build with BYTES of workgroup memory instead of
wf_launch.ATTN_SHARED_BYTES (a build whose geometry differs); `%THREADS`
launches it with THREADS threads per workgroup instead of
wf_launch.ATTN_WAVES * 32. Builds are
launched on a grid of (heads, windows) workgroups (the kernel reads its
head and window from the block's x and y; `#2d` says so explicitly);
`#1d` launches windows * heads workgroups (a build from before the
eighteenth session, which divides the block index by the head count);
`#2h` launches (heads / 2, windows) workgroups (the twenty-eighth
session's two-heads-per-workgroup probe). Each build's entries first report how many workgroups of the launch's
size stay resident per SM (the CUDA occupancy calculator).

The fourteenth session's runs x1-x4 and G3 (BENCHMARKS.md) used this
script's predecessor, which read a JSON list of variants and a zero QKV
bias; the launches, data and bound are the same. First run as is: the
fifteenth session's persistent-workgroup experiment (BENCHMARKS.md).
"""
import argparse
import ctypes
import json
import os
import sys

import torch

here = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [here, os.path.join(here, "..", "..", "benches")]
import peers  # noqa: E402
import wf_launch  # noqa: E402

T, HD = 144, 32
ENTRIES = (("mask", "wf_window_attention_mask_144"), ("nomask", "wf_window_attention_144"))


def log(*a):
    print(*a, flush=True)


def ulp16(x):
    a = x.abs().clamp_min(2.0 ** -14)
    return torch.exp2(torch.floor(torch.log2(a)) - 10)


def reference(qkv, bias, mask, ty, sl, windows, heads, sub):
    """f64 attention of the windows `sub` and the contract's bound."""
    x = qkv.view(windows, T, 3, heads, HD)[sub].double().permute(2, 0, 3, 1, 4)
    q, k, v = x[0], x[1], x[2]
    scale = float(torch.tensor(HD ** -0.5, dtype=torch.float32))
    b = bias[ty[sub]].double()
    m = mask[sl[sub]].double().unsqueeze(1)
    z = q @ k.transpose(-2, -1) * scale + m + b
    mx, arg = z.max(-1, keepdim=True)
    e = torch.exp(z - mx)
    se = e.sum(-1, keepdim=True)
    p = e / se
    out = p @ v
    big_m = p @ v.abs()
    # Score error: the f32 accumulation of q.k on the matrix unit, the
    # bias in units of 1/scale as two f16 parts, the mask's f16 rounding.
    dz = (2.0 ** -17 * scale * (q.abs() @ k.abs().transpose(-2, -1))
          + 2.0 ** -22 * (m.abs() + b.abs() + z.abs())
          + 2.0 ** -17 * b.abs() + 2.0 ** -11 * m.abs())
    # The weights' f16 rounding moves their mean by their share of v - out
    # (the rounded weights' own sum normalises them), plus the f32 sums.
    dev = (v.unsqueeze(-3) - out.unsqueeze(-2)).abs()  # [.., i, j, d]
    rounding = (1 + 2.0 ** -10) * (2.0 ** -11 * (p.unsqueeze(-1) * dev).sum(-2)
                                   + 2.0 ** -25 * dev.sum(-2) / se)
    tol = (0.5 * ulp16(out) + rounding + 2.0 ** -16 * (big_m + out.abs()) + (p * dz) @ v.abs()
           + big_m * (dz.gather(-1, arg) + 2.0 ** -22 * mx.abs()))
    return out.permute(0, 2, 1, 3), tol.permute(0, 2, 1, 3)


def check(name, got, ref, tol, windows, heads, sub):
    g = got.view(windows, T, heads, HD)[sub].double()
    err = (g - ref).abs()
    ratio = err / tol
    r = dict(max_ratio=float(ratio.max()), frac_over=float((ratio > 1).double().mean()),
             max_abs=float(err.max()), nan=int(torch.isnan(g).sum()))
    log(f"    {name:<28} max err/bound {r['max_ratio']:.3f}  over {r['frac_over']:.2e}  "
        f"max abs {r['max_abs']:.3e}  nan {r['nan']}")
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("builds", nargs="+", metavar="NAME=PATH.ptx")
    ap.add_argument("--qkv-bias", action="store_true", help="also each entry with a random QKV bias")
    ap.add_argument("--compile", action="store_true", help="also torch.compile of PyTorch's chain")
    ap.add_argument("--reps", type=int, default=50, help="timed launches per variant (default 50)")
    ap.add_argument("--out", default=None, help="JSON lines: one record per variant and shape")
    ap.add_argument("--slot-maps", action="store_true",
                    help="also each build's masked entry with every window in slot 0 (one region: no mask) "
                         "and with every window masked (slot 1 + w % 7)")
    args = ap.parse_args()
    torch.set_grad_enabled(False)
    builds = []
    drivers = {}
    for b in args.builds:
        name, _, path = b.partition("=")
        path, _, grid = path.partition("#")
        path, _, threads = path.partition("%")
        path, _, shared = path.partition("@")
        if not path or grid not in ("", "1d", "2d", "2h"):
            ap.error(f"{b}: expected NAME=PATH.ptx[@BYTES][%THREADS][#1d|#2d|#2h]")
        key = (path, shared, threads, grid)
        if key not in drivers:
            drivers[key] = wf_launch.Driver(path)
            drivers[key].shared = int(shared) if shared else wf_launch.ATTN_SHARED_BYTES
            drivers[key].threads = int(threads) if threads else wf_launch.ATTN_WAVES * 32
            drivers[key].grid = grid
        builds.append((name, drivers[key]))
    ahead = peers.Ahead(True)
    for (path, *_), drv in drivers.items():
        for _, entry in ENTRIES:
            n = ctypes.c_int()
            f = drv.func(entry)
            drv.cu.cuFuncSetAttribute(f, wf_launch.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                      ctypes.c_int(drv.shared))
            drv._check(drv.cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(
                ctypes.byref(n), f, ctypes.c_int(drv.threads),
                ctypes.c_size_t(drv.shared)), "cuOccupancyMaxActiveBlocksPerMultiprocessor")
            log(f"{path} {entry}: {n.value} workgroups per SM resident")

    def emit(**r):
        if args.out:
            with open(args.out, "a") as f:
                f.write(json.dumps(r) + "\n")

    def timeit(fn, sets):
        raw = peers.time_loop(fn, sets, args.reps, 5, ahead)
        return peers.percentile(sorted(raw), 0.5), raw

    for windows, heads, grid in peers.ATTN:
        shape = f"{windows}x{heads}"
        ty, sl, n_types = peers.window_maps(grid)
        c = heads * HD
        sets = []
        for s in range(2):
            torch.manual_seed(0x5EED ^ s)
            qkv = peers.randn((windows * T, 3 * c))
            bias = peers.randn((n_types, heads, T, T), 0.5)
            labels, mask = peers.region_labels(peers.N_SLOTS)
            sets.append((qkv, bias, mask, ty, sl, labels))
        qb = peers.randn((3 * c,), 0.5)
        nbytes = 8 * windows * T * c + 2 * n_types * heads * T * T + 4 * peers.N_SLOTS * T
        log(f"== {shape}: {nbytes / 1e6:.1f} MB")
        sub = torch.cat([torch.arange(40, device="cuda"), torch.nonzero(sl != 0).flatten()[:24]]).unique()
        qkv0, bias0, mask0 = sets[0][:3]
        refs = {}
        for with_qb in (False, True) if args.qkv_bias else (False,):
            x = (qkv0 + qb) if with_qb else qkv0  # f16 + f16 -> f16, rounded: the kernel's f16(x + b)
            refs[with_qb] = {"mask": reference(x, bias0, mask0, ty, sl, windows, heads, sub),
                             "nomask": reference(x, bias0, torch.zeros_like(mask0), ty, sl, windows, heads, sub)}
        slot_maps = []
        if args.slot_maps:
            w_idx = torch.arange(windows, device="cuda")
            for tag, sl_v in (("s0", torch.zeros_like(sl)), ("sall", 1 + w_idx % 7)):
                slot_maps.append((tag, [st[:4] + (sl_v,) + st[5:] for st in sets],
                                  reference(qkv0, bias0, mask0, ty, sl_v, windows, heads, sub)))

        def measure(name, fn, sets_v, ref_tol):
            """Checks `fn`'s output on the first set against `ref_tol`, then times it."""
            try:
                out = fn(*sets_v[0])
                torch.cuda.synchronize()
                a = check(name, out, *ref_tol, windows, heads, sub)
                del out
                med, raw = timeit(fn, sets_v)
                log(f"    {name:<28} {med:9.1f} us  {nbytes / med / 1e3:7.0f} GB/s")
                emit(kind="time", shape=shape, impl=name, median_us=med, raw_us=raw, bytes=nbytes, **a)
            except Exception as e:  # a failed variant must not hide the others
                log(f"    {name} FAILED: {type(e).__name__}: {e}")
                emit(kind="error", shape=shape, impl=name, error=f"{type(e).__name__}: {e}")
            torch.cuda.empty_cache()

        for bname, drv in builds:
            for with_qb in refs:
                for kind, entry in ENTRIES:
                    fn = wf_launch.window_attention(drv, windows, heads, n_types, peers.N_SLOTS, name=entry,
                                                    qkv_bias=qb if with_qb else None)
                    measure(f"{bname}_{kind}" + ("_qb" if with_qb else ""), fn, sets, refs[with_qb][kind])
            for tag, sets_v, ref_tol in slot_maps:
                fn = wf_launch.window_attention(drv, windows, heads, n_types, peers.N_SLOTS, name=ENTRIES[0][1])
                measure(f"{bname}_mask_{tag}", fn, sets_v, ref_tol)
        half = -(-(nbytes // 2) // 2)
        cs = [(torch.empty(half, device="cuda", dtype=torch.float16),
               torch.full((half,), 1.5, device="cuda", dtype=torch.float16)) for _ in range(2)]
        med, raw = timeit(lambda d, s: d.copy_(s), cs)
        log(f"    {'copy':<28} {med:9.1f} us")
        emit(kind="time", shape=shape, impl="copy", median_us=med, raw_us=raw, bytes=4 * half)
        del cs
        if args.compile:
            chain = torch.compile(peers.make_window_attention(windows, heads), dynamic=False)
            out = chain(*sets[0])
            torch.cuda.synchronize()
            ref, tol = refs[False]["mask"]
            a = check("torch.compile chain", out, ref, tol, windows, heads, sub)
            del out
            med, raw = timeit(chain, sets)
            log(f"    {'torch.compile chain':<28} {med:9.1f} us")
            emit(kind="time", shape=shape, impl="compile", median_us=med, raw_us=raw, bytes=nbytes, **a)
        del sets, refs, slot_maps
        torch.cuda.empty_cache()
    log("done")


if __name__ == "__main__":
    main()
