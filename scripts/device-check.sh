#!/usr/bin/env bash
# GPU checks of the CUDA backend, for the device machine (H200). Stages, in order (default all):
#   build     cmake + ninja, Release, sm_90a machine code, targets dsv41kv_cli + test_gpu
#             (+ dsv41kv-access-ceiling, which test_gpu's CLI tests run)
#   test      $BUILD/test_gpu (every module's *_gpu tests: every CUDA kernel vs the CPU reference,
#             graphs, conformance, the CLI on the device)
#   sanitize  compute-sanitizer memcheck and racecheck on every suite of test_gpu, child processes
#             included (the CLI tests run `dsv41kv`), in parts that each get their own time limit:
#               kernels   every suite but the end-to-end ones (PcpRunGpu, RunCliGpu, DemoGpu)
#               e2e       PcpRunGpu, RunCliGpu and DemoGpu, the NCCL `--launch local` test apart for
#                         memcheck
#                         (racecheck: demo and pcp, each alone, so that each fits a run's time
#                         limit: together they could run past it, DemoGpu's cuBLAS reports
#                         making racecheck slow)
#               nccl      memcheck of RunCliGpu.CliLaunchLocal* with CUDA API error reports off:
#                         NCCL's init probes its own kernels with cudaFuncGetAttributes and gets
#                         cudaErrorNoKernelImageForDevice for the ones it ships without an sm_90
#                         image (it handles that return: those reports are expected). Our own API calls
#                         are all checked (DSV41KV_CUDA_CHECK throws), so a failing one fails a test.
#             racecheck checks every kernel and prints every hazard (--print-limit 0); a run passes
#             when its tests pass and every hazard lies inside cuBLAS's sm90 GEMMs (nvjet_*, the
#             projection's): they synchronise through mbarriers, which racecheck reports as
#             potential WAR hazards (over a thousand in the kernel suites' ProjectionGpu, over ten
#             thousand in DemoGpu). Excluding those kernels instead (--kernel-name-exclude) made
#             them fail under racecheck ("Internal Sanitizer Error ... hardware exception").
#   bench     dsv41kv bench --device cuda --json (the default launch: PDL; a table made from it), the
#             same with --no-pdl, and decode variants (early metadata, shared buffers), each with
#             --baseline .devdeps/baselines/vllm_triton_h200.json when that file exists (the device
#             machine has no ../shared, the bench's default; without it the vLLM columns are left
#             out); then dsv41kv-access-ceiling, default and --inputs all (access-ceiling.txt: the
#             256K ratio-1 traffic without arithmetic)
#   bench-read  dsv41kv bench --device cuda --read --json, one command per op (the indexer one per
#             n_c) each under its own time limit (DSV41KV_READ_TIMEOUT, default 240 s), the JSONs
#             merged into bench-read.json (+ bench-read.txt, a table)
#   peer      FlashMLA's Hopper build side by side (needs .peers/flashmla.tar.gz, carried, from
#             scripts/peer-flashmla.sh prepare): builds it (peer-build.log), runs
#             bench/peers/flashmla_sparse.py (peer-flashmla.json), our decode and prefill lines
#             (bench-read.json of this run when the bench-read stage ran, else their own run),
#             and joins both (peer.txt, peer-joined.json)
# Not in the default set: bench-read, peer.
# Usage: scripts/device-check.sh [build] [test] [sanitize] [bench] [bench-read] [peer]
# Every log goes under $OUT (default ./device-out); $OUT/summary.txt lists each stage's status;
# the exit status is non-zero when any stage failed.
#
# Environment:
#   DSV41KV_CMAKE_ARGS      extra cmake arguments, e.g. -DCMAKE_PREFIX_PATH=$PWD/.devdeps/prefix
#   DSV41KV_DEVICE_BUILD    build folder (default build-device)
#   DSV41KV_CUDA_ARCHS      CMAKE_CUDA_ARCHITECTURES (default: the project's sm_90a + sm_90 gencode)
#   DSV41KV_CONFORMANCE_DIR conformance files (default .devdeps/conformance when present)
#   DSV41KV_SEED            replay the random inputs of an earlier test run
#   DSV41KV_SAN_FILTER      one gtest filter for the sanitizer runs instead of the parts above
#   DSV41KV_SAN_TIMEOUT     seconds per sanitizer run (one tool on one part; default 270)
#   DSV41KV_BENCH_ITERS     timed repetitions per bench measurement (default 50)
#   DSV41KV_BENCH_VARIANTS  1 (default): also time the other program geometry
#                           (bench-prefill256k-warps4.json, bench-decode256-warps1.json)
#   DSV41KV_JOBS            build parallelism (default nproc)
#   DSV41KV_READ_TIMEOUT    seconds per read-bench command (default 240)
#   DSV41KV_READ_PARTS      the bench-read commands to run, of: decode indexer-4k indexer-64k
#                           indexer-128k indexer-1m prefill (default all; a device call lasts at most
#                           10 minutes, so split them over calls when the kernels are slow)
#   DSV41KV_CUTLASS_INCLUDE_DIR  CUTLASS/CuTe 4.x headers (default: .devdeps/cutlass/include, unpacked
#                           from .devdeps/cutlass-include.tar.gz of scripts/make-devdeps.sh)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-./device-out}
mkdir -p "$OUT"
BUILD=${DSV41KV_DEVICE_BUILD:-build-device}
JOBS=${DSV41KV_JOBS:-$(nproc)}
ARCHS=${DSV41KV_CUDA_ARCHS:-}
SAN_FILTER=${DSV41KV_SAN_FILTER:-}
ITERS=${DSV41KV_BENCH_ITERS:-50}
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then export PATH=/usr/local/cuda/bin:$PATH; fi
if [ -z "${DSV41KV_CONFORMANCE_DIR:-}" ] && [ -d .devdeps/conformance ]; then
  export DSV41KV_CONFORMANCE_DIR=$PWD/.devdeps/conformance
