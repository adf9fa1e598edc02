#!/usr/bin/env bash
# Installs the build dependencies that are missing, from Debian packages. Safe to re-run: it
# asks apt only for what dpkg does not already list. The CUDA toolkit (nvcc, NCCL, CUB) is
# optional and not installed here: without nvcc the build is CPU-only (DSV41KV_CUDA=OFF).
# With nvcc present, also the CUTLASS/CuTe 4.x headers (optional; CMake's
# DSV41KV_CUTLASS_INCLUDE_DIR finds them) from the pinned nvidia-cutlass wheel, with pip, unless
# python3 already imports that version of cutlass_library.
set -euo pipefail
pkgs=(cmake ninja-build g++ make pkg-config zlib1g-dev libgtest-dev libgmock-dev libbenchmark-dev
      nlohmann-json3-dev libcli11-dev libfmt-dev python3-venv python3-dev)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
cutlass_wheel=nvidia-cutlass==4.2.0.0
install_cutlass() {
  command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ] || return 0
  command -v python3 >/dev/null || { echo "note: no python3: the optional CUTLASS headers ($cutlass_wheel) are not installed"; return 0; }
  if python3 -c "import importlib.metadata as m, sys; sys.exit(m.version('nvidia-cutlass') != '${cutlass_wheel#*==}')" 2>/dev/null \
    && python3 -c "import cutlass_library" 2>/dev/null; then
    return 0
  fi
  echo "installing $cutlass_wheel (CUTLASS/CuTe headers)"
  python3 -m pip install --quiet "$cutlass_wheel"
}
install_cutlass
[ ${#missing[@]} -eq 0 ] && exit 0
echo "installing: ${missing[*]}"
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  sudo=sudo
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
