#!/usr/bin/env bash
# Installs the Debian packages kla builds against (SPEC §5). Idempotent: `apt-get update` runs
# once, and only when something is missing; installed packages are left alone.
set -euo pipefail
pkgs=(
  cmake ninja-build g++ pkg-config
  libeigen3-dev libboost1.81-dev libgmp-dev libmpfr-dev
  librapidcheck-dev libgtest-dev libgmock-dev libbenchmark-dev
  clang-14 libfuzzer-14-dev libclang-rt-14-dev clang-format
  python3 python3-matplotlib python3-numpy
  python3-venv
)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "install_deps: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  echo "install_deps: all packages present"
fi
command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ] || echo "install_deps: note: nvcc not found; CUDA targets will be skipped"