fi
if [ -z "${DSV41KV_CMAKE_ARGS:-}" ] && [ -d .devdeps/prefix ]; then
  DSV41KV_CMAKE_ARGS="-DCMAKE_PREFIX_PATH=$PWD/.devdeps/prefix"
fi
# the CUTLASS/CuTe headers packed by make-devdeps.sh (optional: without them the build still works)
if [ -z "${DSV41KV_CUTLASS_INCLUDE_DIR:-}" ] && [ -f .devdeps/cutlass-include.tar.gz ]; then
  if [ ! -f .devdeps/cutlass/include/cute/tensor.hpp ]; then
    mkdir -p .devdeps/cutlass/include
    tar xzf .devdeps/cutlass-include.tar.gz -C .devdeps/cutlass/include \
      || echo "device-check: could not unpack .devdeps/cutlass-include.tar.gz: building without CUTLASS" >&2
  fi
  [ -f .devdeps/cutlass/include/cute/tensor.hpp ] && DSV41KV_CUTLASS_INCLUDE_DIR=$PWD/.devdeps/cutlass/include
fi
if [ -d .devdeps/prefix/lib/x86_64-linux-gnu ]; then
  export LD_LIBRARY_PATH=$PWD/.devdeps/prefix/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi

stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(build test sanitize bench)
status=0
summary="$OUT/summary.txt"
note() { echo "$*" | tee -a "$summary"; }
run_stage() {  # name, command...
  local name=$1; shift
  local t0=$(date +%s)
  "$@"
  local rc=$?
  note "$(printf '%-10s rc=%-3s %4ss' "$name" "$rc" "$(( $(date +%s) - t0 ))")"
  [ $rc -ne 0 ] && status=1
  return $rc
}

