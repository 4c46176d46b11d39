#!/usr/bin/env python3
"""Where the f16 stage's error comes from: the PyTorch reference's block
(pangu_ref.py) in f64 with an explicit f16 rounding at every point where
an f16 build rounds, one switch per point, so that PyTorch's own f16 chain,
the candle + wavefuse build's chain and every mix of the two can be run on
the same weights and measured against PyTorch's f32 output (gate 2's
measure: max and RMS error).

  pangu_rounding.py --dir D --scales tiny192 [--out D/pangu_rounding.jsonl]
                    [--dtype f64|f32] [--no-real] [--quick]

D holds pangu_<scale>.safetensors (pangu_ref.py gen) and, if present, the
candle builds' outputs out_<build>_<scale>.safetensors: the script first
checks each model chain against the real output it stands for (PyTorch's
f16 module on this machine; the candle builds run on the CPU emulator),
then attributes the difference between the two chains point by point.

Rounding points (the `Chain` fields; `r` is round-to-nearest f16):
  ln1     norm1's output (affine included): r(LN(x) g + b)       all builds
  qkv     the QKV Linear: "single" r(acc + b) (cuBLAS's bias epilogue),
          "double" r(r(acc) + b) (GEMM output rounded, bias added after)
  attn    "torch": q = r(q * scale), s = r(q k^T), r(s + bias), r(. + mask),
          p = r(softmax), o = r(p v);
          "fused" (window_attention): z = s * scale + mask + bias in f32,
          e = exp(z - max), p = r(e), o = r((p v) / sum e)
  proj    the output projection: "single" / "double" as qkv
  res     the residual adds: r(x + branch)                        all builds
  ln2     norm2's output: r(LN(x) g + b)                          all builds
  fc1     "single" r(acc + b); "double" r(r(acc) + b) (f16 bias added by
          bias_gelu to the rounded GEMM output); "pre" r(acc) + b (the
          GEMM output rounded, the bias added in f32 before the GELU)
  gelu    r(gelu(.)) in f32                                        all builds
  fc2     "single" / "double" as qkv
The mask value (-100), eps (1e-5), pad / roll order are the reference's in
every chain: the builds were checked to use the same (see pangu_ref.py).
"""
import argparse
import dataclasses
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pangu_ref as ref  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Chain:
    qkv: str = "single"
    attn: str = "torch"
    proj: str = "single"
    fc1: str = "single"
    fc2: str = "single"
    ln1: bool = True
    ln2: bool = True
    res: bool = True
    gelu: bool = True
    # Round the stage input and weights: always (they are f16 in the file).


TORCH = Chain()
# The candle + wavefuse build before this study (commit 7da630a).
WAVEFUSE_7DA = Chain(qkv="double", attn="fused", proj="double", fc1="double", fc2="single")
# The build now: every Linear's bias in the GEMM's epilogue.
WAVEFUSE = Chain(attn="fused")


def r16(x):
    return x.to(torch.float16).to(x.dtype)


def maybe(flag, x):
    return r16(x) if flag else x


def linear(x, w, b, mode):
    acc = x @ w.t()
    if mode == "single":
        return r16(acc + b)
    if mode == "double":
        return r16(r16(acc) + b)
    if mode == "pre":
        return r16(acc) + b
    if mode == "none":
        return acc + b
    raise ValueError(mode)


