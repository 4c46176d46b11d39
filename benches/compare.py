#!/usr/bin/env python3
"""Ratio table: the wavefuse harness against its PyTorch peers, same run.

    python3 benches/compare.py DIR                    # DIR/results.jsonl + DIR/peers.jsonl
    python3 benches/compare.py RESULTS.jsonl PEERS.jsonl [--out TABLE.md]

RESULTS is the harness's results.jsonl (one record per case: variant, shape,
median_us, copy_median_us, pct_of_copy, bytes, correct, ...); PEERS is
benches/peers.py's output (one record per variant, shape, impl). Rows are
joined on (variant, shape); a harness record may carry a "peer_shape" field,
which is then used instead of its "shape" for the join (the gather family's
harness shape strings are not fixed). Speedup = peer median / wavefuse
median (> 1 means wavefuse is faster). Standard library only; importable
(load_jsonl, join, markdown).
"""

import argparse
import json
import math
import os
import sys


def load_jsonl(path):
    """Records of a JSON lines file; blank and unparsable lines are skipped
    (with a note on stderr)."""
    out = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                out.append(json.loads(line))
            except ValueError as e:
                print(f"{path}:{n}: skipped ({e})", file=sys.stderr)
    return out


def _num(v):
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return v if math.isfinite(v) else None


def join(results, peers):
    """One row per (variant, shape): harness order first, then peer-only keys
    in peer order. A row: {variant, shape, harness: rec|None,
    peers: {impl: rec}}. A later record for the same key replaces an earlier
    one."""
    rows = {}
    order = []

    def row(key):
        if key not in rows:
            rows[key] = {"variant": key[0], "shape": key[1], "harness": None, "peers": {}}
            order.append(key)
        return rows[key]

    for r in results:
        key = (r.get("variant"), r.get("peer_shape") or r.get("shape"))
        row(key)["harness"] = r
    for p in peers:
        key = (p.get("variant"), p.get("shape"))
        row(key)["peers"][p.get("impl")] = p
    return [rows[k] for k in order]


def _us(v):
    return "—" if v is None else (f"{v:.1f}" if v < 1000 else f"{v:.0f}")


def _peer_us(row, impl):
    p = row["peers"].get(impl)
    if p is None:
        return None, "—"
    if p.get("error"):
        return None, "error"
    v = _num(p.get("median_us"))
    return v, _us(v)


def _ratio(peer, ours):
    if peer is None or ours is None or ours <= 0:
        return "—"
    return f"{peer / ours:.2f}x"


def markdown(rows, title=None):
    """The ratio table as markdown (with notes under it when needed)."""
    lines = []
    if title:
        lines += [f"## {title}", ""]
    lines.append("| variant | shape | wavefuse µs | % of copy | eager µs | compile µs "
                 "| max-autotune µs | torch copy µs | vs eager | vs compile | vs best torch |")
    lines.append("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    notes = []
    for r in rows:
        h = r["harness"]
        ours = _num(h.get("median_us")) if h else None
        cell = _us(ours)
        if h is not None and h.get("correct") is False:
            cell += " ✗"
            notes.append(f"{r['variant']} {r['shape']}: the harness marked the output incorrect (✗).")
        pct = _num(h.get("pct_of_copy")) if h else None
        e, es = _peer_us(r, "eager")
        c, cs = _peer_us(r, "compile")
        m, ms = _peer_us(r, "compile_max_autotune")
        _, cps = _peer_us(r, "copy")
        best = min((v for v in (e, c, m) if v is not None), default=None)
        lines.append(
            f"| {r['variant']} | {r['shape']} | {cell} | "
            f"{'—' if pct is None else f'{pct:.0f}%'} | {es} | {cs} | {ms} | {cps} | "
            f"{_ratio(e, ours)} | {_ratio(c, ours)} | {_ratio(best, ours)} |")
        hb = h.get("bytes") if h else None
        pb = next((p.get("bytes") for p in r["peers"].values() if p.get("bytes") is not None), None)
        if hb is not None and pb is not None and hb != pb:
            notes.append(f"{r['variant']} {r['shape']}: byte counts differ "
                         f"(harness {hb}, peers {pb}); times are still comparable, GB/s are not.")
        for impl, p in r["peers"].items():
            if p.get("error"):
                first = str(p["error"]).strip().splitlines()[0][:160] if str(p["error"]).strip() else "?"
                notes.append(f"{r['variant']} {r['shape']} {impl}: {first}")
            if p.get("matches_gather") is False:
                notes.append(f"{r['variant']} {r['shape']} {impl}: index_select output differs from the partition.")
    lines.append("")
    lines.append("Speedup = torch median / wavefuse median (>1: wavefuse faster). "
                 "% of copy = same-byte device copy median / kernel median, both from the harness run; "
                 "torch copy µs is the same-byte copy measured in the peers run. "
                 "— = not measured in that run.")
    if notes:
        lines += ["", "Notes:", ""] + [f"- {n}" for n in notes]
    lines += same_process(rows)
    return "\n".join(lines) + "\n"


def same_process(rows):
    """Rows where peers.py also timed wavefuse's kernel itself (impl
    "wavefuse", --wavefuse-ptx): the same tensors and timer as torch.compile,
    in one process. Empty when there are none."""
    out = []
    for r in rows:
        w = r["peers"].get("wavefuse")
        if w is None:
            continue
        wv, ws = _peer_us(r, "wavefuse")
        c, cs = _peer_us(r, "compile")
        _, cps = _peer_us(r, "copy")
        diff = _num(w.get("max_abs_diff_vs_eager"))
        out.append(f"| {r['variant']} | {r['shape']} | {ws} | {cs} | {cps} | {_ratio(c, wv)} | "
                   f"{'—' if diff is None else f'{diff:.3g}'} |")
    if not out:
        return []
    return ["", "Same process: wavefuse's kernel launched by peers.py (--wavefuse-ptx) on the "
            "tensors torch.compile is timed on, with the same events and rotation:", "",
            "| variant | shape | wavefuse µs | compile µs | torch copy µs | vs compile "
            "| max abs diff vs eager |",
            "|---|---|---:|---:|---:|---:|---:|"] + out


def main(argv=None):
    ap = argparse.ArgumentParser(description="wavefuse vs PyTorch ratio table (markdown)")
    ap.add_argument("paths", nargs="+", help="DIR, or RESULTS.jsonl PEERS.jsonl")
    ap.add_argument("--out", help="also write the table to this file")
    args = ap.parse_args(argv)
    if len(args.paths) == 1 and os.path.isdir(args.paths[0]):
        res = os.path.join(args.paths[0], "results.jsonl")
        peers = os.path.join(args.paths[0], "peers.jsonl")
    elif len(args.paths) == 2:
        res, peers = args.paths
    else:
        ap.error("give DIR or RESULTS.jsonl PEERS.jsonl")
    results = load_jsonl(res) if os.path.exists(res) else []
    peer_recs = load_jsonl(peers) if os.path.exists(peers) else []
    if not results and not peer_recs:
        print(f"no records in {res} or {peers}", file=sys.stderr)
        return 1
    for path, recs in ((res, results), (peers, peer_recs)):
        if not recs:
            print(f"note: no records from {path}", file=sys.stderr)
    table = markdown(join(results, peer_recs))
    sys.stdout.write(table)
    if args.out:
        with open(args.out, "w") as f:
            f.write(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
