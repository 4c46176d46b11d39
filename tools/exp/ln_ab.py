"""A/B timing of LayerNorm-family PTX builds in one process on one GPU.

    python3 ln_ab.py NAME=PATH.ptx[@bN[+aM[+r2][+sK][+gR]]] [NAME=PATH.ptx ...] [--reps N] [--rounds R]

`@bN`: the build's affine LayerNorm and LayerNorm+gather entries run in
N-thread workgroups (wavefuse_shared::ln_block; 64 since the eleventh
session, ROW_BLOCK before); `+aM`: its affine add+LayerNorm entry of width
192 in M-thread workgroups (AddLnShape::for_entry; 128 since then), with
`+r2` two rows per 32-lane group (tried in the eleventh session); `+sK`:
its affine LayerNorm and LayerNorm+gather entries get K bytes of
workgroup memory per thread (`+s`: 16, the twenty-third session's
wavefuse_shared::LN_PARK_BYTES, where they park the row sums; 24 since the
twenty-fourth, `+s24`, the sum and tier 1's root and K). Without
them a build gets the geometry of the kernels before (b82904f's `old`).

`+gR`: the build's affine LayerNorm+gather entries take R rows per row
group, the grid divided by R (the twenty-fifth session's pipelined
probe).

`--table identity` / `--table nopad` replace the gather cases' window
partition (Pangu's, with -1 padding rows) by `t -> t` over the source
rows, or by the partition with its padding rows dropped (the twenty-fifth
session: the gap of LayerNorm+gather is not its table).

Every build's kernels run on the same tensors (input sets rotated past the
L2), interleaved build by build and round by round; each timing is the
median of N launches measured by CUDA events, the launches queued behind a
sleep kernel so that the host's launch rate cannot show. Each build's
outputs are checked once per case against an f64 LayerNorm of the same f16
input (max error in f16 ulps; `y` and, for add+LN, the residual bits).
Launch geometry mirrors wavefuse_shared (RowLayout::for_width, AddLnShape,
ROW_BLOCK = 256 threads, the flags above); a wrong geometry fails the
check.
"""
import argparse
import ctypes
import os
import statistics
import sys

import torch

# The PTX loader and launcher of benches/wf_launch.py (copy it next to this
# file where the repository is not at hand).
here = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [here, os.path.join(here, "..", "..", "benches")]
from wf_launch import ROW_BLOCK, Driver  # noqa: E402

LANES = {192: 8, 384: 16, 768: 32}
EPS = 1e-5
L2_BYTES = 50 << 20
# Set by --affine-all: affine cases of every family and width.
AFFINE_ALL = False
# Set by --beta-scale: beta ~ N(0, BETA_SCALE), gamma ~ N(1, 0.5).
BETA_SCALE = 0.5
# Set by --table: the gather's index table (partition, identity, nopad).
TABLE = "partition"


def p(t):
    return ctypes.c_uint64(t.data_ptr() if t is not None else 0)


def u64(v):
    return ctypes.c_uint64(v)


