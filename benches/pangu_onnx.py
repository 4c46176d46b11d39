"""The ONNX fixtures of `pangu convert`.

The network is arranged here as the released Pangu-Weather ONNX files are
(pangu/tests/fixtures/onnx/README.md): a top module whose `b1` holds flat
submodules named as the public initializer table names them, kernel-1
Conv1d patch embedding and recovery over unfolded patches, Linears on
token tensors (exported as MatMul with a folded `[in, out]` weight named
`onnx::MatMul_*`), the earth-specific bias gathered from a table and
folded into the expanded `[1, types, heads, 144, 144]` initializer
(`onnx::Add_*`), and the statistics, the 6th upper-air channel and the
surface maps as Constant nodes in the released files' shapes. It is
exported with torch.onnx.export's TorchScript exporter and run by
onnxruntime on the CPU.

    python benches/pangu_onnx.py --out pangu/tests/fixtures/onnx

writes (each .onnx gzipped, as NAME.onnx.gz, for the repository):
  net.onnx        depths 2,2,2,2, width 32, 9 x 96, opset 17 (one
                  LayerNormalization op), seeded weights at training-like
                  scale; net_input_{upper,surface}.npy (the seeded inputs of
                  `pangu random-weights --inputs`, seed 1) and
                  net_ort_{upper,surface}.npy (onnxruntime's output)
  variant.onnx    depths 1,1,1,1, opset 14 (LayerNorm decomposed into
                  ReduceMean .. Add), other weights; every initializer and
                  node renamed and the nodes in another topological order;
                  variant_ort_{upper,surface}.npy
  full.onnx       depths 2,6,6,2, width 32: all 223 initializers of the
                  table; every tensor of role row k of the table holds the
                  value k, so the mapping can be checked value by value
  manifest.json   versions, command, shapes and sha256 of every file

    python benches/pangu_onnx.py --full-size pangu_weather_24.onnx

writes a file of the released size instead (721 x 1440, width 192, depths
2,6,6,2, random weights; about 1.1 GB) to measure the converter's time and
memory on. It is not a fixture: nothing is recorded beside it.
"""
import argparse
import csv
import gzip
import hashlib
import json
import math
import os
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pangu_model as pm  # noqa: E402

EPS = pm.EPS
HEAD_DIM = pm.HEAD_DIM
TOKENS = pm.TOKENS
SHIFT = pm.SHIFT
TABLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pangu", "tests", "fixtures", "onnx",
                     "released-initializers.csv")


def read_table(path=TABLE):
    """[(row, onnx_name, role, shape)] in the table's order (row from 0)."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    return [(k, r["onnx_name"], r["role"], tuple(int(x) for x in r["shape_in_file"].split(",")))
            for k, r in enumerate(rows)]


def module_names(table):
    """role group (e.g. `layer0.block0.qkv`) -> the `b1` submodule name the
    released file's names imply (`a12`), for groups with a `b1.*` name."""
    out = {}
    for _, name, role, _ in table:
        if not name.startswith("b1."):
            continue
        parts = name.split(".")
        group = role.rsplit(".", 1)[0]
        if group.endswith(".fc1") or group.endswith(".fc2"):
            out[group.rsplit(".", 1)[0] + ".mlp"] = parts[1]
        else:
            out[group] = parts[1]
    return out