stage_build() {
  { nvidia-smi; nvcc --version; cmake --version; ninja --version; } > "$OUT/env.txt" 2>&1
  # shellcheck disable=SC2086
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDSV41KV_CUDA=ON -DDSV41KV_BENCH=OFF \
    ${ARCHS:+-DCMAKE_CUDA_ARCHITECTURES="$ARCHS"} ${DSV41KV_CUTLASS_INCLUDE_DIR:+-DDSV41KV_CUTLASS_INCLUDE_DIR="$DSV41KV_CUTLASS_INCLUDE_DIR"} \
    ${DSV41KV_CMAKE_ARGS:-} > "$OUT/configure.log" 2>&1 || return 1
  grep -E "CUTLASS/CuTe" "$OUT/configure.log" >> "$OUT/env.txt" || true
  ninja -C "$BUILD" -j "$JOBS" dsv41kv_cli dsv41kv_access_ceiling test_gpu > "$OUT/build.log" 2>&1
  local rc=$?
  grep -E "warning|error" "$OUT/build.log" | grep -v "^ninja" | head -50 > "$OUT/build-warnings.txt"
  return $rc
}

stage_test() {
  "$BUILD/test_gpu" --gtest_output=xml:"$OUT/test_gpu.xml" > "$OUT/test_gpu.log" 2>&1
  local rc=$?
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |seed|tests? from .* ran" "$OUT/test_gpu.log" | tail -40 > "$OUT/test_gpu-summary.txt"
  return $rc
}

san_run() {  # tool, part name, gtest filter, extra compute-sanitizer arguments...
  local tool=$1 part=$2 filter=$3 rc=0; shift 3
  local opts=(--tool "$tool" --target-processes all --error-exitcode 99)
  if [ "$tool" = memcheck ]; then opts+=(--leak-check full); else opts+=(--racecheck-report all --print-limit 0); fi
  local t0=$(date +%s) log="$OUT/$tool-$part.log" verdict=""
  timeout "${DSV41KV_SAN_TIMEOUT:-270}" compute-sanitizer "${opts[@]}" "$@" \
    "$BUILD/test_gpu" --gtest_filter="$filter" > "$log" 2>&1 || rc=$?
  if [ "$tool" = racecheck ] && [ $rc -eq 99 ]; then
    # reports printed: accepted only when the tests passed, every report of the summary was
    # printed, and every access a report names ("... Thread (t) at F+0x..", "... access at F+0x..")
    # is inside a cuBLAS nvjet_* kernel
    local entries shown named ours
    entries=$(grep -cE "^========= +(Error|Warning): " "$log")
    shown=$(sed -nE 's/^========= RACECHECK SUMMARY: ([0-9]+) hazards? displayed.*/\1/p' "$log" | awk '{n += $1} END {print n + 0}')
    named=$(grep -cE "^=========.* at [A-Za-z_][A-Za-z0-9_]*\+0x" "$log")
    ours=$(grep -E "^=========.* at [A-Za-z_][A-Za-z0-9_]*\+0x" "$log" | grep -vcE " at nvjet_[A-Za-z0-9_]*\+0x")
    if [ "$entries" -gt 0 ] && [ "$entries" -eq "$shown" ] && [ "$named" -ge "$entries" ] && [ "$ours" -eq 0 ] \
      && grep -q "^\[  PASSED  \]" "$log" && ! grep -q -e "^\[  FAILED  \]" -e "Internal Sanitizer Error" "$log"; then
      verdict="accepted: $entries reports, every access they name inside cuBLAS's nvjet_* kernels"
      rc=0
    else
      verdict="$entries reports ($shown in the summaries), $ours accesses outside nvjet_* kernels"
    fi
  fi
  note "  $tool $part rc=$rc $(( $(date +%s) - t0 ))s${verdict:+ ($verdict)}"
  { echo "== $tool $part ($filter) rc=$rc${verdict:+ ($verdict)}"
    grep -E "^\[  (PASSED|FAILED) |ERROR SUMMARY|RACECHECK SUMMARY|LEAK SUMMARY|Internal Sanitizer Error" "$log"; } \
    >> "$OUT/sanitizer-summary.txt"
  return $rc
}

