#!/usr/bin/env bash
# Builds candle-bundle/: a self-contained folder that runs the Pangu-Weather
# stage on candle (CUDA) against the PyTorch reference on a GPU host with no
# Rust toolchain and no network (glibc >= 2.36, CUDA 13 driver and
# libraries, python3 with torch). The binary links candle's CUDA libraries
# dynamically (the host's own, found through its ldconfig); it is built
# here against link stubs (tools/cuda-toolkit.sh).
#   tools/candle-bundle.sh                 # build
#   candle-bundle/run.sh OUTDIR [PHASES] [SCALES]   # on the GPU host
# PHASES: comma list of tests,gen,candle,check,bench (default all); SCALES:
# s1,s2. Knobs: CANDLE_BUILDS, CANDLE_REPS, CANDLE_BREAKDOWN (forwards with
# the step timer), TORCH_MODES, TORCH_PARTS, TORCH_AUTOTUNE_PARTS (parts
# timed under max-autotune, which compiles slowly), TORCH_AUTOTUNE_TIMEOUT
# (seconds; each scale's max-autotune process, the scales compiling side by
# side, is cut off after it), SANITIZE=0 skips compute-sanitizer.
# The stripped binary is xz-compressed: run.sh unpacks it (a GPU call
# carries at most 64 MiB).
set -euo pipefail
cd "$(dirname "$0")/.."
eval "$(bash tools/cuda-toolkit.sh)"
# sm_90 PTX for wavefuse's kernels (the H200); no AMD objects in this binary.
export WAVEFUSE_AMD_ARCHS= WAVEFUSE_PTX_ARCHS=sm_90
cargo build --release -p pangu --features cuda --example pangu_stage --target-dir target/cuda
# The adapter's test binaries (CUDA cases run when WAVEFUSE_REQUIRE=cuda).
tests=$(cargo test --release -p wavefuse-candle -p pangu --features cuda --no-run --target-dir target/cuda \
  --message-format=json 2>/dev/null | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"] \
            and m["target"]["name"] in ("ops", "stage"):
        print(m["target"]["name"] + "=" + m["executable"])')
rm -rf candle-bundle && mkdir -p candle-bundle
cp target/cuda/release/examples/pangu_stage candle-bundle/pangu_stage
for t in $tests; do cp "${t#*=}" "candle-bundle/test_${t%%=*}"; done
[ -f candle-bundle/test_ops ] && [ -f candle-bundle/test_stage ] || { echo "test binaries missing: $tests"; exit 1; }
for b in pangu_stage test_ops test_stage; do
  strip "candle-bundle/$b"
  echo "stripped $b: $(stat -c %s "candle-bundle/$b") bytes"
  xz -T2 -6 "candle-bundle/$b"
done
cp benches/pangu_ref.py candle-bundle/
git rev-parse HEAD > candle-bundle/COMMIT 2>/dev/null || true
cat > candle-bundle/run.sh <<'RUN'
#!/usr/bin/env bash
# On the GPU host: adapter tests (+ memcheck), weights, candle builds,
# gate-2 check, timing. Logs to $1.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:?usage: run.sh OUTDIR [PHASES: tests,gen,candle,check,bench] [SCALES: s1,s2]}"
phase="${2:-tests,gen,candle,check,bench}"; scales="${3:-s1,s2}"
has() { [[ ",$phase," == *",$1,"* ]]; }
py="${PYTHON:-python3}"
# CANDLE_DEVICE=cpu with scale tiny: a smoke test of this script off the GPU.
device="${CANDLE_DEVICE:-cuda}"
mkdir -p "$out"
for b in pangu_stage test_ops test_stage; do
  [ -x "$out/$b" ] || { xz -dc "$here/$b.xz" > "$out/$b" && chmod +x "$out/$b"; }
done
bin="$out/pangu_stage"
{ echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "commit: $(cat "$here/COMMIT" 2>/dev/null)"
  echo "nvidia-smi: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)"
  echo "torch: $("$py" -c 'import torch; print(torch.__version__, torch.version.cuda)' 2>&1)"
  echo "compute-sanitizer: $(compute-sanitizer --version 2>&1 | tail -1)"
  echo "command: candle-bundle/run.sh $*"; } > "$out/meta.txt"
if has tests; then
  # CUDA required: a GPU that does not open fails the tests.
  for t in test_ops test_stage; do
    echo "== $t" ; WAVEFUSE_REQUIRE=cuda "$out/$t" 2>&1; echo "rc $?"
  done > "$out/tests.txt" 2>&1
  grep -E "^test result|^rc|FAILED|panicked" "$out/tests.txt"
  if [ "${SANITIZE:-1}" != 0 ]; then
    # test_stage makes no CUDA call (compute-sanitizer exits 255 on it:
    # "terminated before first instrumented API call").
    for t in test_ops; do
      echo "== memcheck $t"
      WAVEFUSE_REQUIRE=cuda compute-sanitizer --tool memcheck --error-exitcode 9 "$out/$t" --test-threads 1 2>&1
      echo "rc $?"
    done > "$out/memcheck.txt" 2>&1
    grep -E "ERROR SUMMARY|^rc|^test result" "$out/memcheck.txt"
  fi
fi
# Weights live beside the outputs; the big input tensors are not packed.
wdir="$out/weights"; mkdir -p "$wdir"
if has gen; then
  "$py" "$here/pangu_ref.py" gen --dir "$wdir" --scales "$scales" 2>&1 | tee "$out/gen.txt"
fi
if has candle; then
  for s in ${scales//,/ }; do
    "$bin" --scale "$s" --weights "$wdir/pangu_$s.safetensors" --device "$device" \
      --build "${CANDLE_BUILDS:-candle,wavefuse,wavefuse-unfused}" --out "$wdir" --reps "${CANDLE_REPS:-30}" \
      --breakdown "${CANDLE_BREAKDOWN:-10}" 2>&1 | tee -a "$out/candle.txt"
  done
fi
if has check; then
  "$py" "$here/pangu_ref.py" check --dir "$wdir" --scales "$scales" --device "$device" 2>&1 | tee "$out/check.txt"
fi
if has bench; then
  modes="${TORCH_MODES:-eager,default,max-autotune}"
  plain=$(echo "$modes" | tr ',' '\n' | grep -v '^max-autotune$' | paste -sd, -)
  if [ -n "$plain" ]; then
    PYTHONUNBUFFERED=1 "$py" "$here/pangu_ref.py" bench --dir "$wdir" --scales "$scales" --device "$device" \
      --modes "$plain" --parts "${TORCH_PARTS:-stage,block0,block1}" \
      2>>"$out/bench.err" | tee -a "$out/bench.txt"
  fi
  if [[ ",$modes," == *",max-autotune,"* ]]; then
    # One process per scale: max-autotune's compile is mostly CPU work, so
    # the scales compile side by side; pangu_ref.py's barrier holds every
    # timed loop until all compiles are done and runs the loops one at a time.
    limit="${TORCH_AUTOTUNE_TIMEOUT:-300}"
    bar="$out/.barrier"; rm -rf "$bar"
    n=$(echo "$scales" | tr ',' '\n' | grep -c .)
    for s in ${scales//,/ }; do
      ( PANGU_BENCH_BARRIER="$bar,$n,$(( limit * 3 / 4 ))" PYTHONUNBUFFERED=1 timeout "$limit" "$py" \
          "$here/pangu_ref.py" bench --dir "$wdir" --scales "$s" --device "$device" --modes max-autotune \
          --parts "${TORCH_AUTOTUNE_PARTS:-stage}" > "$out/autotune_$s.txt" 2>>"$out/bench.err"
        echo "max-autotune $s rc $? (124: cut off by TORCH_AUTOTUNE_TIMEOUT)" >> "$out/autotune_$s.txt" ) &
    done
    wait
    for s in ${scales//,/ }; do cat "$out/autotune_$s.txt"; done | tee -a "$out/bench.txt"
  fi
  tail -5 "$out/bench.err"
fi
cp "$wdir/pangu_ref.jsonl" "$out/" 2>/dev/null
# At most a few files come back from a device run: pack the logs (not the
# weights and outputs).
tar czf "$out.tgz" -C "$out" --exclude=weights --exclude=pangu_stage --exclude=test_ops --exclude=test_stage . \
  && echo "packed $out.tgz"
RUN
chmod +x candle-bundle/run.sh
du -sh candle-bundle; ls -la candle-bundle
