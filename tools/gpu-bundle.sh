#!/usr/bin/env bash
# Builds bundle/: a self-contained folder that runs wavefuse's kernel suite,
# harness and PyTorch peers on a GPU host with no Rust toolchain
# (glibc >= 2.36). Release builds, stripped.
#   tools/gpu-bundle.sh            # build
#   bundle/run.sh OUTDIR [PHASES] [full|quick]   # on the GPU host
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf bundle && mkdir -p bundle/bin
# Provenance for the records a run makes: the commit built and whether the
# tracked files differed from it.
{ echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)"
  if [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then echo "dirty: true"; else echo "dirty: false"; fi; } > bundle/build.txt
cargo build --release --bin wavefuse-suite
cp target/release/wavefuse-suite bundle/bin/
# Every test binary of the workspace, release profile (not the xtask's: its
# manifest test reads the checkout, which the GPU host does not have).
# wavefuse-candle is left out: its GPU tests need its `cuda` feature and
# travel in tools/candle-bundle.sh; built without it they would refuse to
# run when WAVEFUSE_REQUIRE names cuda.
{ cargo test --release --workspace --exclude xtask --exclude wavefuse-candle --no-run --message-format=json 2>/dev/null
  cargo bench --workspace --exclude xtask --exclude wavefuse-candle --no-run --message-format=json 2>/dev/null; } \
  | python3 -c '
import json, sys, shutil, os
for line in sys.stdin:
    try: m = json.loads(line)
    except ValueError: continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        name = m["target"]["name"]
        kind = m["target"]["kind"]
        if kind == ["lib"]: name += "-lib"
        prefix = "bench-" if kind == ["bench"] else "test-"
        shutil.copy(m["executable"], "bundle/bin/" + prefix + name)
'
# Runnable examples (engine use: foreign memory and streams).
cargo build --release -p wavefuse --examples
for e in host/examples/*.rs; do n=$(basename "$e" .rs); cp "target/release/examples/$n" "bundle/bin/example-$n"; done
strip bundle/bin/* 2>/dev/null || true
# The PTX the build embedded (the committed object), for the profile phase
# (ptxas -v, SASS) and peers.py --wavefuse-ptx.
mkdir -p bundle/ptx
cp host/kernels/sm_90.ptx bundle/ptx/wavefuse_sm_90.ptx
cp tools/gpu-profile.sh bundle/profile.sh
cp benches/*.py bundle/ 2>/dev/null || true
cat > bundle/run.sh <<'RUN'
#!/usr/bin/env bash
# Runs on the GPU host: suite, sanitizers, harness, peers. Logs to $1.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
[ -d "$here/bin" ] || tar -C "$here" -xJf "$here/bin.tar.xz"
all_args="$*"
export WAVEFUSE_SUITE_BIN="$here/bin/wavefuse-suite"  # for the golden-mode tests
out="${1:?usage: run.sh OUTDIR [PHASES: suite,sanitize,soak,profile,bench] [full|quick|nopeers] [PEER_FLAGS...]}"; phase="${2:-suite,sanitize,soak,bench}"; mode="${3:-full}"
has() { [[ ",$phase," == *",$1,"* ]]; }
shift $(( $# < 3 ? $# : 3 )); peer_flags=("$@")
mkdir -p "$out"
{ echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "driver: $(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1)"
  echo "nvidia-smi: $(nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader 2>/dev/null | head -1)"
  echo "command: tools/gpu-bundle.sh && bundle/run.sh $all_args"
  cat "$here/build.txt" 2>/dev/null; } > "$out/meta.txt" 2>&1
# The backends each test binary's kernel tests ran on (tests/common/mod.rs
# appends one line per binary), and the ones that must open: a GPU run that
# silently falls back to the emulator fails instead of passing.
backends_of() { grep -E "^$1: " "$2" 2>/dev/null | tail -1 | sed -E "s/^$1: //" || true; }
if has suite; then
pass=0; fail=0
export WAVEFUSE_REQUIRE="${WAVEFUSE_REQUIRE:-cuda,cpu64,cpu32}"
echo "suite: WAVEFUSE_REQUIRE=$WAVEFUSE_REQUIRE" | tee -a "$out/suite.txt"
for t in "$here"/bin/test-*; do
  n=$(basename "$t")
  # static AMD checks need llvm-tools: they run in CI, not here
  [ "$n" = "test-amd_static" ] && continue
  if WAVEFUSE_BACKENDS_LOG="$out/backends.txt" "$t" --test-threads=4 > "$out/$n.log" 2>&1; then s=ok; else s=FAILED; fi
  r=$(grep -E "^test result:" "$out/$n.log" | tail -1)
  b=$(backends_of "$n" "$out/backends.txt")
  echo "$n: $s  $r  [${b:-backends not reported: no common::devices() call}]" | tee -a "$out/suite.txt"
  p=$(echo "$r" | sed -nE 's/.* ([0-9]+) passed.*/\1/p'); f=$(echo "$r" | sed -nE 's/.* ([0-9]+) failed.*/\1/p')
  pass=$((pass + ${p:-0})); fail=$((fail + ${f:-0}))