stage_sanitize() {
  # smaller prefill shapes (still both program geometries) and a time limit per run, so that the
  # stage fits one device command; a timeout shows as rc=124 in the summary
  local rc=0
  export DSV41KV_GPU_TEST_SMALL=1
  : > "$OUT/sanitizer-summary.txt"
  compute-sanitizer --version > "$OUT/sanitizer-version.txt" 2>&1
  if [ -n "$SAN_FILTER" ]; then
    san_run memcheck filter "$SAN_FILTER" || rc=1
    san_run racecheck filter "$SAN_FILTER" || rc=1
  else
    local e2e='PcpRunGpu.*:RunCliGpu.*:DemoGpu.*'
    san_run memcheck kernels "-$e2e" || rc=1
    san_run memcheck e2e "$e2e-RunCliGpu.CliLaunchLocal*" || rc=1
    san_run memcheck nccl 'RunCliGpu.CliLaunchLocal*' --report-api-errors no || rc=1
    san_run racecheck kernels "-$e2e" || rc=1
    san_run racecheck demo 'DemoGpu.*' || rc=1
    san_run racecheck pcp 'PcpRunGpu.*:RunCliGpu.*' || rc=1
  fi
  unset DSV41KV_GPU_TEST_SMALL
  return $rc
}

stage_bench() {
  # the baseline make-devdeps.sh packs (the bench's default, ../shared, is not on the device)
  local base=()
  [ -f .devdeps/baselines/vllm_triton_h200.json ] && base=(--baseline .devdeps/baselines/vllm_triton_h200.json)
  bench_json() { "$BUILD/dsv41kv" bench --device cuda --json --iters "$ITERS" "${base[@]}" "$@"; }
  bench_json > "$OUT/bench.json" 2> "$OUT/bench.err"
  local rc=$?
  if command -v python3 >/dev/null && [ -s "$OUT/bench.json" ]; then
    python3 - "$OUT/bench.json" > "$OUT/bench.txt" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
b = j.get("baseline_copy_GBps")
print(f"device {j['device']}  copy {j['copy_GBps']:.0f} GB/s "
      + (f"(baseline run {b:.0f}, {j['baseline_path']})" if b is not None else "(no baseline: no vLLM figures)"))
print(f"{'workload':<12}{'r':>2} {'record':<10}{'variant':<9}{'us':>9}{'GB/s':>8}{'copy%':>7}{'vllm_us':>9}{'x':>7}{'wrong':>6}")
for r in j["rows"]:
    v, x = r.get("vllm_ms"), r.get("speedup_vs_vllm")
    print(f"{r['workload']:<12}{r['ratio']:>2} {r['record']:<10}{r['variant']:<9}{r['us']:>9.2f}{r['GBps']:>8.0f}"
          f"{100*r['copy_fraction']:>6.1f}%" + (f"{1e3*v:>9.2f}{x:>6.2f}x" if v is not None else f"{'-':>9}{'-':>7}")
          + f"{r['wrong']:>6}")
print("targets: 256K fused >= 90% copy, >= 1.6x (r2) / 2.5x (r1) vs vLLM; decode fused <= 2.3 us (r1) / 2.9 us (r2)")
PY
  fi
  # every workload with plain launches (--no-pdl: ExecContext::programmatic_launch = false; the
  # table above is the default, programmatic dependent launch); decode with early metadata, and
  # with every graph node on one buffer set (how the baseline's do_bench replays one kernel)
  bench_json --no-pdl > "$OUT/bench-plain.json" 2>> "$OUT/bench.err" || rc=1
  local dv
  for dv in "--pdl-early-metadata:pdl-early" "--decode-buffers shared --no-pdl:shared-plain" \
    "--decode-buffers shared:shared" "--decode-buffers shared --pdl-early-metadata:shared-pdl-early"; do
    # shellcheck disable=SC2086
    bench_json --workload decode256 ${dv%%:*} > "$OUT/bench-decode256-${dv##*:}.json" 2>> "$OUT/bench.err" || rc=1
  done
  if command -v python3 >/dev/null; then
    python3 - "$OUT"/bench-plain.json "$OUT"/bench-decode256-{pdl-early,shared-plain,shared,shared-pdl-early}.json >> "$OUT/bench.txt" <<'PY'
import json, sys
for f in sys.argv[1:]:
    j = json.load(open(f))
    pdl = "off" if not j["programmatic_launch"] else ("on, early metadata" if j.get("pdl_early_metadata") else "on")
    for w in ("decode256", "prefill256k"):
        rows = [r for r in j["rows"] if r["variant"] == "fused" and r["workload"] == w]
        if rows:
            print(f"{w} fused, buffers {j['decode_buffers']}, programmatic launch {pdl}:",
                  "  ".join(f"r{r['ratio']} {r['record']} {r['us']:.2f} us ("
                            + (f"{r['speedup_vs_vllm']:.2f}x" if r.get("speedup_vs_vllm") is not None else "-")
                            + (f", {100 * r['copy_fraction']:.1f}%)" if w != "decode256" else ")") for r in rows))
PY
  fi
  if [ "${DSV41KV_BENCH_VARIANTS:-1}" = 1 ]; then
    # the geometry the size rule did not pick: four warps per token at 256K, one warp at decode
    bench_json --workload prefill256k --program-warps 4 > "$OUT/bench-prefill256k-warps4.json" 2>> "$OUT/bench.err" || true
    bench_json --workload decode256 --program-warps 1 > "$OUT/bench-decode256-warps1.json" 2>> "$OUT/bench.err" || true
  fi
  "$BUILD/dsv41kv-access-ceiling" --iters "$ITERS" > "$OUT/access-ceiling.txt" 2>> "$OUT/bench.err" || rc=1
  "$BUILD/dsv41kv-access-ceiling" --iters "$ITERS" --inputs all >> "$OUT/access-ceiling.txt" 2>> "$OUT/bench.err" || rc=1
  return $rc
}

