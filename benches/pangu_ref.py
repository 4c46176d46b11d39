#!/usr/bin/env python3
"""The Pangu-Weather stage in plain PyTorch: the reference for the candle stage.

Two Earth-specific blocks (unshifted, shifted by (1, 3, 6)), written step by
step as the public Pangu pseudocode spells them: zero pad, roll, reshape/permute
window partition, QKV Linear, q scale, q @ k^T, earth-specific bias (the
pseudocode's position-index table, one bias per window type), the
shifted-window mask, softmax, @ v, output Linear, reverse partition, roll back,
crop, residual, MLP (Linear, exact GELU, Linear), residual. `--order post`
(default, the released weights): LayerNorm after the attention and after the
MLP, inside the residual, and the mask along level and latitude only;
`--order pre` (the profiled student model): LayerNorm before each, Swin's
three-axis mask. pangu_stage takes the same flag.

Commands (needs only torch; no network, no safetensors package, no Rust):
  pangu_ref.py gen   --dir D [--scales s1,s2] [--seed N]
      seeded random weights + input, rounded to f16, written once as
      D/pangu_<scale>.safetensors (the names pangu/src/stage/weights.rs reads)
  pangu_ref.py check --dir D [--scales s1,s2]
      gate 2: max and RMS error against the f32 reference of PyTorch's own
      f16 output and of every candle output D/out_<build>_<scale>.safetensors
      (tensor `y`: the stage; `y_block0`: the first block alone)
  pangu_ref.py bench --dir D [--scales s1,s2] [--modes eager,default,max-autotune]
      per stage and per block: CUDA-event medians, device-memory high-water mark
All commands append JSON lines to D/pangu_ref.jsonl.
"""
import argparse
import json
import math
import os
import struct
import sys
import time

import torch
import torch.nn.functional as F

WINDOW = (2, 6, 12)
SHIFT = (1, 3, 6)
HEAD_DIM = 32
EPS = 1e-5
MASK_NEG = -100.0  # Swin's value; the kernels' planner uses the same

SCALES = {
    # name: (grid (Z, H, W), dim, heads)
    "s1": ((8, 181, 360), 192, 6),
    "s2": ((8, 91, 180), 384, 12),
    "tiny": ((4, 7, 24), 64, 2),
    "tiny192": ((4, 7, 24), 192, 6),
}

# ---------------------------------------------------------------- safetensors
_DT = {torch.float16: "F16", torch.float32: "F32", torch.int64: "I64"}
_TD = {v: k for k, v in _DT.items()}


def save_safetensors(path, tensors):
    """The safetensors format by hand (the GPU host may lack the package)."""
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous().cpu()
        b = t.view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": _DT[t.dtype], "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


def load_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, m in header.items():
        if name == "__metadata__":
            continue
        a, b = m["data_offsets"]
        buf = bytearray(data[base + a:base + b])
        t = torch.frombuffer(buf, dtype=torch.uint8) if buf else torch.empty(0, dtype=torch.uint8)
        out[name] = t.view(_TD[m["dtype"]]).reshape(m["shape"])
    return out


