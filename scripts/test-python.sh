#!/usr/bin/env bash
# The Python package's tests: `pip install ".[test]"` into a virtual environment (PEP 668: never
# the system interpreter), CPU-only unless DSV41KV_PYTHON_CUDA=ON, then pytest. The extension's
# build tree is kept in build-python/ so that a rerun rebuilds only what changed. The tests that
# compare with the C++ tool use build/dsv41kv when it is there (scripts/test.sh builds it first).
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
venv=$(realpath -m "${DSV41KV_VENV:-build-python/venv}")
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check \
  --config-settings=cmake.define.DSV41KV_CUDA=${DSV41KV_PYTHON_CUDA:-OFF} \
  --config-settings=build-dir=build-python/build ".[test]"
[ -x build/dsv41kv ] && export DSV41KV_CLI=${DSV41KV_CLI:-$PWD/build/dsv41kv}
cd python/tests && "$venv/bin/python" -m pytest -q -p no:cacheprovider "$@"
