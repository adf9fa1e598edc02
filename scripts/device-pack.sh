#!/usr/bin/env bash
# Packs this machine's build for the device machine (docs/cuda.md, "Running on the device
# machine"): a device call lasts at most 10 minutes and the tree takes longer to build there, so
# the binaries travel. Writes the git-ignored .devrun/: bin.tar.xz (test_gpu, dsv41kv and the
# benchmark tools of build/, stripped), lib/ (the shared libraries the device lacks: fmt), and
# conformance/ (the read-path files as shipped, .safetensors.gz; the write-path files gzipped when
# DSV41KV_PACK_WRITE_PATH=1: they add ~25 MB of the 64 MiB a call carries). Carry .devrun (and
# .peers/flashmla.tar.gz for the peer stage) and run scripts/device-run.sh there.
# DSV41KV_PACK_AS=NAME adds this build as variant NAME (bin-NAME.tar.xz) to an existing .devrun
# instead: build and pack each branch in turn, then VARIANTS="a b ..." scripts/device-run.sh runs
# the stages once per variant in one device call (~10 MB a variant).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${DSV41KV_BUILD_DIR:-build}
out=.devrun
bins=(test_gpu dsv41kv dsv41kv-indexer-bench dsv41kv-attn-bench dsv41kv-access-ceiling)
for b in "${bins[@]}"; do
  [ -x "$build/$b" ] || { echo "device-pack: no $build/$b (scripts/build.sh first)" >&2; exit 2; }
done
variant=${DSV41KV_PACK_AS:-}
if [ -n "$variant" ]; then
  [[ "$variant" =~ ^[A-Za-z0-9_.-]+$ ]] || { echo "device-pack: DSV41KV_PACK_AS '$variant': letters, digits, . _ - only" >&2; exit 2; }
  [ -d "$out/lib" ] || { echo "device-pack: no $out to add variant '$variant' to (run scripts/device-pack.sh first)" >&2; exit 2; }
  rm -rf "$out/stage"
  mkdir -p "$out/stage/$build"
  for b in "${bins[@]}"; do strip -o "$out/stage/$build/$b" "$build/$b"; done
  tar cJf "$out/bin-$variant.tar.xz" -C "$out/stage" "$build"
  rm -rf "$out/stage"
  du -sh "$out"
  exit 0
fi
rm -rf "$out"
mkdir -p "$out/lib" "$out/conformance" "$out/stage/$build"
for b in "${bins[@]}"; do strip -o "$out/stage/$build/$b" "$build/$b"; done
tar cJf "$out/bin.tar.xz" -C "$out/stage" "$build"
rm -rf "$out/stage"
cp -L /usr/lib/x86_64-linux-gnu/libfmt.so.9 "$out/lib/"
shared=${DSV41KV_SHARED:-../shared}
cp "$shared"/conformance/*.safetensors.gz "$out/conformance/" 2>/dev/null || echo "note: no read-path conformance files under $shared"
if [ "${DSV41KV_PACK_WRITE_PATH:-0}" = 1 ]; then
  for f in "$shared"/conformance/*.safetensors; do gzip -9 -c "$f" > "$out/conformance/$(basename "$f").gz"; done
fi
cp "$shared"/baselines/*.json "$out/" 2>/dev/null || true
du -sh "$out"
size=$(du -sb "$out" | cut -f1)
[ "$size" -lt $((56 << 20)) ] || echo "warning: $out is $((size >> 20)) MiB; a device call carries 64 MiB in all" >&2