# The read-path bench, one command per op (the indexer per n_c) so that one slow or failing line
# cannot take the others with it; the JSONs merged into $OUT/bench-read.json (bench/peers/merge_read.py).
stage_bench_read() {
  [ -x "$BUILD/dsv41kv" ] || { echo "bench-read: no $BUILD/dsv41kv (run the build stage)" >&2; return 1; }
  local rc=0 parts=() name part r
  : > "$OUT/bench-read.err"
  for part in "decode:--op decode" "indexer-4k:--op indexer --nc 4096" "indexer-64k:--op indexer --nc 65536" \
    "indexer-128k:--op indexer --nc 131072" "indexer-1m:--op indexer --nc 1048576" "prefill:--op prefill"; do
    name=${part%%:*}
    case " ${DSV41KV_READ_PARTS:-$name} " in *" $name "*) ;; *) continue ;; esac
    # shellcheck disable=SC2086
    timeout "${DSV41KV_READ_TIMEOUT:-240}" "$BUILD/dsv41kv" bench --device cuda --read --json --iters "$ITERS" ${part#*:} \
      > "$OUT/bench-read-$name.json" 2>> "$OUT/bench-read.err"
    r=$?
    note "  bench-read $name rc=$r"
    [ $r -ne 0 ] && rc=1
    parts+=("$OUT/bench-read-$name.json")
  done
  python3 bench/peers/merge_read.py "$OUT/bench-read.json" "${parts[@]}" --table > "$OUT/bench-read.txt" \
    2>> "$OUT/bench-read.err" || rc=1
  return $rc
}

