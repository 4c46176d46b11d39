#!/usr/bin/env bash
# Builds pangu-bundle/: a self-contained folder that runs the whole
# Pangu-Weather network's GPU gates on a host with no Rust toolchain and no
# network (glibc >= 2.36, CUDA 13 driver and libraries, python3 with torch
# and safetensors): the `pangu` binary (candle + wavefuse, CUDA) and the
# PyTorch reference of the whole network (benches/pangu_model.py).
#   tools/pangu-bundle.sh                          # build, here
#   pangu-bundle/run.sh OUTDIR [PHASES] [GRID]     # on the GPU host
# PHASES, a comma list, in this order:
#   gen       seeded post-norm weights + inputs (the Rust generator; the
#             reference reads the same file)
#   ref       the f32 and f16 PyTorch reference of one step
#   rust      `pangu bench`: GPU-resident step time, peak device memory,
#             per-op breakdown, one step's output, one step's
#             device-to-host copy + npy write alone; then the same step
#             with the MLP unchunked (--mlp-chunks 1)
#   check     regression gate: Rust f16 against the f32 reference, per
#             channel, bar = PyTorch's own f16 eager; plus the swap test
#   rollout   `pangu forecast` 7 x 24 h from host arrays to files per step
#   torch     PyTorch peers: eager f16 and torch.compile default
#   autotune  torch.compile max-autotune (TORCH_AUTOTUNE_TIMEOUT seconds
#             for its compile, default 420)
#   fit       the smallest card: for each FIT_GIB size (default 6 5 4 3.5
#             3), a second process holds all but that much of the device
#             memory and `pangu bench` runs 1 + 3 steps in what is left
# Default: gen,ref,rust,check,rollout,torch. GRID: full (721 x 1440,
# default) or LATxLON. Each phase writes OUTDIR/<phase>.txt and, where it
# measures, OUTDIR/<phase>.json; run.sh packs OUTDIR's logs into
# OUTDIR.tgz. The weights and the fields stay in PANGU_DATA (default
# OUTDIR/data; a later call on a warm machine reuses them, gen skips what
# is there).
# PANGU_DEVICE=cpu with a small grid: a smoke test of this script off the GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
eval "$(bash tools/cuda-toolkit.sh)"
# sm_90 PTX for wavefuse's kernels (H100 / H200); no AMD objects here.
export WAVEFUSE_AMD_ARCHS= WAVEFUSE_PTX_ARCHS=sm_90
cargo build --release -p pangu --features cuda --bin pangu --target-dir target/cuda
rm -rf pangu-bundle && mkdir -p pangu-bundle
cp target/cuda/release/pangu pangu-bundle/pangu
strip pangu-bundle/pangu
echo "stripped pangu: $(stat -c %s pangu-bundle/pangu) bytes"
# A GPU call carries at most 64 MiB: run.sh unpacks the binary.
xz -T2 -6 pangu-bundle/pangu
cp benches/pangu_model.py pangu-bundle/
{ echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)"
  if [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then echo "dirty: true"; else echo "dirty: false"; fi; } \
  > pangu-bundle/build.txt
cat > pangu-bundle/run.sh <<'RUN'
#!/usr/bin/env bash
# On the GPU host: the whole Pangu network's gates. See tools/pangu-bundle.sh.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:?usage: run.sh OUTDIR [PHASES] [GRID]}"
phase="${2:-gen,ref,rust,check,rollout,torch}"; grid="${3:-full}"
has() { [[ ",$phase," == *",$1,"* ]]; }
py="${PYTHON:-python3}"
device="${PANGU_DEVICE:-cuda}"
case "$grid" in
  full) lat=721; lon=1440 ;;
  *x*) lat="${grid%x*}"; lon="${grid#*x}" ;;
  *) echo "GRID: full or LATxLON, not $grid"; exit 2 ;;
esac
mkdir -p "$out"
data="${PANGU_DATA:-$out/data}"; mkdir -p "$data"
bin="$data/pangu"
[ -x "$bin" ] || { xz -dc "$here/pangu.xz" > "$bin" && chmod +x "$bin"; } || exit 1
ref="$here/pangu_model.py"
w="$data/weights_post_${lat}x${lon}.safetensors"
{ echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
  cat "$here/build.txt" 2>/dev/null
  echo "nvidia-smi: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)"
  echo "gpu: $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)"
  echo "driver: $(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1)"
  echo "torch: $("$py" -c 'import torch; print(torch.__version__, torch.version.cuda)' 2>&1)"
  echo "grid: $lat x $lon"
  echo "command: tools/pangu-bundle.sh && pangu-bundle/run.sh OUT $phase $grid"; } > "$out/meta-$(date +%s).txt"
# Each phase: its log in $out/<phase>.txt, its status line in $out/status.txt.
step() {
  local name="$1"; shift
  local t0=$SECONDS
  "$@" > "$out/$name.txt" 2>&1
  local rc=$?
  echo "$name: rc $rc, $((SECONDS - t0)) s" | tee -a "$out/status.txt"
  tail -n "${TAIL:-25}" "$out/$name.txt"
  return $rc
}
if has gen; then
  if [ -f "$w" ] && [ -f "$data/input_upper.npy" ]; then
    echo "gen: reusing $w"
  else
    step gen "$bin" random-weights --out "$w" --grid "${lat}x${lon}" --order post --seed 1 --interval 24 \
      --inputs "$data" || exit 1
  fi
