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
# The Python package's tests (tests/python, ctest python.pytest): a virtual environment on that
# Python with torch and the package installed from this build (pip); default preset only.
if [ "$preset" = default ]; then bash tests/python/setup_env.sh build; fi
ctest --preset "$preset" "$@"
