#!/usr/bin/env bash
# Runs on the GPU host (copied into the bundle as profile.sh): per-kernel
# registers and spills (ptxas -v), SASS instruction counts, and Nsight
# Compute sections for one steady-state launch of each harness case.
#   profile.sh OUTDIR ["case1 case2 ..."]   (harness case names; all by default)
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:?usage: profile.sh OUTDIR [CASES]}"; cases="${2:-}"
mkdir -p "$out"
ptx="$here/ptx/wavefuse_sm_90.ptx"
if command -v ptxas >/dev/null && [ -f "$ptx" ]; then
  ptxas -arch=sm_90 -O3 -v "$ptx" -o "$out/wavefuse_sm_90.cubin" > "$out/ptxas.txt" 2>&1
  cuobjdump -sass "$out/wavefuse_sm_90.cubin" > "$out/sass.txt" 2>&1
  # instructions per kernel (static count)
  awk '/Function :/ {f=$3} /^ +\/\*[0-9a-f]+\*\// {n[f]++} END {for (k in n) print n[k], k}' "$out/sass.txt" | sort -k2 > "$out/sass-counts.txt"
fi
[ -n "$cases" ] || cases="layer_norm add_layer_norm gather layer_norm_gather add_layer_norm_gather bias_gelu qkv_split bias_mask_add bias_mask_softmax"
command -v ncu >/dev/null || { echo "no ncu" > "$out/ncu.txt"; exit 0; }
for c in $cases; do
  # skip the cold launch and warm-up; one launch of the first shape
  ncu --clock-control none -k regex:'^wf_' --launch-skip 8 --launch-count 1 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables \
    --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats \
    --section ComputeWorkloadAnalysis --section InstructionStats \
    "$here/bin/wavefuse-suite" --backend cuda --only "$c" --reps 3 --out "$out/h-$c" \
    > "$out/ncu-$c.txt" 2>&1
  echo "$c: rc=$?" >> "$out/ncu.txt"
done
