#!/usr/bin/env bash
# Packs the build dependencies that the GPU machine lacks (it has nvcc, cmake and ninja but no
# internet) into .devdeps/prefix, from this machine's Debian packages, plus the conformance
# files into .devdeps/conformance and the baselines (vLLM's timings, which `dsv41kv bench`
# reads; the device machine has no ../shared) into .devdeps/baselines. The folder is
# git-ignored; pass it to the device run as a carried path and configure there with
# -DCMAKE_PREFIX_PATH=$PWD/.devdeps/prefix. The CUTLASS/CuTe headers (include/cute and
# include/cutlass of the nvidia-cutlass wheel, or of DSV41KV_CUTLASS_INCLUDE_DIR), about 27 MB,
# go packed into .devdeps/cutlass-include.tar.gz (about 2.5 MB: a device call carries 64 MiB in
# all); scripts/device-check.sh unpacks them into .devdeps/cutlass/include there.
set -euo pipefail
cd "$(dirname "$0")/.."
out=.devdeps
rm -rf "$out"
mkdir -p "$out/prefix/include" "$out/prefix/lib/x86_64-linux-gnu/cmake" "$out/prefix/share/cmake" "$out/conformance" \
  "$out/baselines"
for d in fmt CLI nlohmann gtest gmock; do
  [ -d /usr/include/$d ] && cp -r /usr/include/$d "$out/prefix/include/"
done
cp -P /usr/lib/x86_64-linux-gnu/libgtest*.a /usr/lib/x86_64-linux-gnu/libgmock*.a "$out/prefix/lib/x86_64-linux-gnu/" 2>/dev/null || true
cp -P /usr/lib/x86_64-linux-gnu/libfmt.so* "$out/prefix/lib/x86_64-linux-gnu/"
cp /usr/include/zlib.h /usr/include/zconf.h "$out/prefix/include/"
cp /usr/lib/x86_64-linux-gnu/libz.a "$out/prefix/lib/x86_64-linux-gnu/"
for d in GTest fmt; do cp -r /usr/lib/x86_64-linux-gnu/cmake/$d "$out/prefix/lib/x86_64-linux-gnu/cmake/"; done
for d in CLI11 nlohmann_json; do cp -r /usr/share/cmake/$d "$out/prefix/share/cmake/"; done
# Debian's config files locate themselves relative to their own folder: copied as they are.
shared=${DSV41KV_SHARED:-../shared}
cp "$shared"/conformance/*.safetensors "$shared"/conformance/*.safetensors.gz "$out/conformance/" 2>/dev/null || echo "note: no conformance files under $shared"
cp "$shared"/baselines/*.json "$out/baselines/" 2>/dev/null || echo "note: no baseline files under $shared"
cutlass=${DSV41KV_CUTLASS_INCLUDE_DIR:-$(python3 -c "import os, cutlass_library; print(os.path.join(os.path.dirname(cutlass_library.__file__), 'source', 'include'))" 2>/dev/null || true)}
if [ -n "$cutlass" ] && [ -f "$cutlass/cute/tensor.hpp" ] && [ -d "$cutlass/cutlass" ]; then
  tar czf "$out/cutlass-include.tar.gz" -C "$cutlass" cute cutlass
  echo "CUTLASS/CuTe headers of $cutlass: $(du -sh "$out/cutlass-include.tar.gz" | cut -f1) packed"
else
  echo "note: no CUTLASS/CuTe headers (python3 -c 'import cutlass_library' fails, DSV41KV_CUTLASS_INCLUDE_DIR unset): not packed"
fi
du -sh "$out"
size=$(du -sb "$out" | cut -f1)
[ "$size" -lt $((56 << 20)) ] || echo "warning: $out is $((size >> 20)) MiB; a device call carries 64 MiB in all (with .peers)" >&2
