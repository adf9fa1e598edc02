#!/usr/bin/env bash
# Packs the build dependencies that the GPU machine lacks (it has nvcc, cmake and ninja but no
# internet) into .devdeps/prefix, from this machine's Debian packages, plus the conformance
# files into .devdeps/conformance, nanobind and the Python tests' packages into .devdeps/python,
# and the baselines (vLLM's timings, which `dsv41kv bench`
# reads; the device machine has no ../shared) into .devdeps/baselines. The folder is
# git-ignored; pass it to the device run as a carried path and configure there with
# -DCMAKE_PREFIX_PATH=$PWD/.devdeps/prefix.
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
cp "$shared"/conformance/*.safetensors "$out/conformance/" 2>/dev/null || echo "note: no conformance files under $shared"
cp "$shared"/baselines/*.json "$out/baselines/" 2>/dev/null || echo "note: no baseline files under $shared"
# The Python package's build and test dependencies (PyPI wheels; ml_dtypes' is for this machine's
# Python version): on the device, PYTHONPATH=$PWD/.devdeps/python and
# -Dnanobind_DIR=$PWD/.devdeps/python/nanobind/cmake (docs/python.md).
# (ml_dtypes without its numpy: the device's own numpy, beside torch, stays the one imported.)
{ python3 -m pip install -q --disable-pip-version-check --target "$out/python" nanobind pytest hypothesis &&
  python3 -m pip install -q --disable-pip-version-check --target "$out/python" --no-deps ml_dtypes; } \
  || echo "note: no Python packages (pip could not reach PyPI)"
du -sh "$out"
