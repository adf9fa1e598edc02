#!/usr/bin/env bash
# On the device machine, over the binaries of scripts/device-pack.sh (carried as .devrun): unpacks
# them where they were built (the CLI tests look for dsv41kv at its build path) and runs the
# stages of $STAGES in order, each under its own time limit, every log line also in $OUT/log.txt:
#   test     test_gpu (GTEST: a gtest filter, default all; TEST_TO seconds, default 300)
#   conform  dsv41kv conform --device cuda over .devrun/conformance
#   bench    dsv41kv bench --device cuda --read, once per ';'-separated argument list of
#            BENCH_ARGS (default "--op decode;--op prefill --tokens 32768;--op indexer --nc 131072")
#   tools    dsv41kv-indexer-bench / dsv41kv-attn-bench with the ';'-separated lists of IDX_ARGS /
#            ATTN_ARGS
#   san      compute-sanitizer --tool SAN_TOOL (default memcheck) on test_gpu --gtest_filter=SAN_F
#            (export DSV41KV_GPU_TEST_SMALL=1 for the smaller shapes; SAN_TO seconds, default 300)
#   ncu      per ';'-separated "kernel-regex|binary args" of NCU_ARGS, one profiled launch: the
#            details ($OUT/ncuN.txt) and the per-instruction source view ($OUT/sassN.csv)
#   peer     scripts/device-check.sh peer over these binaries (carry .peers/flashmla.tar.gz)
# VARIANTS="a b ..." (from DSV41KV_PACK_AS): the stages once per variant, its binaries unpacked over
# the build path in turn, its logs and files under $OUT/<variant>/.
# Example: STAGES="test bench" scripts/device-run.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-./device-out}
mkdir -p "$OUT"
LOG=$OUT/log.txt
build=${DSV41KV_BUILD_DIR:-build}
export LD_LIBRARY_PATH=$PWD/.devrun/lib:${LD_LIBRARY_PATH:-}
export DSV41KV_CONFORMANCE_DIR=${DSV41KV_CONFORMANCE_DIR:-$PWD/.devrun/conformance}
export PATH=/usr/local/cuda/bin:$PATH
t0=$(date +%s)
say() { echo "$*" | tee -a "$LOG"; }
if [ -n "${VARIANTS:-}" ]; then
  rc=0
  for v in $VARIANTS; do
    [ -f ".devrun/bin-$v.tar.xz" ] || { echo "device-run: no .devrun/bin-$v.tar.xz" | tee -a "$LOG"; rc=2; continue; }
    tar xJf ".devrun/bin-$v.tar.xz" || { echo "device-run: cannot unpack bin-$v.tar.xz" | tee -a "$LOG"; rc=2; continue; }
    mkdir -p "$OUT/$v"
    echo "##### variant $v" | tee -a "$LOG"
    OUT="$OUT/$v" VARIANTS= DSV41KV_UNPACKED=1 "$0" || rc=1
    cat "$OUT/$v/log.txt" >> "$LOG"
  done
  exit $rc
fi
if [ -z "${DSV41KV_UNPACKED:-}" ]; then
  tar xJf .devrun/bin.tar.xz || { say "device-run: cannot unpack .devrun/bin.tar.xz"; exit 2; }
fi
say "unpacked; $(nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader 2>/dev/null)"
lists() { local IFS=';'; read -ra L <<< "$1"; printf '%s\n' "${L[@]}"; }
rc=0
for s in ${STAGES:-test}; do
  say "=== $s at $(( $(date +%s) - t0 )) s"
  case $s in
    test) timeout "${TEST_TO:-300}" "$build/test_gpu" --gtest_filter="${GTEST:-*}" 2>&1 | grep -v '^\[       OK\|^\[ RUN' | tail -60 | tee -a "$LOG"; [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1 ;;
    conform) timeout 240 "$build/dsv41kv" conform --device cuda .devrun/conformance/*.gz 2>&1 | tail -40 | tee -a "$LOG"; [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1 ;;
    bench) while read -r a; do [ -n "$a" ] || continue
             # shellcheck disable=SC2086
             timeout 240 "$build/dsv41kv" bench --device cuda --read $a 2>&1 | tail -40 | tee -a "$LOG"
           done < <(lists "${BENCH_ARGS:---op decode;--op prefill --tokens 32768;--op indexer --nc 131072}") ;;
    tools) while read -r a; do [ -n "$a" ] || continue
             # shellcheck disable=SC2086
             timeout 240 "$build/dsv41kv-indexer-bench" $a 2>&1 | tail -20 | tee -a "$LOG"
           done < <(lists "${IDX_ARGS:-}")
           while read -r a; do [ -n "$a" ] || continue
             # shellcheck disable=SC2086
             timeout 240 "$build/dsv41kv-attn-bench" $a 2>&1 | tail -30 | tee -a "$LOG"
           done < <(lists "${ATTN_ARGS:-}") ;;
    san) timeout "${SAN_TO:-300}" compute-sanitizer --tool "${SAN_TOOL:-memcheck}" --print-limit 20 "$build/test_gpu" \
           --gtest_filter="${SAN_F:-*}" 2>&1 | grep -v '^\[       OK\|^\[ RUN' | tail -40 | tee -a "$LOG"; [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1 ;;
    ncu) i=0
         while read -r a; do [ -n "$a" ] || continue
           i=$((i + 1)); k=${a%%|*}; b=${a#*|}
           # shellcheck disable=SC2086
           timeout 240 ncu --kernel-name "regex:$k" --launch-skip 3 --launch-count 1 --set full --import-source yes \
             -o "$OUT/prof$i" $build/$b > "$OUT/ncu$i-run.txt" 2>&1
           ncu -i "$OUT/prof$i.ncu-rep" --print-details all > "$OUT/ncu$i.txt" 2>&1
           ncu -i "$OUT/prof$i.ncu-rep" --page source --print-source sass --csv > "$OUT/sass$i.csv" 2>&1
           rm -f "$OUT/prof$i.ncu-rep" "$OUT/ncu$i-run.txt"
           grep -i "duration\|throughput\|stall\|warp cycles\|registers" "$OUT/ncu$i.txt" | head -40 | tee -a "$LOG"
         done < <(lists "${NCU_ARGS:-}") ;;
    peer) DSV41KV_DEVICE_BUILD=$build OUT=$OUT timeout 560 scripts/device-check.sh peer 2>&1 | tail -60 | tee -a "$LOG"; [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1 ;;
    *) say "device-run: unknown stage '$s' (test conform bench tools san ncu peer)"; rc=2 ;;
  esac
done
say "=== done at $(( $(date +%s) - t0 )) s, rc $rc"
exit $rc
