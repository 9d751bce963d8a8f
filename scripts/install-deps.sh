#!/usr/bin/env bash
# Installs the Debian packages Loom builds against (the CUDA toolkit and NCCL are expected under
# /usr/local/cuda, or NCCL_HOME). Skips what is already there.
set -euo pipefail
packages=(cmake ninja-build g++ libtbb-dev libboost-dev libboost-program-options-dev
          libgtest-dev libbenchmark-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ] || {
  echo "nvcc not found: install the CUDA toolkit (12.4 or newer) under /usr/local/cuda" >&2; exit 1; }