done
echo "suite: $pass passed, $fail failed" | tee -a "$out/suite.txt"
for e in "$here"/bin/example-*; do
  n=$(basename "$e")
  if "$e" > "$out/$n.log" 2>&1; then s=ok; else s=FAILED; fi
  echo "$n: $s  $(tail -1 "$out/$n.log")" | tee -a "$out/suite.txt"
done
fi
if has sanitize; then
  WAVEFUSE_SANITIZE_TOOLS="${WAVEFUSE_SANITIZE_TOOLS:-memcheck,racecheck,initcheck,synccheck}"
  if ! command -v compute-sanitizer >/dev/null; then
    echo "sanitize: compute-sanitizer not found: NOTHING was checked" | tee -a "$out/sanitizer.txt"
  else
  { echo "sanitize: every kernel test binary on the GPU only (WAVEFUSE_TEST_GPU_ONLY=1, WAVEFUSE_REQUIRE=cuda: a binary that cannot open CUDA fails)."
    echo "  memcheck:  out-of-bounds and misaligned global/local/shared accesses, hardware-reported errors."
    echo "  racecheck: shared-memory data hazards only: of wavefuse's kernels window_attention and the affine LayerNorm and LayerNorm+gather entries use shared (workgroup) memory; for the others it has nothing to inspect."
    echo "  initcheck: reads of device global memory that was never written."
    echo "  synccheck: invalid use of synchronization primitives (barriers, warp sync): window_attention's warp barriers and cp.async waits; the other kernels' lane exchanges are shfl.sync over the full warp."
    echo "  tools run: ${WAVEFUSE_SANITIZE_TOOLS:-memcheck,racecheck,initcheck,synccheck}; binaries: ${WAVEFUSE_SANITIZE_ONLY:-every GPU test binary}"; } | tee -a "$out/sanitizer.txt"
  san_t0=$SECONDS
  for tool in ${WAVEFUSE_SANITIZE_TOOLS//,/ }; do
    for t in "$here"/bin/test-*; do
      n=$(basename "$t"); case "$n" in test-amd_static|test-emu|test-mma|test-gather_guard|test-golden_mode|test-wavefuse-suite|test-*-lib|test-hip*) continue;; esac  # no GPU work in these (emulator / oracle tests; golden_mode drives the harness on the CPU backend)
      [ -n "${WAVEFUSE_SANITIZE_ONLY:-}" ] && [[ ",$WAVEFUSE_SANITIZE_ONLY," != *",${n#test-},"* ]] && continue
      # test-threads launches from six host threads at once, where racecheck
      # loses track of a launch ("Internal Sanitizer Error: Detected a failure
      # to track a kernel launch", counted as 1 error); its
      # kernels use no shared memory, so racecheck has nothing to inspect there.
      [ "$tool" = racecheck ] && [ "$n" = test-threads ] && continue
      log="$out/san-backends-$tool.txt"
      # One run of the binary, or with WAVEFUSE_SANITIZE_EACH_TEST=1 one
      # run per test (`--exact`): a slow test then times out alone, and
      # each test's verdict and time are reported.
      if [ "${WAVEFUSE_SANITIZE_EACH_TEST:-0}" = 1 ]; then
        mapfile -t units < <("$t" --list 2>/dev/null | sed -n 's/: test$//p')
        # A binary that lists no test runs whole: it is reported, never skipped.
        [ ${#units[@]} -eq 0 ] && units=("")
      else
        units=("")
      fi
      for u in "${units[@]}"; do
        label="$n${u:+ $u}"; file="$out/san-$tool-$n${u:+-$u}.log"
        # A call with a time limit stops starting runs after
        # WAVEFUSE_SANITIZE_DEADLINE seconds of this phase.
        if [ -n "${WAVEFUSE_SANITIZE_DEADLINE:-}" ] && [ $((SECONDS - san_t0)) -ge "$WAVEFUSE_SANITIZE_DEADLINE" ]; then
          echo "$tool $label: NOT run (past WAVEFUSE_SANITIZE_DEADLINE)" | tee -a "$out/sanitizer.txt"; continue
        fi
        # Each run gets at most WAVEFUSE_SANITIZE_TIMEOUT seconds (default
        # 300): under memcheck the engine tests' kernels run two orders of
        # magnitude slower, and one binary must not use up a device call
        # unreported. WAVEFUSE_SANITIZING=1 cuts the engine tests' queued
        # work by as much (tests/engine.rs `queued`).
        u0=$SECONDS
        WAVEFUSE_SANITIZING=1 WAVEFUSE_TEST_GPU_ONLY=1 WAVEFUSE_REQUIRE=cuda WAVEFUSE_BACKENDS_LOG="$log" timeout "${WAVEFUSE_SANITIZE_TIMEOUT:-300}" compute-sanitizer --tool $tool --error-exitcode 9 "$t" --test-threads=4 ${u:+--exact "$u"} > "$file" 2>&1
        rc=$?
        [ $rc -eq 124 ] && echo "timed out after ${WAVEFUSE_SANITIZE_TIMEOUT:-300} s: NOT checked" >> "$file"
        echo "$tool $label: rc=$rc$([ $rc -eq 124 ] && echo ' (timed out: not checked)'), $((SECONDS - u0)) s $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|test result' "$file" | tr '\n' ' ') [$(backends_of "$n" "$log")]" | tee -a "$out/sanitizer.txt"
      done
    done
  done
  fi
fi
if has soak; then
  # 10^6 launches mixing every kernel on one device; device memory before,
  # at ten checkpoints and after (src/soak.rs).
  "$here/bin/wavefuse-suite" soak --backend "${WAVEFUSE_SOAK_BACKEND:-cuda}" --launches "${WAVEFUSE_SOAK_LAUNCHES:-1000000}" > "$out/soak.txt" 2>&1
  echo "soak: rc=$? $(tail -1 "$out/soak.txt")" | tee -a "$out/suite.txt"
  # The same on the per-thread default stream wrapped as a caller's stream:
  # every launch records an event; resident memory must stay flat too.
  "$here/bin/wavefuse-suite" soak --backend "${WAVEFUSE_SOAK_BACKEND:-cuda}" --launches "${WAVEFUSE_SOAK_LAUNCHES:-1000000}" --stream per-thread > "$out/soak-per-thread.txt" 2>&1
  echo "soak (per-thread stream): rc=$? $(tail -1 "$out/soak-per-thread.txt")" | tee -a "$out/suite.txt"
fi
if has profile; then
  "$here/profile.sh" "$out/profile" "${WAVEFUSE_PROFILE_KERNELS:-}"
fi
if has bench; then
# The SM clock while the harness and peers run: the same build measured up
# to 3% apart on different H200 hosts at the same SM clock, so each run
# records the clocks it had.
smi_pid=""
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active \
    --format=csv,noheader,nounits -lms 250 > "$out/clocks.csv" 2>/dev/null & smi_pid=$!
fi
args=(); [ "$mode" = quick ] && args=(--reps 30)
[ -n "${WAVEFUSE_BENCH_ONLY:-}" ] && args+=(--only "$WAVEFUSE_BENCH_ONLY")  # one kernel family
"$here/bin/wavefuse-suite" --backend cuda --out "$out/harness" "${args[@]}" 2>"$out/harness.err" | tee "$out/harness.txt"
if [ -x "$here/bin/bench-host_costs" ]; then
  "$here/bin/bench-host_costs" --bench --warm-up-time 1 --measurement-time 3 > "$out/criterion.txt" 2>&1
  grep -E "^[A-Za-z].*|time:" "$out/criterion.txt" | grep -v "^Benchmarking\|^Found" | paste - - >> "$out/suite.txt"
fi
if [ -f "$here/peers.py" ] && [ "$mode" != nopeers ]; then
  # --wavefuse-ptx: add_layer_norm and gather are also timed inside the
  # peers process, on torch.compile's own tensors (impl "wavefuse").
  PYTHONUNBUFFERED=1 python3 "$here/peers.py" --out "$out/harness/peers.jsonl" $([ "$mode" = quick ] && echo --quick) --wavefuse-ptx "$here/ptx/wavefuse_sm_90.ptx" "${peer_flags[@]}" > "$out/peers.txt" 2>"$out/peers.err"
  [ -f "$here/compare.py" ] && python3 "$here/compare.py" "$out/harness/results.jsonl" "$out/harness/peers.jsonl" | tee "$out/compare.md"
fi
if [ -n "$smi_pid" ]; then
  kill "$smi_pid" 2>/dev/null; wait "$smi_pid" 2>/dev/null
  # Samples above 1 GHz (the idle clock is 345 MHz on the H200): busy ones,
  # sorted by SM clock for the median.
  awk -F', *' '$2 > 1000' "$out/clocks.csv" | sort -t, -k2,2n | awk -F', *' '
    { c[NR] = $2; t += $5; if ($6 != "0x0000000000000000") o++ }
    END { if (!NR) { print "clocks: no busy samples"; exit }
          printf "clocks: SM %d MHz median (%d-%d) over %d busy samples of 250 ms, %.0f C mean, %d with a clock event reason set\n",
                 c[int((NR + 1) / 2)], c[1], c[NR], NR, t / NR, o }' | tee -a "$out/meta.txt"
fi
fi
# At most a few files come back from a device run: pack everything.
tar czf "$out.tgz" -C "$out" . && echo "packed $out.tgz"
RUN
chmod +x bundle/run.sh
# A device call carries at most 64 MiB: the binaries travel xz-compressed
# (each embeds the same code objects, so they compress well) and unpack on
# the GPU host at the first run.
ls -la bundle/bin
tar -C bundle -cf - bin | xz -T2 -6 > bundle/bin.tar.xz && rm -rf bundle/bin
du -sh bundle