class Block:
    """One post-norm block's modules (registered on `b1`) and geometry."""

    def __init__(self, core, names, role, dim, grid, shifted):
        self.grid = tuple(grid)
        self.padded = tuple(pm.ceil_to(g, w) for g, w in zip(grid, pm.WINDOW))
        self.shifted, self.dim, self.heads = shifted, dim, dim // HEAD_DIM
        self.types = (self.padded[0] // pm.WINDOW[0]) * (self.padded[1] // pm.WINDOW[1])
        self.qkv = core.add(names[f"{role}.qkv"], nn.Linear(dim, 3 * dim))
        self.proj = core.add(names[f"{role}.proj"], nn.Linear(dim, dim))
        self.norm1 = core.add(names[f"{role}.norm1"], nn.LayerNorm(dim, eps=EPS))
        self.norm2 = core.add(names[f"{role}.norm2"], nn.LayerNorm(dim, eps=EPS))
        mlp = nn.Module()
        mlp.fc1, mlp.fc2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)
        self.mlp = core.add(names[f"{role}.mlp"], mlp)
        # The compact table; the export folds the gather into the expanded
        # [1, types, heads, 144, 144] initializer, as in the released files.
        self.table = nn.Parameter(torch.zeros(pm.BIAS_ROWS, self.types, self.heads))
        core.register_parameter("bias_" + role.replace(".", "_"), self.table)
        self.role = role
        # Constant nodes: the shift mask as [1, types, 1, 144, 144].
        self.mask = pm.shift_mask(self.padded[0], self.padded[1]).permute(1, 0, 2, 3, 4) if shifted else None
        self.index = pm.position_index()

    def params(self):
        """role -> parameter, in the table's role names."""
        r = self.role
        return {f"{r}.qkv.weight": self.qkv.weight, f"{r}.qkv.bias": self.qkv.bias,
                f"{r}.proj.weight": self.proj.weight, f"{r}.proj.bias": self.proj.bias,
                f"{r}.norm1.gamma": self.norm1.weight, f"{r}.norm1.beta": self.norm1.bias,
                f"{r}.norm2.gamma": self.norm2.weight, f"{r}.norm2.beta": self.norm2.bias,
                f"{r}.fc1.weight": self.mlp.fc1.weight, f"{r}.fc1.bias": self.mlp.fc1.bias,
                f"{r}.fc2.weight": self.mlp.fc2.weight, f"{r}.fc2.bias": self.mlp.fc2.bias,
                f"{r}.earth_bias": self.table}

    def attention(self, x):
        """[nw, types, 144, C] -> the same."""
        nw, types, t, c = x.shape
        qkv = self.qkv(x).reshape(nw, types, t, 3, self.heads, HEAD_DIM).permute(3, 0, 1, 4, 2, 5)
        q, k, v = qkv[0] * HEAD_DIM ** -0.5, qkv[1], qkv[2]
        bias = self.table[self.index].reshape(TOKENS, TOKENS, self.types, self.heads).permute(2, 3, 0, 1)
        a = q @ k.transpose(-2, -1) + bias.unsqueeze(0)
        if self.mask is not None:
            a = a + self.mask
        y = (a.softmax(dim=-1) @ v).transpose(2, 3).reshape(nw, types, t, c)
        return self.proj(y)

    def __call__(self, x):
        (z, h, w), (zp, hp, wp) = self.grid, self.padded
        y = F.pad(x, (0, 0, 0, wp - w, 0, hp - h, 0, zp - z))
        if self.shifted:
            y = torch.roll(y, shifts=(-SHIFT[0], -SHIFT[1], -SHIFT[2]), dims=(0, 1, 2))
        y = self.attention(pm.window_partition(y).transpose(0, 1)).transpose(0, 1)
        y = pm.window_reverse(y, self.padded)
        if self.shifted:
            y = torch.roll(y, shifts=SHIFT, dims=(0, 1, 2))
        x = x + self.norm1(y[:z, :h, :w])
        return x + self.norm2(self.mlp.fc2(F.gelu(self.mlp.fc1(x))))


