#!/usr/bin/env python3
"""Fails when a tracked file reads like a lab notebook.

    python3 tools/prose_check.py

The repository speaks of the code, not of how it was made: history lives in
git and numbers live in `docs/bench/*.jsonl`. This scans every tracked text
file (recorded JSON, test fixtures and code objects aside) for

- work-log references: a numbered or ordinal work period (`PATTERNS`);
- run labels: a short letter-and-number label after "run", or with "'s";
- absolute paths under a machine's home or work folders.

Each hit is printed as FILE:LINE: text; the exit code is 1 when there is one.
Standard library only.
"""

import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

ORDINALS = ("first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|"
            "thirteenth|fourteenth|fifteenth|sixteenth|seventeenth|eighteenth|nineteenth|twentieth|"
            "thirtieth|fortieth")
PATTERNS = [
    ("work-log", re.compile(r"\b(?:(?:twenty|thirty|forty)-)?(?:" + ORDINALS + r")(?: and \w+)? sessions?\b",
                            re.I)),
    ("work-log", re.compile(r"\bsessions? \d+\b", re.I)),
    ("run label", re.compile(r"\bruns? \**[A-Za-z]{1,3}\d{1,3}[a-z]?\b(?!\.)")),
    ("run label", re.compile(r"\b(?!f16|f32|f64)(?:G|K|ab|ln|attn|h|r|s|d|c|x|g|n|p|f|e|b)\d{1,2}'s\b")),
    ("machine path", re.compile(r"(?<![\w.])/(?:home|work|Users|root|mnt/c)/[\w.-]+")),
]

# Recorded data and binary or generated artefacts the patterns do not apply to.
SKIP = re.compile(r"^(docs/bench/.*\.jsonl|tests/data/|host/kernels/|.*\.(svg|npy|safetensors|elf|ptx|lock)$)")


def tracked():
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    return [p for p in out.decode().split("\0") if p and not SKIP.match(p)]


def main():
    me = os.path.relpath(os.path.abspath(__file__), ROOT)
    hits = 0
    for path in tracked():
        if path == me:
            continue
        try:
            text = open(os.path.join(ROOT, path), encoding="utf-8").read()
        except (UnicodeDecodeError, FileNotFoundError):
            continue
        for n, line in enumerate(text.splitlines(), 1):
            for what, pat in PATTERNS:
                m = pat.search(line)
                if m:
                    print(f"{path}:{n}: {what} '{m.group(0)}': {line.strip()[:160]}")
                    hits += 1
                    break
    if hits:
        print(f"prose_check: {hits} line(s) read like a lab notebook: state the fact, or move the number "
              "into docs/bench", file=sys.stderr)
        return 1
    print("prose_check: no work-log entries, run labels or machine paths in tracked files", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