fi
if has ref; then
  rm -rf "$data/ref"
  step ref "$py" "$ref" reference --weights "$w" --upper "$data/input_upper.npy" \
    --surface "$data/input_surface.npy" --out "$data/ref" --device "$device" --steps 1 --log "$out/ref.jsonl"
fi
if has rust; then
  rm -rf "$data/rust"
  step rust "$bin" bench --weights "$w" --upper "$data/input_upper.npy" --surface "$data/input_surface.npy" \
    --device "$device" --warmup 5 --steps "${STEPS:-30}" --write-dir "$data/rust" --json "$out/rust.json"
  # The same without the MLP's row chunks: what they save and cost.
  step rust-unchunked "$bin" bench --weights "$w" --upper "$data/input_upper.npy" \
    --surface "$data/input_surface.npy" --device "$device" --warmup 5 --steps "${STEPS:-30}" --mlp-chunks 1 \
    --json "$out/rust-unchunked.json"
fi
if has check; then
  step check "$py" "$ref" check --ref "$data/ref" --rust "$data/rust" --swap-test --json "$out/check.json" \
    --log "$out/check.jsonl"
fi
if has rollout; then
  rm -rf "$data/forecast"
  step rollout "$bin" forecast --weights "24h=$w" --upper "$data/input_upper.npy" \
    --surface "$data/input_surface.npy" --lead 7d --out "$data/forecast" --device "$device" \
    --json "$out/rollout.json" --quiet
  ls -la "$data/forecast" >> "$out/rollout.txt" 2>&1
  # The rollout's first step went through the page-locked staging: it must
  # equal the bench's written step (same weights, same input).
  for k in upper surface; do
    "$py" -c 'import sys, numpy as np; a, b = np.load(sys.argv[1]), np.load(sys.argv[2])
print(sys.argv[3], "rollout +24 h vs bench output: shapes", a.shape, b.shape, "max abs diff",
      float(np.abs(a.astype("f8") - b).max()) if a.shape == b.shape else "n/a")' \
      "$data/forecast/output_${k}_024h.npy" "$data/rust/output_${k}_024h.npy" "$k" 2>&1 | tee -a "$out/rollout.txt"
  done
fi
if has torch; then
  PYTHONUNBUFFERED=1 step torch "$py" "$ref" bench --weights "$w" --lat "$lat" --lon "$lon" --seed 1 \
    --device "$device" --modes "${TORCH_MODES:-eager,default}" --warmup 5 --steps "${STEPS:-30}" \
    --json "$out/torch.json" --compile-timeout "${TORCH_COMPILE_TIMEOUT:-300}"
fi
if has autotune; then
  PYTHONUNBUFFERED=1 step autotune "$py" "$ref" bench --weights "$w" --lat "$lat" --lon "$lon" --seed 1 \
    --device "$device" --modes max-autotune --warmup 5 --steps "${STEPS:-30}" \
    --json "$out/autotune.json" --compile-timeout "${TORCH_AUTOTUNE_TIMEOUT:-420}"
fi
if has fit; then
  # What a card with only FREE GiB available gives the model: a ballast
  # process (torch) allocates all the device memory but FREE GiB and
  # holds it while `pangu bench` opens its context, loads the weights and
  # runs. free_bytes is what the card had left for it, as the driver says.
  for gib in ${FIT_GIB:-6 5 4 3.5 3}; do
    ready="$data/ballast-$gib.ready"; rm -f "$ready"
    "$py" - "$gib" "$ready" > "$out/ballast-$gib.txt" 2>&1 <<'PY' &
import sys, time, torch
keep = int(float(sys.argv[1]) * 2**30)
free, _ = torch.cuda.mem_get_info()
ballast = torch.empty(max(free - keep, 0), dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
with open(sys.argv[2], "w") as f:
    f.write(str(torch.cuda.mem_get_info()[0]))
time.sleep(900)
PY
    bp=$!
    for _ in $(seq 240); do [ -s "$ready" ] && break; sleep 0.5; done
    left=$(cat "$ready" 2>/dev/null || echo 0)
    t0=$SECONDS
    "$bin" bench --weights "$w" --upper "$data/input_upper.npy" --surface "$data/input_surface.npy" \
      --device "$device" --warmup 1 --steps 3 --json "$out/fit-$gib.json" > "$out/fit-$gib.txt" 2>&1
    rc=$?
    kill "$bp" 2>/dev/null; wait "$bp" 2>/dev/null
    echo "{\"free_gib\": $gib, \"free_bytes\": $left, \"rc\": $rc, \"seconds\": $((SECONDS - t0))}" >> "$out/fit.jsonl"
    echo "fit: $gib GiB asked, $left bytes free: rc $rc" | tee -a "$out/status.txt"
  done
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$out/gpu.txt" 2>&1
# Pack the logs and records (not the weights and fields).
tar czf "$out.tgz" -C "$out" --exclude=data . && echo "packed $out.tgz"
RUN
chmod +x pangu-bundle/run.sh
du -sh pangu-bundle; ls -la pangu-bundle