class Core(nn.Module):
    """The released files' `b1`: the whole network from physical units to
    physical units."""

    def __init__(self, lat, lon, width, depths, table):
        super().__init__()
        g = pm.geometry(lat, lon)
        self.lat, self.lon, self.hp, self.h1, self.w1, self.h2 = lat, lon, g["Hp"], g["h1"], g["w1"], g["h2"]
        c = width
        names = module_names(table)
        self.a_embed_u = self.add(names["embed.upper"], nn.Conv1d(192, c, 1))
        self.a_embed_s = self.add(names["embed.surface"], nn.Conv1d(112, c, 1))
        self.layers = []
        for layer, depth in enumerate(depths):
            dim = c if layer in (0, 3) else 2 * c
            grid = (pm.SLABS, self.h1, self.w1) if dim == c else (pm.SLABS, self.h2, self.w1 // 2)
            self.layers.append([Block(self, names, f"layer{layer}.block{j}", dim, grid, j % 2 == 1)
                                for j in range(depth)])
        self.down_norm = self.add(names["down.norm"], nn.LayerNorm(4 * c, eps=EPS))
        self.down_linear = self.add("down_linear", nn.Linear(4 * c, 2 * c, bias=False))
        self.up_linear1 = self.add("up_linear1", nn.Linear(2 * c, 4 * c, bias=False))
        self.up_norm = self.add(names["up.norm"], nn.LayerNorm(c, eps=EPS))
        self.up_linear2 = self.add("up_linear2", nn.Linear(c, c, bias=False))
        self.rec_u = self.add(names["recover.upper"], nn.Conv1d(2 * c, 160, 1))
        self.rec_s = self.add(names["recover.surface"], nn.Conv1d(2 * c, 64, 1))
        self.width = c
        # Constant nodes, in the released files' shapes.
        um, us, sm, ss = pm.statistics()
        flip = lambda a: torch.tensor(a.T[::-1].copy(), dtype=torch.float32).reshape(13, 1, 1, 5)  # noqa: E731
        self.in_mean_u, self.in_std_u = flip(um), flip(us)
        self.in_mean_s = torch.tensor(sm, dtype=torch.float32)
        self.in_std_s = torch.tensor(ss, dtype=torch.float32)
        self.out_std_u = torch.tensor(us, dtype=torch.float32).reshape(5, 1, 13, 1, 1)
        self.out_mean_u = torch.tensor(um, dtype=torch.float32).reshape(5, 1, 13, 1, 1)
        self.out_std_s = torch.tensor(ss, dtype=torch.float32).reshape(4, 1, 1, 1)
        self.out_mean_s = torch.tensor(sm, dtype=torch.float32).reshape(4, 1, 1, 1)
        self.upper_constants = torch.zeros(1, 1, 1, 13, lat, lon)
        self.surface_constants = torch.zeros(1, 3, self.hp, lon)

    def add(self, name, module):
        self.add_module(name, module)
        return module

    def roles(self):
        """role -> parameter, in the table's role names."""
        r = {"embed.upper.weight": self.a_embed_u.weight, "embed.upper.bias": self.a_embed_u.bias,
             "embed.surface.weight": self.a_embed_s.weight, "embed.surface.bias": self.a_embed_s.bias,
             "down.norm.gamma": self.down_norm.weight, "down.norm.beta": self.down_norm.bias,
             "down.linear.weight": self.down_linear.weight, "up.linear1.weight": self.up_linear1.weight,
             "up.norm.gamma": self.up_norm.weight, "up.norm.beta": self.up_norm.bias,
             "up.linear2.weight": self.up_linear2.weight,
             "recover.upper.weight": self.rec_u.weight, "recover.upper.bias": self.rec_u.bias,
             "recover.surface.weight": self.rec_s.weight, "recover.surface.bias": self.rec_s.bias}
        for layer in self.layers:
            for b in layer:
                r.update(b.params())
        return r

    def embed(self, upper, surface):
        lat, lon, hp, h1, w1, c = self.lat, self.lon, self.hp, self.h1, self.w1, self.width
        # Normalise with the level-reversed, channel-last statistics.
        u = upper.permute(1, 2, 3, 0).flip(0)
        u = ((u - self.in_mean_u) / self.in_std_u).flip(0).permute(3, 0, 1, 2)
        u = torch.cat([u.reshape(5, 1, 1, 13, lat, lon), self.upper_constants], 0).reshape(6, 13, lat, lon)
        u = F.pad(u, (0, 0, 0, hp - lat, 0, 1))
        u = u.reshape(6, 7, 2, h1, 4, w1, 4).permute(1, 3, 5, 0, 2, 4, 6).reshape(1, 7 * h1 * w1, 192)
        u = self.a_embed_u(u.transpose(1, 2))
        s = ((surface.permute(1, 2, 0) - self.in_mean_s) / self.in_std_s).permute(2, 0, 1)
        s = torch.cat([F.pad(s, (0, 0, 0, hp - lat)).unsqueeze(0), self.surface_constants], 1)
        s = s.reshape(7, h1, 4, w1, 4).permute(1, 3, 0, 2, 4).reshape(1, h1 * w1, 112)
        s = self.a_embed_s(s.transpose(1, 2))
        return torch.cat([s, u], 2).transpose(1, 2).reshape(8, h1, w1, c)

    def recover(self, x):
        lat, lon, hp, h1, w1 = self.lat, self.lon, self.hp, self.h1, self.w1
        n = h1 * w1
        yu = self.rec_u(x[1:].reshape(1, 7 * n, -1).transpose(1, 2))
        yu = yu.reshape(5, 2, 4, 4, 7, h1, w1).permute(0, 4, 1, 5, 2, 6, 3).reshape(5, 14, hp, lon)
        yu = yu[:, :13, :lat].reshape(5, 1, 13, lat, lon) * self.out_std_u + self.out_mean_u
        ys = self.rec_s(x[0].reshape(1, n, -1).transpose(1, 2))
        ys = ys.reshape(4, 4, 4, h1, w1).permute(0, 3, 1, 4, 2).reshape(4, hp, lon)
        ys = ys[:, :lat].reshape(4, 1, lat, lon) * self.out_std_s + self.out_mean_s
        return yu.reshape(5, 13, lat, lon), ys.reshape(4, lat, lon)

    def forward(self, upper, surface):
        x = self.embed(upper, surface)
        for b in self.layers[0]:
            x = b(x)
        x0 = x
        z, h, w, c = x.shape
        x = F.pad(x, (0, 0, 0, 0, 0, 2 * self.h2 - self.h1))
        x = x.reshape(z, self.h2, 2, w // 2, 2, c).permute(0, 1, 3, 2, 4, 5).reshape(z, self.h2, w // 2, 4 * c)
        x = self.down_linear(self.down_norm(x))
        for b in self.layers[1] + self.layers[2]:
            x = b(x)
        z, h, w, _ = x.shape
        c = self.width
        x = self.up_linear1(x).reshape(z, h, w, 2, 2, c).permute(0, 1, 3, 2, 4, 5).reshape(z, 2 * h, 2 * w, c)
        x = self.up_linear2(self.up_norm(x[:, :self.h1]))
        for b in self.layers[3]:
            x = b(x)
        return self.recover(torch.cat([x0, x], -1))


class Released(nn.Module):
    def __init__(self, *a):
        super().__init__()
        self.b1 = Core(*a)

    def forward(self, upper, surface):
        return self.b1(upper, surface)


def fill_random(m, seed):
    """Weights at training-like scale (fan-in uniform Linears, norms near 1,
    earth bias and maps of order 1), the constants' maps included."""
    g = torch.Generator().manual_seed(seed)
    u = lambda shape, center, scale: center + scale * (2 * torch.rand(shape, generator=g) - 1)  # noqa: E731
    with torch.no_grad():
        for role, p in sorted(m.b1.roles().items()):
            last = role.rsplit(".", 1)[1]
            if last == "gamma":
                p.copy_(u(p.shape, 1.0, 0.2))
            elif last == "beta":
                p.copy_(u(p.shape, 0.0, 0.1))
            elif role.endswith("earth_bias"):
                p.copy_(u(p.shape, 0.0, 0.5))
            elif last == "bias":
                p.copy_(u(p.shape, 0.0, 0.02))
            else:
                fan_in = p.shape[1] * (p.shape[2] if p.dim() == 3 else 1)
                p.copy_(u(p.shape, 0.0, 1.0 / math.sqrt(fan_in)))
        b1 = m.b1
        b1.upper_constants = u(b1.upper_constants.shape, 0.0, 1.0)
        b1.surface_constants = u(b1.surface_constants.shape, 0.0, 1.0)


def fill_rows(m, table):
    """Every tensor of role row k holds k (the mapping test's marker)."""
    rows = {role: k for k, _, role, _ in table}
    with torch.no_grad():
        for role, p in m.b1.roles().items():
            p.fill_(float(rows[role]))


def export(m, path, opset, lat, lon):
    args = (torch.zeros(5, 13, lat, lon), torch.zeros(4, lat, lon))
    torch.onnx.export(m, args, path, dynamo=False, opset_version=opset, do_constant_folding=True,
                      input_names=["input", "input_surface"], output_names=["output", "output_surface"])


def scramble(path, seed):
    """Renames every initializer, value and node, and rewrites the nodes in
    another topological order (ready nodes taken last-first)."""
    import onnx
    model = onnx.load(path)
    gr = model.graph
    rng = np.random.default_rng(seed)
    keep = {v.name for v in gr.input} | {v.name for v in gr.output}
    rename = {}
    for t in gr.initializer:
        rename[t.name] = f"w{rng.integers(1 << 40):x}"
        t.name = rename[t.name]
    for n in gr.node:
        for o in n.output:
            if o not in keep:
                rename[o] = f"v{rng.integers(1 << 40):x}"
        n.name = f"n{rng.integers(1 << 40):x}"
    for n in gr.node:
        n.input[:] = [rename.get(i, i) for i in n.input]
        n.output[:] = [rename.get(o, o) for o in n.output]
    nodes = list(gr.node)
    have = {v.name for v in gr.input} | {t.name for t in gr.initializer} | {""}
    order, left = [], list(range(len(nodes)))
    while left:
        ready = [i for i in left if all(x in have for x in nodes[i].input)]
        i = ready[-1]
        order.append(nodes[i])
        have.update(nodes[i].output)
        left.remove(i)
    del gr.node[:]
    gr.node.extend(order)
    onnx.checker.check_model(model)
    onnx.save(model, path)


def run_ort(path, upper, surface):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    s = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    return s.run(None, {"input": upper, "input_surface": surface})


def sha(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out")
    ap.add_argument("--full-size", metavar="FILE")
    args = ap.parse_args()
    if args.full_size:
        m = Released(721, 1440, 192, (2, 6, 6, 2), read_table()).eval()
        fill_random(m, 24)
        with torch.no_grad():
            export(m, args.full_size, 17, 721, 1440)
        print(f"{args.full_size}: {os.path.getsize(args.full_size)} bytes")
        return
    if not args.out:
        ap.error("--out or --full-size is required")
    import onnx
    import onnxruntime
    os.makedirs(args.out, exist_ok=True)
    table = read_table()
    lat, lon, width, seed = 9, 96, 32, 1
    torch.manual_seed(0)
    upper, surface = pm.seeded_inputs(lat, lon, seed)
    files = {}
    for name, depths, opset, wseed in (("net", (2, 2, 2, 2), 17, 11), ("variant", (1, 1, 1, 1), 14, 12)):
        m = Released(lat, lon, width, depths, table).eval()
        fill_random(m, wseed)
        path = os.path.join(args.out, f"{name}.onnx")
        export(m, path, opset, lat, lon)
        if name == "variant":
            scramble(path, wseed)
        ou, os_ = run_ort(path, upper, surface)
        with torch.no_grad():
            tu, ts = m(torch.from_numpy(upper), torch.from_numpy(surface))
        err = max(float(np.abs(ou - tu.numpy()).max()), float(np.abs(os_ - ts.numpy()).max()))
        print(f"{name}: onnxruntime vs torch max abs {err:.3e}", flush=True)
        np.save(os.path.join(args.out, f"{name}_ort_upper.npy"), ou)
        np.save(os.path.join(args.out, f"{name}_ort_surface.npy"), os_)
        files[name] = {"depths": list(depths), "width": width, "grid": [lat, lon], "opset": opset,
                       "weight_seed": wseed, "ort_vs_torch_max_abs": err}
    np.save(os.path.join(args.out, "input_upper.npy"), upper)
    np.save(os.path.join(args.out, "input_surface.npy"), surface)
    m = Released(lat, lon, width, (2, 6, 6, 2), table).eval()
    fill_rows(m, table)
    export(m, os.path.join(args.out, "full.onnx"), 17, lat, lon)
    files["full"] = {"depths": [2, 6, 6, 2], "width": width, "grid": [lat, lon], "opset": 17,
                     "values": "row index of the role in released-initializers.csv"}
    man = {"command": "python benches/pangu_onnx.py --out pangu/tests/fixtures/onnx",
           "torch": torch.__version__, "onnx": onnx.__version__, "onnxruntime": onnxruntime.__version__,
           "input_seed": seed, "files": files,
           "sha256": {f: sha(os.path.join(args.out, f)) for f in sorted(os.listdir(args.out))
                      if f.endswith(".onnx") or f.endswith(".npy")}}
    for name in ("net", "variant", "full"):
        path = os.path.join(args.out, f"{name}.onnx")
        with open(path, "rb") as f:
            data = f.read()
        with open(path + ".gz", "wb") as f:
            f.write(gzip.compress(data, compresslevel=9, mtime=0))
        os.remove(path)
    with open(os.path.join(args.out, "manifest.json"), "w") as f:
        json.dump(man, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
