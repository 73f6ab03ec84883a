#!/usr/bin/env bash
# The test command (README, second command): installs the Debian packages, configures, builds
# everything (CPU reference, proof checks, CUDA library and tests when nvcc is present) and runs
# ctest. GPU tests skip with a visible reason on machines without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install_deps.sh
export PATH="/usr/local/cuda/bin:$PATH"
preset="${KLA_PRESET:-default}"
# One Python for every Python test: Debian's, whose packages install_deps.sh installs (numpy,
# matplotlib), not whichever python3 comes first on PATH.
py_args=()
[ -x /usr/bin/python3 ] && py_args=(-DPython3_EXECUTABLE=/usr/bin/python3)
cmake --preset "$preset" "${py_args[@]}"
cmake --build --preset "$preset"
ctest --preset "$preset" "$@"
