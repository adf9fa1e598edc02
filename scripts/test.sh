#!/usr/bin/env bash
# Builds and runs every test: the release build (CPU tests; CUDA tests skip without a GPU),
# then the whole CPU suite again under AddressSanitizer + UndefinedBehaviorSanitizer.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
(cd build && ctest --output-on-failure -j "$(nproc)")
DSV41KV_BUILD_DIR=build-asan DSV41KV_BUILD_TYPE=Debug scripts/build.sh \
  -DDSV41KV_CUDA=OFF -DDSV41KV_BENCH=OFF -DDSV41KV_SANITIZE=address,undefined
(cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --output-on-failure -j "$(nproc)")
