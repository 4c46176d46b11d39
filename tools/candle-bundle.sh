#!/usr/bin/env bash
# Builds candle-bundle/: a self-contained folder that runs the Pangu-Weather
# stage on candle (CUDA) against the PyTorch reference on a GPU host with no
# Rust toolchain and no network (glibc >= 2.36, CUDA 13 driver and
# libraries, python3 with torch). The binary links candle's CUDA libraries
# dynamically (the host's own, found through its ldconfig); it is built
# here against link stubs (tools/cuda-toolkit.sh).
#   tools/candle-bundle.sh                 # build
#   candle-bundle/run.sh OUTDIR [PHASES] [SCALES]   # on the GPU host
# PHASES: comma list of gen,candle,check,bench (default all); SCALES: s1,s2.
# The stripped binary is xz-compressed: run.sh unpacks it (a GPU call
# carries at most 64 MiB).
set -euo pipefail
cd "$(dirname "$0")/.."
eval "$(bash tools/cuda-toolkit.sh)"
# sm_90 PTX for wavefuse's kernels (the H200); no AMD objects in this binary.
export WAVEFUSE_AMD_ARCHS= WAVEFUSE_PTX_ARCHS=sm_90
cargo build --release -p wavefuse-candle --features cuda --example pangu_stage --target-dir target/cuda
rm -rf candle-bundle && mkdir -p candle-bundle
cp target/cuda/release/examples/pangu_stage candle-bundle/pangu_stage
strip candle-bundle/pangu_stage
echo "stripped pangu_stage: $(stat -c %s candle-bundle/pangu_stage) bytes"
xz -T2 -6 candle-bundle/pangu_stage
cp benches/pangu_ref.py candle-bundle/
git rev-parse HEAD > candle-bundle/COMMIT 2>/dev/null || true
cat > candle-bundle/run.sh <<'RUN'
#!/usr/bin/env bash
# On the GPU host: weights, candle builds, gate-2 check, timing. Logs to $1.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:?usage: run.sh OUTDIR [PHASES: gen,candle,check,bench] [SCALES: s1,s2]}"
phase="${2:-gen,candle,check,bench}"; scales="${3:-s1,s2}"
has() { [[ ",$phase," == *",$1,"* ]]; }
py="${PYTHON:-python3}"
# CANDLE_DEVICE=cpu with scale tiny: a smoke test of this script off the GPU.
device="${CANDLE_DEVICE:-cuda}"
mkdir -p "$out"
bin="$out/pangu_stage"
[ -x "$bin" ] || { xz -dc "$here/pangu_stage.xz" > "$bin" && chmod +x "$bin"; }
{ echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "commit: $(cat "$here/COMMIT" 2>/dev/null)"
  echo "nvidia-smi: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)"
  echo "torch: $("$py" -c 'import torch; print(torch.__version__, torch.version.cuda)' 2>&1)"
  echo "command: candle-bundle/run.sh $*"; } > "$out/meta.txt"
# Weights live beside the outputs; the big input tensors are not packed.
wdir="$out/weights"; mkdir -p "$wdir"
if has gen; then
  "$py" "$here/pangu_ref.py" gen --dir "$wdir" --scales "$scales" 2>&1 | tee "$out/gen.txt"
fi
if has candle; then
  for s in ${scales//,/ }; do
    "$bin" --scale "$s" --weights "$wdir/pangu_$s.safetensors" --device "$device" \
      --build "${CANDLE_BUILDS:-candle,wavefuse}" --out "$wdir" --reps "${CANDLE_REPS:-30}" 2>&1 | tee -a "$out/candle.txt"
  done
fi
if has check; then
  "$py" "$here/pangu_ref.py" check --dir "$wdir" --scales "$scales" --device "$device" 2>&1 | tee "$out/check.txt"
fi
if has bench; then
  PYTHONUNBUFFERED=1 "$py" "$here/pangu_ref.py" bench --dir "$wdir" --scales "$scales" --device "$device" \
    --modes "${TORCH_MODES:-eager,default,max-autotune}" --parts "${TORCH_PARTS:-stage,block0,block1}" \
    2>"$out/bench.err" | tee "$out/bench.txt"
fi
cp "$wdir/pangu_ref.jsonl" "$out/" 2>/dev/null
# At most a few files come back from a device run: pack the logs (not the
# weights and outputs).
tar czf "$out.tgz" -C "$out" --exclude=weights --exclude=pangu_stage . && echo "packed $out.tgz"
RUN
chmod +x candle-bundle/run.sh
du -sh candle-bundle; ls -la candle-bundle
