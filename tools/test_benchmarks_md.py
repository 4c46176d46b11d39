#!/usr/bin/env python3
"""Tests of the whole-model page's memory rules in benchmarks_md.py: which
PyTorch peak counts as a step's peak, and what record-model keeps.

    python3 tools/test_benchmarks_md.py

Standard library only (CI runs it beside `benchmarks_md.py --check`).
"""

import json
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchmarks_md as bm  # noqa: E402

GIB = 2**30
OURS = {"impl": "wavefuse f16", "median_ms": 50.0, "peak_allocated_bytes": 2 * GIB,
        "peak_reserved_bytes": 3 * GIB}
DEFAULT = {"impl": "torch.compile default f16", "median_ms": 100.0, "peak_allocated_bytes": int(2.5 * GIB),
           "peak_reserved_bytes": 4 * GIB, "resident_bytes": GIB // 2}
# Max-autotune replaying CUDA graphs: over the timed steps its peak is its
# resident bytes.
GRAPHS = {"impl": "torch.compile max-autotune f16", "median_ms": 90.0, "peak_allocated_bytes": GIB // 2 + 1024,
          "peak_reserved_bytes": 4 * GIB, "resident_bytes": GIB // 2}


def verdicts(*compiled):
    return bm.model_verdicts([OURS, *compiled], None, None, OURS, list(compiled))


def memory_line(lines):
    return next(v for v in lines if v.startswith("Memory:"))


class StepPeak(unittest.TestCase):
    def test_graph_mode_is_not_the_lowest_peak(self):
        lines = verdicts(DEFAULT, GRAPHS)
        self.assertIn("0.80x torch.compile's lowest measured peak (torch.compile default f16", memory_line(lines))
        self.assertIn("met", memory_line(lines))
        graphs = [v for v in lines if "replays CUDA graphs" in v]
        self.assertEqual(len(graphs), 1, lines)
        self.assertIn("wavefuse 3.00 GiB, torch.compile max-autotune f16 4.00 GiB (0.75x)", graphs[0])

    def test_graph_mode_with_a_warmup_peak_counts(self):
        g = dict(GRAPHS, warmup_peak_allocated_bytes=int(1.6 * GIB))
        lines = verdicts(DEFAULT, g)
        self.assertIn("1.25x torch.compile's lowest measured peak (torch.compile max-autotune f16, 1.60 GiB); "
                      "bar 1.0x: not met", memory_line(lines))
        self.assertFalse(any("replays CUDA graphs" in v for v in lines), lines)
        table = "\n".join(bm.model_step_table([OURS, DEFAULT, g], OURS))
        self.assertIn("| 1.60 (warm-up, where its CUDA graphs are recorded) |", table)

    def test_a_peak_above_resident_is_a_peak(self):
        d = dict(DEFAULT, peak_allocated_bytes=GIB // 2 + 2 * 2**20 + 1)
        self.assertFalse(bm.graph_pool(d))
        self.assertEqual(bm.step_peak(d), GIB // 2 + 2 * 2**20 + 1)

    def test_held_bytes_are_left_out(self):
        d = dict(DEFAULT, held_bytes=GIB // 4)
        self.assertEqual(bm.step_peak(d), int(2.25 * GIB))
        lines = verdicts(d)
        self.assertIn("0.89x", memory_line(lines))
        self.assertTrue(any("leaves out 0.25 GiB" in v for v in lines), lines)
        table = "\n".join(bm.model_step_table([OURS, d], OURS))
        self.assertIn("| 2.25 (held bytes left out) |", table)


def write_run(d, torch_json):
    with open(os.path.join(d, "meta-1.txt"), "w") as f:
        f.write("date: 2026-01-01 00:00 UTC\ncommit: abc\ndirty: false\ngpu: G\ndriver: 1\n"
                "torch: 2.0 13.0\ncommand: run.sh OUT torch full\n")
    with open(os.path.join(d, "torch.json"), "w") as f:
        json.dump(torch_json, f)


class RecordModel(unittest.TestCase):
    def record(self, torch_json):
        with tempfile.TemporaryDirectory() as d, tempfile.TemporaryDirectory() as bench:
            write_run(d, torch_json)
            old = bm.BENCH_DIR
            bm.BENCH_DIR = bench
            try:
                self.assertEqual(bm.record_model(type("A", (), {"dir": d, "name": "t"})()), 0)
                with open(os.path.join(bench, "t.jsonl")) as f:
                    return {r["impl"]: r for r in map(json.loads, f)}
            finally:
                bm.BENCH_DIR = old

    def torch_json(self, **extra):
        mode = {"median_ms": 1.0, "samples_ms": [1.0], "max_allocated_bytes": 5, "max_reserved_bytes": 6,
                "resident_bytes": 4, "warmup_max_allocated_bytes": 7}
        return {"lat": 3, "lon": 4, "order": "post", "warmup": 1, "steps": 1,
                "modes": {"eager": dict(mode), "default": dict(mode)}, **extra}

    def test_old_script_held_eagers_outputs(self):
        recs = self.record(self.torch_json())
        self.assertNotIn("held_bytes", recs["PyTorch eager f16"])
        self.assertEqual(recs["torch.compile default f16"]["held_bytes"], 4 * 69 * 3 * 4)
        self.assertEqual(recs["torch.compile default f16"]["warmup_peak_allocated_bytes"], 7)
        self.assertEqual(recs["torch.compile default f16"]["resident_bytes"], 4)

    def test_host_outputs_hold_nothing(self):
        recs = self.record(self.torch_json(eager_outputs="host"))
        self.assertNotIn("held_bytes", recs["torch.compile default f16"])


if __name__ == "__main__":
    unittest.main()