# ---------------------------------------------------------------- geometry
def padded(grid):
    return tuple(-(-g // w) * w for g, w in zip(grid, WINDOW))


def n_types(grid):
    p = padded(grid)
    return (p[0] // WINDOW[0]) * (p[1] // WINDOW[1])


def bias_table_rows():
    wz, wh, ww = WINDOW
    return (2 * ww - 1) * wh * wh * wz * wz


def position_index():
    """EarthAttention3D._construct_index of the public pseudocode."""
    wz, wh, ww = WINDOW
    coords_zi = torch.arange(wz)
    coords_zj = -torch.arange(wz) * wz
    coords_hi = torch.arange(wh)
    coords_hj = -torch.arange(wh) * wh
    coords_w = torch.arange(ww)
    coords_1 = torch.stack(torch.meshgrid([coords_zi, coords_hi, coords_w], indexing="ij"))
    coords_2 = torch.stack(torch.meshgrid([coords_zj, coords_hj, coords_w], indexing="ij"))
    coords_flatten_1 = torch.flatten(coords_1, start_dim=1)
    coords_flatten_2 = torch.flatten(coords_2, start_dim=1)
    coords = coords_flatten_1[:, :, None] - coords_flatten_2[:, None, :]
    coords = coords.permute(1, 2, 0).contiguous()
    coords[:, :, 2] += ww - 1
    coords[:, :, 1] *= 2 * ww - 1
    coords[:, :, 0] *= (2 * ww - 1) * wh * wh
    return coords.sum(dim=-1).flatten()


def window_partition(x, p):
    """[Zp, Hp, Wp, C] -> [windows, T, C], windows (z, h, w)-major."""
    (zp, hp, wp), (wz, wh, ww), c = p, WINDOW, x.shape[-1]
    x = x.reshape(zp // wz, wz, hp // wh, wh, wp // ww, ww, c)
    return x.permute(0, 2, 4, 1, 3, 5, 6).reshape(-1, wz * wh * ww, c)


def window_reverse(x, p):
    (zp, hp, wp), (wz, wh, ww), c = p, WINDOW, x.shape[-1]
    x = x.reshape(zp // wz, hp // wh, wp // ww, wz, wh, ww, c)
    return x.permute(0, 3, 1, 4, 2, 5, 6).reshape(zp, hp, wp, c)


def shift_mask(grid, shift, axes=3):
    """The shifted-window attention mask on the padded grid: [windows, T, T],
    0 or -100. Regions are Swin's slices along the first `axes` axes: all
    three for the student model (27 regions), level and latitude for the
    released model (9 regions; longitude wraps around the globe, so the
    tokens its roll brings round are real neighbours)."""
    p = padded(grid)
    img = torch.zeros(p)
    cnt = 0
    sl = [(slice(0, -w), slice(-w, -s), slice(-s, None)) for w, s in zip(WINDOW, shift)]
    if axes == 2:
        sl[2] = (slice(None),)
    for z in sl[0]:
        for h in sl[1]:
            for w in sl[2]:
                img[z, h, w] = cnt
                cnt += 1
    mw = window_partition(img[..., None], p).squeeze(-1)  # [windows, T]
    m = mw.unsqueeze(1) - mw.unsqueeze(2)
    return m.masked_fill(m != 0, MASK_NEG).masked_fill(m == 0, 0.0)


# ---------------------------------------------------------------- the model
class Block(torch.nn.Module):
    def __init__(self, sd, i, grid, dim, heads, shifted, dtype, device, order="post"):
        super().__init__()
        g = lambda n: sd[f"b{i}.{n}"].to(device=device, dtype=dtype)  # noqa: E731
        self.grid, self.dim, self.heads, self.order = grid, dim, heads, order
        self.shift = SHIFT if shifted else (0, 0, 0)
        for n in ["norm1.weight", "norm1.bias", "qkv.weight", "qkv.bias", "proj.weight", "proj.bias",
                  "norm2.weight", "norm2.bias", "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]:
            self.register_buffer(n.replace(".", "_"), g(n))
        t = WINDOW[0] * WINDOW[1] * WINDOW[2]
        table = g("earth_bias")  # [rows, types, heads]
        # The pseudocode indexes the table in every forward; the expanded
        # [types, heads, T, T] bias is a constant of the weights, built once
        # here as candle builds it at load.
        bias = table[position_index().to(device)].reshape(t, t, table.shape[1], heads).permute(2, 3, 0, 1)
        self.register_buffer("earth_bias", bias.contiguous())
        axes = 2 if order == "post" else 3
        mask = shift_mask(grid, self.shift, axes).to(device=device, dtype=dtype) if shifted else None
        self.register_buffer("mask", mask)

    def forward(self, x):
        (z, h, w), c, heads = self.grid, self.dim, self.heads
        p = padded(self.grid)
        sz, sh, sw = self.shift
        t = WINDOW[0] * WINDOW[1] * WINDOW[2]
        post = self.order == "post"
        shortcut = x
        y = x if post else F.layer_norm(x, (c,), self.norm1_weight, self.norm1_bias, EPS)
        y = y.reshape(z, h, w, c)
        y = F.pad(y, (0, 0, 0, p[2] - w, 0, p[1] - h, 0, p[0] - z))
        if self.mask is not None:
            y = torch.roll(y, shifts=(-sz, -sh, -sw), dims=(0, 1, 2))
        y = window_partition(y, p)  # [windows, T, C]
        nwin = y.shape[0]
        qkv = F.linear(y, self.qkv_weight, self.qkv_bias)
        qkv = qkv.reshape(nwin, t, 3, heads, c // heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        q = q * (c // heads) ** -0.5
        attn = q @ k.transpose(-2, -1)  # [windows, heads, T, T]
        types = self.earth_bias.shape[0]
        attn = attn.reshape(types, nwin // types, heads, t, t) + self.earth_bias.unsqueeze(1)
        attn = attn.reshape(nwin, heads, t, t)
        if self.mask is not None:
            attn = attn + self.mask.unsqueeze(1)
        attn = attn.softmax(dim=-1)
        y = (attn @ v).transpose(1, 2).reshape(nwin, t, c)
        y = F.linear(y, self.proj_weight, self.proj_bias)
        y = window_reverse(y, p)
        if self.mask is not None:
            y = torch.roll(y, shifts=(sz, sh, sw), dims=(0, 1, 2))
        y = y[:z, :h, :w].reshape(z * h * w, c)
        if post:
            # Post-norm (the released weights): x + norm1(attn), x + norm2(mlp).
            x = shortcut + F.layer_norm(y, (c,), self.norm1_weight, self.norm1_bias, EPS)
            y = F.linear(F.gelu(F.linear(x, self.fc1_weight, self.fc1_bias)), self.fc2_weight, self.fc2_bias)
            return x + F.layer_norm(y, (c,), self.norm2_weight, self.norm2_bias, EPS)
        x = shortcut + y
        y = F.layer_norm(x, (c,), self.norm2_weight, self.norm2_bias, EPS)
        y = F.linear(F.gelu(F.linear(y, self.fc1_weight, self.fc1_bias)), self.fc2_weight, self.fc2_bias)
        return x + y


class Stage(torch.nn.Module):
    def __init__(self, sd, scale, dtype, device, order="post"):
        super().__init__()
        grid, dim, heads = SCALES[scale]
        self.blocks = torch.nn.ModuleList(
            [Block(sd, i, grid, dim, heads, i % 2 == 1, dtype, device, order) for i in range(2)])

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x


def stage_input(sd, scale, dtype, device):
    grid, dim, _ = SCALES[scale]
    return sd["x"].to(device=device, dtype=dtype).reshape(grid[0] * grid[1] * grid[2], dim)


# ---------------------------------------------------------------- commands
def log(args, rec):
    rec = dict(rec, when=time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()))
    with open(os.path.join(args.dir, "pangu_ref.jsonl"), "a") as f:
        f.write(json.dumps(rec) + "\n")


def gen(args):
    os.makedirs(args.dir, exist_ok=True)
    for scale in args.scales:
        grid, dim, heads = SCALES[scale]
        gen_ = torch.Generator().manual_seed(args.seed + sum(map(ord, scale)))
        sd = {}

        def u(shape, a, center=0.0):
            return (center + a * (2 * torch.rand(shape, generator=gen_) - 1)).to(torch.float16)

        sd["x"] = torch.randn((*grid, dim), generator=gen_).to(torch.float16)
        for i in range(2):
            for n in ["norm1", "norm2"]:
                sd[f"b{i}.{n}.weight"] = u((dim,), 0.5, 1.0)
                sd[f"b{i}.{n}.bias"] = u((dim,), 0.5)
            for n, (o, k) in {"qkv": (3 * dim, dim), "proj": (dim, dim), "fc1": (4 * dim, dim),
                              "fc2": (dim, 4 * dim)}.items():
                sd[f"b{i}.{n}.weight"] = u((o, k), 1 / math.sqrt(k))  # nn.Linear's default range
                sd[f"b{i}.{n}.bias"] = u((o,), 1 / math.sqrt(k))
            # Trained Pangu biases are O(1) after training; the pseudocode's
            # init (trunc-normal, std 0.02) would make a wrong bias index
            # invisible under f16 noise.
            sd[f"b{i}.earth_bias"] = u((bias_table_rows(), n_types(grid), heads), 1.0)
        path = os.path.join(args.dir, f"pangu_{scale}.safetensors")
        save_safetensors(path, sd)
        print(f"{scale}: wrote {path} ({os.path.getsize(path) / 1e6:.1f} MB)")


def device_of(args):
    if args.device:
        return torch.device(args.device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def errors(got, ref):
    d = (got.double() - ref.double()).abs()
    nan = bool(torch.isnan(d).any())
    return (float("inf") if nan else float(d.max())), float(d.pow(2).mean().sqrt())


def check(args):
    dev = device_of(args)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    rows = []
    for scale in args.scales:
        sd = load_safetensors(os.path.join(args.dir, f"pangu_{scale}.safetensors"))
        refs = {}
        with torch.no_grad():
            m32 = Stage(sd, scale, torch.float32, dev, args.order)
            x32 = stage_input(sd, scale, torch.float32, dev)
            refs["y"] = m32(x32)
            refs["y_block0"] = m32.blocks[0](x32)
            del m32
            m16 = Stage(sd, scale, torch.float16, dev, args.order)
            x16 = stage_input(sd, scale, torch.float16, dev)
            outs = {"torch-f16": {"y": m16(x16), "y_block0": m16.blocks[0](x16)}}
            del m16
        for name in sorted(os.listdir(args.dir)):
            pre, suf = "out_", f"_{scale}.safetensors"
            if name.startswith(pre) and name.endswith(suf):
                o = load_safetensors(os.path.join(args.dir, name))
                outs[name[len(pre):-len(suf)]] = {k: v.to(dev) for k, v in o.items()}
        ref_rms = float(refs["y"].double().pow(2).mean().sqrt())
        for build, o in outs.items():
            for key in ["y", "y_block0"]:
                if key not in o:
                    continue
                if tuple(o[key].shape) != tuple(refs[key].shape):
                    print(f"{scale} {build} {key}: shape {tuple(o[key].shape)} != {tuple(refs[key].shape)}")
                    continue
                mx, rms = errors(o[key], refs[key])
                rows.append((scale, build, key, mx, rms))
                log(args, {"kind": "gate2", "scale": scale, "build": build, "output": key,
                           "max_err": mx, "rms_err": rms, "ref_rms": ref_rms})
    print("gate 2: error against PyTorch's f32 reference (the f16 builds' outputs)")
    print(f"{'scale':6} {'build':16} {'output':9} {'max err':>10} {'rms err':>10}")
    for r in rows:
        print(f"{r[0]:6} {r[1]:16} {r[2]:9} {r[3]:10.3e} {r[4]:10.3e}")
    # Gate 2: a candle build's stage output is no worse than PyTorch's own f16.
    ok = True
    for scale in args.scales:
        base = {(r[2]): r for r in rows if r[0] == scale and r[1] == "torch-f16"}
        for r in rows:
            if r[0] == scale and r[1] != "torch-f16" and r[2] == "y":
                b = base["y"]
                passed = r[3] <= b[3] and r[4] <= b[4]
                ok &= passed
                print(f"gate 2 {scale} {r[1]}: {'met' if passed else 'NOT met'} "
                      f"(max {r[3]:.3e} vs {b[3]:.3e}, rms {r[4]:.3e} vs {b[4]:.3e})")
    return 0 if ok else 1


class Barrier:
    """PANGU_BENCH_BARRIER=DIR,N,TIMEOUT_S: for benches run side by side
    with other GPU work (e.g. one process per scale under max-autotune,
    whose compile is mostly CPU time): a participant's first timing waits
    until N participants have written DIR/ready.* (compiles and other GPU
    work done) or TIMEOUT_S passed, and every timing holds DIR/lock, so no
    timed loop overlaps another participant's GPU work."""

    def __init__(self):
        spec = os.environ.get("PANGU_BENCH_BARRIER")
        self.dir = None
        if spec:
            d, n, t = spec.split(",")
            self.dir, self.n, self.timeout = d, int(n), float(t)
            os.makedirs(d, exist_ok=True)
        self.ready = False

    def __enter__(self):
        if self.dir is None:
            return self
        import fcntl
        if not self.ready:
            open(os.path.join(self.dir, f"ready.{os.getpid()}"), "w").close()
            self.ready = True
            t0 = time.time()
            while sum(f.startswith("ready.") for f in os.listdir(self.dir)) < self.n:
                if time.time() - t0 > self.timeout:
                    print(f"barrier: timed out after {self.timeout:.0f} s; timing anyway", flush=True)
                    break
                time.sleep(0.5)
        self.lock = open(os.path.join(self.dir, "lock"), "w")
        fcntl.flock(self.lock, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        if self.dir is not None:
            self.lock.close()
        return False


def bench(args):
    dev = device_of(args)
    cuda = dev.type == "cuda"  # the CPU path is a smoke test of the harness (tiny scale)
    import torch._dynamo

    torch.backends.cuda.matmul.allow_tf32 = False
    barrier = Barrier()
    for scale in args.scales:
        sd = load_safetensors(os.path.join(args.dir, f"pangu_{scale}.safetensors"))
        m = Stage(sd, scale, torch.float16, dev, args.order).eval()
        x0 = stage_input(sd, scale, torch.float16, dev)
        # Rotated inputs: every call reads a buffer the previous call did not.
        xs = [x0.clone() for _ in range(3)]
        parts = {"stage": m, "block0": m.blocks[0], "block1": m.blocks[1]}
        for mode in args.modes:
            for part in args.parts:
                mod = parts[part]
                torch._dynamo.reset()
                t0 = time.time()
                if mode == "eager":
                    fn = mod
                else:
                    fn = torch.compile(mod, mode=None if mode == "default" else mode)
                with torch.no_grad():
                    for i in range(3):  # compile + warm-up
                        fn(xs[i % 3])
                    prep = time.time() - t0
                    barrier.__enter__()
                    fn(xs[0])  # warm again after a wait at the barrier
                    base = peak = 0
                    if cuda:
                        torch.cuda.synchronize()
                        base = torch.cuda.memory_allocated()
                        torch.cuda.reset_peak_memory_stats()
                        fn(xs[0])
                        torch.cuda.synchronize()
                        peak = torch.cuda.max_memory_allocated()
                    times = []
                    for i in range(args.reps):
                        if cuda:
                            a = torch.cuda.Event(enable_timing=True)
                            b = torch.cuda.Event(enable_timing=True)
                            a.record()
                            fn(xs[i % 3])
                            b.record()
                            b.synchronize()
                            times.append(a.elapsed_time(b) * 1e3)
                        else:
                            t1 = time.perf_counter()
                            fn(xs[i % 3])
                            times.append((time.perf_counter() - t1) * 1e6)
                    barrier.__exit__()
                times.sort()
                med = times[len(times) // 2]
                rec = {"kind": "time", "scale": scale, "impl": f"torch-{mode}", "part": part,
                       "median_us": med, "min_us": times[0], "reps": args.reps,
                       "peak_bytes": peak, "peak_over_base_bytes": peak - base, "prep_s": prep,
                       "torch": torch.__version__, "gpu": torch.cuda.get_device_name() if cuda else "cpu"}
                log(args, rec)
                print(f"{scale} {part:6} torch-{mode:12} median {med:10.1f} us  min {times[0]:10.1f} us  "
                      f"peak {peak / 2**20:8.1f} MiB (+{(peak - base) / 2**20:.1f} over resident)  "
                      f"compile+warm-up {prep:.0f} s", flush=True)
                del fn
        del m, xs, parts
        if cuda:
            torch.cuda.empty_cache()
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cmd", choices=["gen", "check", "bench"])
    ap.add_argument("--dir", required=True)
    ap.add_argument("--scales", default="s1,s2")
    ap.add_argument("--order", choices=["post", "pre"], default="post",
                    help="post: the released weights' blocks (post-norm, level+latitude mask; "
                         "pangu_stage's default); pre: the student model's (pre-norm, 3-axis mask)")
    ap.add_argument("--seed", type=int, default=20261201)
    ap.add_argument("--device", default=None)
    ap.add_argument("--modes", default="eager,default,max-autotune")
    ap.add_argument("--parts", default="stage,block0,block1")
    ap.add_argument("--reps", type=int, default=50)
    args = ap.parse_args()
    args.scales = args.scales.split(",")
    args.modes = args.modes.split(",")
    args.parts = args.parts.split(",")
    os.makedirs(args.dir, exist_ok=True)
    return {"gen": gen, "check": check, "bench": bench}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