# FlashMLA side by side: build it, run its harness one op (prefill: one size) per process, run our
# decode and prefill lines unless this run's bench-read stage has them, join both.
stage_peer() {
  local rc=0 dir part name r fm=() ours="$OUT/bench-read.json"
  : > "$OUT/peer.err"
  dir=$(OUT="$OUT" scripts/peer-flashmla.sh build 2>> "$OUT/peer.err") \
    || { echo "peer: FlashMLA build failed ($OUT/peer.err, $OUT/peer-build.log)" >&2; return 1; }
  note "  $(grep "peer-flashmla build" "$OUT/peer.err" | tail -1)"
  for part in "decode:--op decode" "prefill-32k:--op prefill --tokens 32768" "prefill-128k:--op prefill --tokens 131072"; do
    name=${part%%:*}
    # shellcheck disable=SC2086
    timeout "${DSV41KV_READ_TIMEOUT:-240}" python3 bench/peers/flashmla_sparse.py --flashmla "$dir" --iters "$ITERS" \
      ${part#*:} > "$OUT/peer-flashmla-$name.json" 2>> "$OUT/peer.err"
    r=$?
    note "  peer flashmla $name rc=$r"
    [ $r -ne 0 ] && rc=1
    fm+=("$OUT/peer-flashmla-$name.json")
  done
  python3 bench/peers/merge_read.py "$OUT/peer-flashmla.json" "${fm[@]}" 2>> "$OUT/peer.err" || rc=1
  if [ ! -s "$ours" ]; then
    ours="$OUT/peer-ours.json"
    for name in decode prefill; do
      timeout "${DSV41KV_READ_TIMEOUT:-240}" "$BUILD/dsv41kv" bench --device cuda --read --json --iters "$ITERS" \
        --op "$name" > "$OUT/peer-ours-$name.json" 2>> "$OUT/peer.err"
      r=$?
      note "  peer dsv41kv $name rc=$r"
      [ $r -ne 0 ] && rc=1
    done
    python3 bench/peers/merge_read.py "$ours" "$OUT/peer-ours-decode.json" "$OUT/peer-ours-prefill.json" \
      2>> "$OUT/peer.err" || rc=1
  fi
  if [ -s "$ours" ] && [ -s "$OUT/peer-flashmla.json" ]; then
    python3 bench/peers/join_read.py "$ours" "$OUT/peer-flashmla.json" --json "$OUT/peer-joined.json" > "$OUT/peer.txt" \
      2>> "$OUT/peer.err" || rc=1
  else
    echo "peer: nothing to join (ours: $ours, FlashMLA: $OUT/peer-flashmla.json; see $OUT/peer.err)" >&2
    rc=1
  fi
  return $rc
}

: > "$summary"
for s in "${stages[@]}"; do
  case "$s" in
    build) run_stage build stage_build ;;
    test) run_stage test stage_test ;;
    sanitize) run_stage sanitize stage_sanitize ;;
    bench) run_stage bench stage_bench ;;
    bench-read) run_stage bench-read stage_bench_read ;;
    peer) run_stage peer stage_peer ;;
    *) echo "unknown stage '$s' (build test sanitize bench bench-read peer)" >&2; exit 2 ;;
  esac
done
[ -f "$OUT/test_gpu-summary.txt" ] && tail -25 "$OUT/test_gpu-summary.txt"
[ -f "$OUT/sanitizer-summary.txt" ] && cat "$OUT/sanitizer-summary.txt"
[ -f "$OUT/bench.txt" ] && cat "$OUT/bench.txt"
[ -f "$OUT/access-ceiling.txt" ] && cat "$OUT/access-ceiling.txt"
[ -f "$OUT/bench-read.txt" ] && cat "$OUT/bench-read.txt"
[ -f "$OUT/peer.txt" ] && cat "$OUT/peer.txt"
cat "$summary"
exit $status