class Block:
    """pangu_ref.Block in f64 with the rounding points of `chain`."""

    def __init__(self, m):
        # m: a pangu_ref.Block in f64 (weights are the file's f16 values).
        self.m = m

    def forward(self, x, ch):
        m = self.m
        (z, h, w), c, heads = m.grid, m.dim, m.heads
        p = ref.padded(m.grid)
        sz, sh, sw = m.shift
        t = ref.WINDOW[0] * ref.WINDOW[1] * ref.WINDOW[2]
        hd = c // heads
        shortcut = x
        y = maybe(ch.ln1, F.layer_norm(x, (c,), m.norm1_weight, m.norm1_bias, ref.EPS))
        y = y.reshape(z, h, w, c)
        y = F.pad(y, (0, 0, 0, p[2] - w, 0, p[1] - h, 0, p[0] - z))
        if m.mask is not None:
            y = torch.roll(y, shifts=(-sz, -sh, -sw), dims=(0, 1, 2))
        y = ref.window_partition(y, p)
        nwin = y.shape[0]
        qkv = linear(y, m.qkv_weight, m.qkv_bias, ch.qkv)
        qkv = qkv.reshape(nwin, t, 3, heads, hd).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        types = m.earth_bias.shape[0]
        per = nwin // types
        # Window chunks of whole types (windows are (z, h, w)-major, the
        # type is (z, h)): the scores of a whole grid do not fit memory.
        step = max(1, CHUNK // (per * heads))
        o = torch.cat([self.attention(q, k, v, ch, ty, min(ty + step, types), per)
                       for ty in range(0, types, step)])
        y = o.transpose(1, 2).reshape(nwin, t, c)
        y = linear(y, m.proj_weight, m.proj_bias, ch.proj)
        y = ref.window_reverse(y, p)
        if m.mask is not None:
            y = torch.roll(y, shifts=(sz, sh, sw), dims=(0, 1, 2))
        y = y[:z, :h, :w].reshape(z * h * w, c)
        x = maybe(ch.res, shortcut + y)
        y = maybe(ch.ln2, F.layer_norm(x, (c,), m.norm2_weight, m.norm2_bias, ref.EPS))
        y = linear(y, m.fc1_weight, m.fc1_bias, ch.fc1)
        y = maybe(ch.gelu, F.gelu(y))
        y = linear(y, m.fc2_weight, m.fc2_bias, ch.fc2)
        return maybe(ch.res, x + y)


    def attention(self, q, k, v, ch, t0, t1, per):
        """Windows of types t0..t1: [windows, heads, T, hd] -> same."""
        m = self.m
        sl = slice(t0 * per, t1 * per)
        q, k, v = q[sl], k[sl], v[sl]
        nw, heads, t, hd = q.shape
        bias = m.earth_bias[t0:t1].unsqueeze(1)
        mask = m.mask[sl].unsqueeze(1) if m.mask is not None else None

        def add_bias(s):
            return (s.reshape(t1 - t0, per, heads, t, t) + bias).reshape(nw, heads, t, t)
        if ch.attn == "torch":
            # Python float scale: the f16 kernel multiplies in f32.
            q = r16(q * hd ** -0.5)
            s = r16(add_bias(r16(q @ k.transpose(-2, -1))))
            if mask is not None:
                s = r16(s + mask)
            return r16(r16(s.softmax(dim=-1)) @ v)
        s = (q @ k.transpose(-2, -1)) * (hd ** -0.5)
        if mask is not None:
            s = s + mask
        s = add_bias(s)
        if ch.attn == "fused":
            e = torch.exp(s - s.amax(dim=-1, keepdim=True))
            return r16((r16(e) @ v) / e.sum(dim=-1, keepdim=True))
        if ch.attn == "exact":
            return r16(s.softmax(dim=-1) @ v)
        raise ValueError(ch.attn)


CHUNK = 256  # (window, head) pairs per attention chunk


def run(blocks, x, ch):
    for b in blocks:
        x = b.forward(x, ch)
    return x


def errors(got, want):
    d = (got.double() - want.double()).abs()
    return float(d.max()), float(d.pow(2).mean().sqrt())


# One switch at a time: the PyTorch value of a point that the wavefuse
# chain does differently, and the other way round.
POINTS = {
    "qkv": ("single", "double"),
    "attn": ("torch", "fused"),
    "proj": ("single", "double"),
    "fc1": ("single", "double"),
    "fc2": ("single", "double"),
}


def study(args, scale):
    sd = ref.load_safetensors(os.path.join(args.dir, f"pangu_{scale}.safetensors"))
    torch.backends.cuda.matmul.allow_tf32 = False
    out = []

    def rec(kind, name, got, want, **kw):
        mx, rms = errors(got, want)
        r = dict(kind=kind, scale=scale, name=name, max_err=mx, rms_err=rms, **kw)
        out.append(r)
        print(f"{scale:8} {kind:10} {name:44} max {mx:.3e} rms {rms:.4e}", flush=True)
        return rms

    with torch.no_grad():
        m32 = ref.Stage(sd, scale, torch.float32, "cpu")
        x32 = ref.stage_input(sd, scale, torch.float32, "cpu")
        y32 = m32(x32)
        del m32
        y16 = None
        if not args.no_real:
            m16 = ref.Stage(sd, scale, torch.float16, "cpu")
            y16 = m16(ref.stage_input(sd, scale, torch.float16, "cpu"))
            del m16
        dt = {"f64": torch.float64, "f32": torch.float32}[args.dtype]
        m64 = ref.Stage(sd, scale, dt, "cpu")
        blocks = [Block(b) for b in m64.blocks]
        x64 = ref.stage_input(sd, scale, dt, "cpu")
        y64 = run(blocks, x64, Chain(qkv="none", attn="exact", proj="none", fc1="none", fc2="none",
                                     ln1=False, ln2=False, res=False, gelu=False))
        rec("ref", f"f32 reference vs {args.dtype} unrounded chain", y64, y32)
        if y16 is not None:
            rec("real", "torch-f16 (PyTorch's f16 module)", y16, y32)
        models = {"torch": TORCH, "wavefuse-7da630a": WAVEFUSE_7DA, "wavefuse": WAVEFUSE}
        ys = {}
        for name, ch in models.items():
            ys[name] = run(blocks, x64, ch)
            rec("model", name, ys[name], y32)
        # Each model against the output it stands for.
        if y16 is not None:
            print(f"{scale:8} model torch vs torch-f16: identical elements "
                  f"{float((ys['torch'].half() == y16).double().mean()):.6f}, max diff "
                  f"{float((ys['torch'] - y16.double()).abs().max()):.3e}")
        for build in ["wavefuse", "wavefuse-unfused", "candle"]:
            f = os.path.join(args.dir, f"out_{build}_{scale}.safetensors")
            if os.path.exists(f):
                y = ref.load_safetensors(f)["y"]
                rec("real", f"{build} (candle output)", y, y32)
                if build == "wavefuse":
                    yw = ys["wavefuse"]
                    print(f"{scale:8} model wavefuse vs candle wavefuse: identical elements "
                          f"{float((yw.half() == y).double().mean()):.6f}, max diff "
                          f"{float((yw - y.double()).abs().max()):.3e}")
        if args.quick:
            return out
        # Attribution: from the wavefuse chain, one point at a time set to
        # PyTorch's; from PyTorch's chain, one point set to the wavefuse's.
        for pt, (tv, wv) in POINTS.items():
            base = WAVEFUSE_7DA
            if getattr(base, pt) != tv:
                ch = dataclasses.replace(base, **{pt: tv})
                rec("wf->torch", f"{pt}={tv}", run(blocks, x64, ch), y32, point=pt, chain=str(ch))
            if getattr(TORCH, pt) != wv:
                ch = dataclasses.replace(TORCH, **{pt: wv})
                rec("torch->wf", f"{pt}={wv}", run(blocks, x64, ch), y32, point=pt, chain=str(ch))
        for name, ch in (args.extra or {}).items():
            rec("extra", name, run(blocks, x64, ch), y32, chain=str(ch))
    return out


def steps(args, scale, build="wavefuse", ch=None):
    """The candle build's steps, one at a time, against this script's model
    of the same step (`ch`: the build's chain, by default the current one)
    fed with the build's own operands: a step that rounds where the model
    does not shows up as an error above the model's. Each line: the
    build's step output and the model's, both against the step computed in
    f64 without rounding from the build's operands (RMS), and the share of
    elements where build and model agree to the bit."""
    ch = ch or WAVEFUSE
    f = os.path.join(args.dir, f"steps_{build}_{scale}.safetensors")
    if not os.path.exists(f):
        return []
    st = {k: v.double() for k, v in ref.load_safetensors(f).items()}
    sd = ref.load_safetensors(os.path.join(args.dir, f"pangu_{scale}.safetensors"))
    blocks = ref.Stage(sd, scale, torch.float64, "cpu").blocks
    out = []

    def cmp(b, step, got, model, exact):
        got = got.double()
        same = float((got == model).double().mean())
        e_got = float((got - exact).pow(2).mean().sqrt())
        e_mod = float((model - exact).pow(2).mean().sqrt())
        print(f"{scale:8} b{b} {step:26} build rms {e_got:.4e}  model rms {e_mod:.4e}  identical {same:.4f}",
              flush=True)
        out.append(dict(kind="step", scale=scale, build=build, block=b, step=step, build_rms=e_got,
                        model_rms=e_mod, identical=same))

    def part(m, y):
        (z, h, w), c = m.grid, m.dim
        p = ref.padded(m.grid)
        y = F.pad(y.reshape(z, h, w, c), (0, 0, 0, p[2] - w, 0, p[1] - h, 0, p[0] - z))
        if m.mask is not None:
            y = torch.roll(y, shifts=tuple(-s for s in m.shift), dims=(0, 1, 2))
        return ref.window_partition(y, p).reshape(-1, c)

    def unpart(m, y):
        (z, h, w), c = m.grid, m.dim
        p = ref.padded(m.grid)
        y = ref.window_reverse(y.reshape(-1, ref.WINDOW[0] * ref.WINDOW[1] * ref.WINDOW[2], c), p)
        if m.mask is not None:
            y = torch.roll(y, shifts=m.shift, dims=(0, 1, 2))
        return y[:z, :h, :w].reshape(z * h * w, c)

    with torch.no_grad():
        for b, m in enumerate(blocks):
            c, heads = m.dim, m.heads
            t = ref.WINDOW[0] * ref.WINDOW[1] * ref.WINDOW[2]
            if b == 0:
                x = st["b0.norm_partition.x"]
                ln = F.layer_norm(x, (c,), m.norm1_weight, m.norm1_bias, ref.EPS)
                cmp(b, "norm_partition", st["b0.norm_partition.h"], part(m, r16(ln)), part(m, ln))
                h = st["b0.norm_partition.h"]
            else:
                x, d = st[f"b{b}.add_norm_partition.x"], st[f"b{b}.add_norm_partition.d"]
                cmp(b, "add (entry)", st[f"b{b}.add_norm_partition.sum"], r16(x + d), x + d)
                s_ = st[f"b{b}.add_norm_partition.sum"]
                ln = F.layer_norm(s_, (c,), m.norm1_weight, m.norm1_bias, ref.EPS)
                cmp(b, "norm_partition (entry)", st[f"b{b}.add_norm_partition.h"], part(m, r16(ln)), part(m, ln))
                h = st[f"b{b}.add_norm_partition.h"]
            acc = h @ m.qkv_weight.t()
            qkv = st[f"b{b}.attention.qkv"]
            # The double-rounding chain's GEMM leaves the bias to the attention.
            gemm_bias = ch.qkv == "single"
            cmp(b, "qkv (gemm [+ bias])", qkv, linear(h, m.qkv_weight, m.qkv_bias, ch.qkv) if gemm_bias
                else r16(acc), acc + m.qkv_bias if gemm_bias else acc)
            # Attention from the build's own GEMM output.
            nwin = qkv.shape[0] // t
            hd = c // heads
            qb = (qkv if gemm_bias else qkv + m.qkv_bias).reshape(nwin, t, 3, heads, hd).permute(2, 0, 3, 1, 4)
            types = m.earth_bias.shape[0]

            def attn(qkv_r, rp):
                q, k, v = qkv_r[0], qkv_r[1], qkv_r[2]
                s = (q @ k.transpose(-2, -1)) * hd ** -0.5
                if m.mask is not None:
                    s = s + m.mask.unsqueeze(1)
                s = (s.reshape(types, nwin // types, heads, t, t) + m.earth_bias.unsqueeze(1))
                s = s.reshape(nwin, heads, t, t)
                e = torch.exp(s - s.amax(dim=-1, keepdim=True))
                o = (rp(e) @ v) / e.sum(dim=-1, keepdim=True)
                return o.transpose(1, 2).reshape(nwin * t, c)
            exact = attn(qb, lambda e: e)
            cmp(b, "attention", st[f"b{b}.attention.o"], r16(attn(qb if gemm_bias else r16(qb), r16)), exact)
            o = st[f"b{b}.attention.o"]
            acc = o @ m.proj_weight.t()
            cmp(b, "proj (gemm + bias)", st[f"b{b}.proj.a"], linear(o, m.proj_weight, m.proj_bias, ch.proj),
                acc + m.proj_bias)
            a = st[f"b{b}.proj.a"]
            x = st[f"b{b}.unpartition_add_norm.x"]
            cmp(b, "residual add", st[f"b{b}.unpartition_add_norm.sum"], r16(x + unpart(m, a)), x + unpart(m, a))
            s_ = st[f"b{b}.unpartition_add_norm.sum"]
            ln = F.layer_norm(s_, (c,), m.norm2_weight, m.norm2_bias, ref.EPS)
            cmp(b, "norm2", st[f"b{b}.unpartition_add_norm.h"], r16(ln), ln)
            h = st[f"b{b}.unpartition_add_norm.h"]
            pre = h @ m.fc1_weight.t() + m.fc1_bias
            if f"b{b}.mlp.fc1" in st:
                cmp(b, "fc1 (gemm + bias)", st[f"b{b}.mlp.fc1"], linear(h, m.fc1_weight, m.fc1_bias, ch.fc1), pre)
                a = st[f"b{b}.mlp.fc1"]
                cmp(b, "gelu", st[f"b{b}.mlp.gelu"], r16(F.gelu(a)), F.gelu(a))
                g = st[f"b{b}.mlp.gelu"]
                cmp(b, "fc2 (gemm + bias)", st[f"b{b}.mlp.m"], linear(g, m.fc2_weight, m.fc2_bias, ch.fc2),
                    g @ m.fc2_weight.t() + m.fc2_bias)
            gm = r16(F.gelu(linear(h, m.fc1_weight, m.fc1_bias, ch.fc1)))
            cmp(b, "mlp (from its input)", st[f"b{b}.mlp.m"], linear(gm, m.fc2_weight, m.fc2_bias, ch.fc2),
                F.gelu(pre) @ m.fc2_weight.t() + m.fc2_bias)
        x, d = st["b1.add.x"], st["b1.add.d"]
        cmp(1, "add (last)", st["b1.add.y"], r16(x + d), x + d)
    return out


EXTRA = {
    "wf: qkv+proj single, fc1 double": Chain(qkv="single", attn="fused", proj="single", fc1="double"),
    "wf: every Linear single (epilogues)": Chain(qkv="single", attn="fused", proj="single", fc1="single"),
    "torch with exact attention": Chain(attn="exact"),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--scales", default="tiny192")
    ap.add_argument("--out", default=None)
    ap.add_argument("--dtype", default="f64", choices=["f64", "f32"],
                    help="the model chains' arithmetic between rounding points")
    ap.add_argument("--no-real", action="store_true", help="skip PyTorch's f16 module (slow on the CPU)")
    ap.add_argument("--quick", action="store_true", help="the three chains only, no attribution")
    args = ap.parse_args()
    args.extra = EXTRA
    torch.set_num_threads(os.cpu_count() or 1)
    rows = []
    for s in args.scales.split(","):
        t0 = time.time()
        rows += study(args, s)
        rows += steps(args, s)
        print(f"{s}: {time.time() - t0:.0f} s")
    path = args.out or os.path.join(args.dir, "pangu_rounding.jsonl")
    with open(path, "a") as f:
        for r in rows:
            f.write(json.dumps(dict(r, when=time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()))) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