def partition_table(z, h, w, wz=2, wh=6, ww=12):
    """Pangu's window partition (no shift): output token order (window, token
    in window); -1 where the padded grid has no source token."""
    hp, wp = -(-h // wh) * wh, -(-w // ww) * ww
    zi = torch.arange(z).view(z // wz, wz, 1, 1, 1, 1)
    hi = torch.arange(hp).view(1, 1, hp // wh, wh, 1, 1)
    wi = torch.arange(wp).view(1, 1, 1, 1, wp // ww, ww)
    zi, hi, wi = torch.broadcast_tensors(zi, hi, wi)
    src = (zi * h + hi) * w + wi
    src = torch.where((hi < h) & (wi < w), src, torch.full_like(src, -1))
    # (Z', wz, H', wh, W', ww) -> (Z', H', W', wz, wh, ww)
    return src.permute(0, 2, 4, 1, 3, 5).reshape(-1).to(torch.int32)


def ln_ref(x64, g, b):
    # Deviations from the exact row sum (W x - S) / W: a mean rounded to
    # f64 leaves 2^-53 |mean| in each, visible in an affine output near 0.
    w = x64.shape[-1]
    s = x64.sum(-1, keepdim=True)
    d = (w * x64 - s) / w
    v = (d ** 2).mean(-1, keepdim=True)
    y = d / torch.sqrt(v + EPS)
    if g is not None:
        y = y * g.double() + b.double()
    return y


def ulps(got, ref64):
    """max |got - ref| in f16 ulps of the reference (2^-24 below normal)."""
    r = ref64.abs().clamp(min=2.0 ** -14)
    ulp = torch.exp2(torch.floor(torch.log2(r)) - 10)
    return ((got.double() - ref64).abs() / ulp).max().item()


def cases(dev):
    out = []
    for rows, w in [(131040, 192), (32760, 384), (521280, 192), (131040, 384)]:
        out.append(("layer_norm", (rows, w), False))
    out.append(("layer_norm", (131040, 192), True))
    if AFFINE_ALL:
        for rows, w in [(32760, 384), (521280, 192), (131040, 384), (32760, 768)]:
            out.append(("layer_norm", (rows, w), True))
        for rows, w in [(131040, 192), (32760, 384), (32760, 768)]:
            out.append(("add_layer_norm", (rows, w), True))
        for g in [(8, 91, 180, 192), (8, 91, 180, 384)]:
            out.append(("layer_norm_gather", g, True))
            out.append(("add_layer_norm_gather", g, True))
    for rows, w in [(131040, 192), (32760, 384), (521280, 192), (131040, 384)]:
        out.append(("add_layer_norm", (rows, w), False))
    for g in [(8, 91, 180, 192), (8, 181, 360, 192), (8, 91, 180, 384)]:
        out.append(("layer_norm_gather", g, False))
    for g in [(8, 91, 180, 192), (8, 181, 360, 192), (8, 91, 180, 384)]:
        out.append(("add_layer_norm_gather", g, False))
    return out


def make(kind, shape, affine, dev):
    """(bytes moved, input sets, launch(mod, set) -> outputs, check(set, outputs) -> ulps)."""
    if kind in ("layer_norm", "add_layer_norm"):
        rows, w = shape
        table = None
    else:
        z, h, ww_, w = shape
        rows = z * h * ww_
        table = partition_table(z, h, ww_).to(dev)
        if TABLE == "identity":
            table = torch.arange(rows, dtype=torch.int32, device=dev)
        elif TABLE == "nopad":
            table = table[table >= 0].contiguous()
    n_out = table.numel() if table is not None else rows
    g = (torch.randn(w, device=dev) * 0.5 + 1).half() if affine else None
    b = (torch.randn(w, device=dev) * BETA_SCALE).half() if affine else None
    two = kind.startswith("add")
    per_set = rows * w * 2 * (2 if two else 1) + n_out * w * 2 + (rows * w * 2 if two else 0)
    nsets = max(2, -(-3 * L2_BYTES // per_set))
    sets = []
    for _ in range(nsets):
        x = (torch.randn(rows, w, device=dev) * 2 + 0.5).half()
        br = (torch.randn(rows, w, device=dev)).half() if two else None
        sets.append({"x": x, "br": br, "y": torch.empty(n_out, w, device=dev, dtype=torch.half),
                     "r": torch.empty_like(x) if two else None})
    suffix = ("_affine" if affine else "") + f"_{w}"

    def launch(mod, s):
        lanes = LANES[w]
        # Builds marked @b128 launch these entries in 128-thread workgroups.
        blk = getattr(mod, "blk", ROW_BLOCK) if affine and kind in ("layer_norm", "layer_norm_gather") else ROW_BLOCK
        if kind == "layer_norm":
            mod.launch("wf_layer_norm" + suffix, -(-rows // (blk // lanes)), blk,
                       [p(s["x"]), p(s["y"]), p(g), p(b), u64(rows), ctypes.c_float(EPS)],
                       shared=getattr(mod, "shm", 0) * blk if affine else 0)
        elif kind == "add_layer_norm":
            per_block, block = (2, 32) if w == 384 else (ROW_BLOCK // 32, ROW_BLOCK)
            if affine and w == 192 and hasattr(mod, "ablk"):
                per_block, block = mod.ablk // 32 * getattr(mod, "arows", 1), mod.ablk
            mod.launch("wf_add_layer_norm" + suffix, -(-rows // per_block), block,
                       [p(s["x"]), p(s["br"]), p(s["r"]), p(s["y"]), p(g), p(b), u64(rows),
                        ctypes.c_float(EPS)])
        elif kind == "layer_norm_gather":
            rg = getattr(mod, "rows", 1) if affine else 1
            mod.launch("wf_layer_norm_gather" + suffix, -(-n_out // (blk // lanes * rg)), blk,
                       [p(s["x"]), p(table), p(s["y"]), p(g), p(b), u64(n_out), u64(rows),
                        ctypes.c_float(EPS)], shared=getattr(mod, "shm", 0) * blk if affine else 0)
        else:
            mod.launch("wf_add_layer_norm_gather" + suffix, -(-n_out // (ROW_BLOCK // lanes)), ROW_BLOCK,
                       [p(s["x"]), p(s["br"]), p(s["r"]), p(table), p(s["y"]), p(g), p(b), u64(n_out),
                        u64(rows), ctypes.c_float(EPS)])

    def check(s):
        src = s["x"]
        res = {}
        if two:
            rsum = (s["x"].float() + s["br"].float()).half()
            res["residual_bits_equal"] = bool(torch.equal(rsum, s["r"]))
            src = rsum
        x64 = src.double()
        if table is not None:
            idx = table.long()
            rows64 = torch.zeros(n_out, w, dtype=torch.float64, device=dev)
            ok = idx >= 0
            rows64[ok] = x64[idx[ok]]
            ref = ln_ref(rows64, g, b)
            ref[~ok] = 0.0
        else:
            ref = ln_ref(x64, g, b)
        res["max_ulp"] = round(ulps(s["y"], ref), 3)
        return res

    nbytes = per_set
    return nbytes, sets, launch, check


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("builds", nargs="+")
    ap.add_argument("--reps", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", default="")
    ap.add_argument("--affine-all", action="store_true")
    ap.add_argument("--beta-scale", type=float, default=0.5)
    ap.add_argument("--table", default="partition")
    a = ap.parse_args()
    global AFFINE_ALL, BETA_SCALE, TABLE
    AFFINE_ALL, BETA_SCALE, TABLE = a.affine_all, a.beta_scale, a.table
    dev = torch.device("cuda")
    mods = []
    for spec in a.builds:
        name, path = spec.split("=", 1)
        d = Driver(path.split("@")[0])
        if "@b" in path:
            d.blk = int(path.split("@b")[1].split("+")[0])
        if "+a" in path:
            d.ablk = int(path.split("+a")[1].split("+")[0])
        if "+r2" in path:
            d.arows = 2
        if "+g" in path:
            d.rows = int(path.split("+g")[1].split("+")[0])
        if "+s" in path:
            k = path.split("+s")[1].split("+")[0]
            d.shm = int(k) if k else 16
        mods.append((name, d))
    print("gpu:", torch.cuda.get_device_name(), "| torch", torch.__version__)
    torch.manual_seed(0)
    names = [n for n, _ in mods]
    print("| case | " + " | ".join(f"{n} µs (rounds)" for n in names) + " | "
          + " | ".join(f"{n}/{names[0]}" for n in names[1:]) + " | max ulp | GB/s (" + names[-1] + ") |")
    print("|---|" + "---:|" * (2 * len(names) - 1) + "---|---:|")
    for kind, shape, affine in cases(dev):
        label = f"{kind}{'_affine' if affine else ''} {list(shape)}"
        if a.only and a.only not in label:
            continue
        nbytes, sets, launch, check = make(kind, shape, affine, dev)
        checks = {}
        for name, mod in mods:
            for s in sets:
                s["y"].fill_(float("nan"))
                if s["r"] is not None:
                    s["r"].fill_(float("nan"))
            launch(mod, sets[0])
            torch.cuda.synchronize()
            checks[name] = check(sets[0])
        times = {n: [] for n in names}
        for _ in range(a.rounds):
            for name, mod in mods:
                for i in range(5):
                    launch(mod, sets[i % len(sets)])
                ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                      for _ in range(a.reps)]
                torch.cuda._sleep(int(2e7))
                for i, (e0, e1) in enumerate(ev):
                    e0.record()
                    launch(mod, sets[i % len(sets)])
                    e1.record()
                torch.cuda.synchronize()
                times[name].append(statistics.median(e0.elapsed_time(e1) * 1e3 for e0, e1 in ev))
        med = {n: statistics.median(t) for n, t in times.items()}
        cells = [f"{med[n]:.2f} ({' / '.join(f'{t:.2f}' for t in times[n])})" for n in names]
        ratios = [f"{med[n] / med[names[0]]:.3f}" for n in names[1:]]
        ck = "; ".join(f"{n}: {c}" for n, c in checks.items())
        print(f"| {label} | " + " | ".join(cells) + " | " + " | ".join(ratios)
              + f" | {ck} | {nbytes / med[names[-1]] / 1e3:.0f} |", flush=True)
        del sets


if __name__ == "__main__":
    main()
