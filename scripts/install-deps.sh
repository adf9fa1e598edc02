#!/usr/bin/env bash
# Installs the build dependencies that are missing, from Debian packages. Safe to re-run: it
# asks apt only for what dpkg does not already list. The CUDA toolkit (nvcc, NCCL, CUB) is
# optional and not installed here: without nvcc the build is CPU-only (DSV41KV_CUDA=OFF).
set -euo pipefail
pkgs=(cmake ninja-build g++ make pkg-config zlib1g-dev libgtest-dev libgmock-dev libbenchmark-dev
      nlohmann-json3-dev libcli11-dev libfmt-dev python3-venv python3-dev)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
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
