#!/usr/bin/env bash
# FlashMLA's last Hopper build, the read path's peer (../shared/baselines/README.md), for the
# side-by-side stage `peer` of scripts/device-check.sh. Never part of the repository: the source
# lives in the git-ignored .peers (listed in .git/info/exclude) and is carried to the device.
#
#   scripts/peer-flashmla.sh prepare   (here) FlashMLA 9241ae3 + CUTLASS 147f567's include/ and
#                                      tools/util/include/ (FlashMLA's setup.py builds its SM100
#                                      sources even with SM100 disabled, and those include
#                                      cutlass/util/*) from the
#                                      bare git dirs of the search tool's `fetch`
#                                      (FLASHMLA_GIT, CUTLASS_GIT; defaults under /work/.mirror),
#                                      into .peers/FlashMLA, packed as .peers/flashmla.tar.gz
#   scripts/peer-flashmla.sh build     (on the device) unpacks .peers/flashmla.tar.gz into
#                                      $PEER_DIR (default .peers/build) and builds flash_mla's
#                                      extension in place (setup.py build_ext --inplace,
#                                      FLASH_MLA_DISABLE_SM100=1, CPLUS_INCLUDE_PATH=<cuda>/include/cccl);
#                                      log: $OUT/peer-build.log. Prints the folder to put on
#                                      PYTHONPATH.
set -euo pipefail
cd "$(dirname "$0")/.."
FLASHMLA_COMMIT=9241ae3
CUTLASS_COMMIT=147f567
tarball=.peers/flashmla.tar.gz

prepare() {
  local fm=${FLASHMLA_GIT:-/work/.mirror/deepseek-ai+FlashMLA/repo} cu=${CUTLASS_GIT:-/work/.mirror/NVIDIA+cutlass/repo}
  for g in "$fm" "$cu"; do
    [ -d "$g" ] || { echo "peer-flashmla: no git dir $g (fetch github:deepseek-ai/FlashMLA and github:NVIDIA/cutlass first)" >&2; exit 2; }
  done
  git --git-dir="$fm" cat-file -e "$FLASHMLA_COMMIT^{commit}" 2>/dev/null || { echo "peer-flashmla: $fm lacks commit $FLASHMLA_COMMIT" >&2; exit 2; }
  git --git-dir="$cu" cat-file -e "$CUTLASS_COMMIT^{commit}" 2>/dev/null || { echo "peer-flashmla: $cu lacks commit $CUTLASS_COMMIT" >&2; exit 2; }
  # the submodule pin of the FlashMLA commit must be the CUTLASS commit used
  local pin
  pin=$(git --git-dir="$fm" ls-tree "$FLASHMLA_COMMIT" csrc/cutlass | awk '{print $3}')
  case "$pin" in "$CUTLASS_COMMIT"*) ;; *) echo "peer-flashmla: FlashMLA $FLASHMLA_COMMIT pins cutlass $pin, not $CUTLASS_COMMIT" >&2; exit 2 ;; esac
  rm -rf .peers/FlashMLA "$tarball"
  mkdir -p .peers/FlashMLA/csrc/cutlass
  git --git-dir="$fm" archive "$FLASHMLA_COMMIT" | tar -x -C .peers/FlashMLA
  # a fetched mirror may lack blobs outside include/ (git archive reports them and still succeeds):
  # its messages are shown only when the archive fails
  local err
  err=$(mktemp)
  git --git-dir="$cu" archive "$CUTLASS_COMMIT" include tools/util/include 2> "$err" | tar -x -C .peers/FlashMLA/csrc/cutlass \
    || { cat "$err" >&2; rm -f "$err"; exit 1; }
  rm -f "$err"
  for f in include/cute/tensor.hpp tools/util/include/cutlass/util/command_line.h; do
    [ -f ".peers/FlashMLA/csrc/cutlass/$f" ] || { echo "peer-flashmla: no $f in CUTLASS $CUTLASS_COMMIT" >&2; exit 1; }
  done
  echo "$FLASHMLA_COMMIT cutlass $CUTLASS_COMMIT" > .peers/FlashMLA/PEER_VERSION
  tar czf "$tarball" -C .peers FlashMLA
  echo "FlashMLA $FLASHMLA_COMMIT + CUTLASS $CUTLASS_COMMIT include/ tools/util/include/: $(find .peers/FlashMLA -type f | wc -l) files," \
       "$(du -sh .peers/FlashMLA | cut -f1) unpacked, $tarball $(du -h "$tarball" | cut -f1)"
}

build() {
  local out=${OUT:-./device-out} dir=${PEER_DIR:-.peers/build}
  mkdir -p "$out"
  [ -f "$tarball" ] || { echo "peer-flashmla: no $tarball (run 'scripts/peer-flashmla.sh prepare' here and carry .peers/flashmla.tar.gz)" >&2; exit 2; }
  command -v python3 >/dev/null || { echo "peer-flashmla: no python3" >&2; exit 2; }
  python3 -c "import torch; assert torch.cuda.is_available()" 2>/dev/null \
    || { echo "peer-flashmla: python3 cannot import torch with CUDA" >&2; exit 2; }
  if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then export PATH=/usr/local/cuda/bin:$PATH; fi
  local cuda
  cuda=${CUDA_HOME:-$(dirname "$(dirname "$(command -v nvcc)")")}
  rm -rf "$dir"
  mkdir -p "$dir"
  tar xzf "$tarball" -C "$dir"
  local t0 rc=0
  t0=$(date +%s)
  # CUDA 13 moved CCCL (cub, thrust, cuda/std) under include/cccl
  (cd "$dir/FlashMLA" && CUDA_HOME="$cuda" FLASH_MLA_DISABLE_SM100=1 \
     CPLUS_INCLUDE_PATH="$cuda/include/cccl${CPLUS_INCLUDE_PATH:+:$CPLUS_INCLUDE_PATH}" \
     MAX_JOBS=${MAX_JOBS:-$(nproc)} python3 setup.py build_ext --inplace) > "$out/peer-build.log" 2>&1 || rc=$?
  echo "peer-flashmla build: rc=$rc in $(( $(date +%s) - t0 ))s (log $out/peer-build.log)" >&2
  [ $rc -eq 0 ] || { tail -30 "$out/peer-build.log" >&2; exit $rc; }
  (cd "$dir/FlashMLA" && python3 -c "import flash_mla, flash_mla.cuda") >> "$out/peer-build.log" 2>&1 \
    || { echo "peer-flashmla: the built flash_mla does not import (log $out/peer-build.log)" >&2; exit 1; }
  echo "$(cd "$dir/FlashMLA" && pwd)"
}

case "${1:-}" in
  prepare) prepare ;;
  build) build ;;
  *) echo "usage: scripts/peer-flashmla.sh prepare|build" >&2; exit 2 ;;
esac
