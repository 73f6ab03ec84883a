#!/usr/bin/env bash
# The Python tests' environment (tests/python, docs/python.md 'Testing'), made by tools/test.sh:
#   bash tests/python/setup_env.sh [BUILD_DIR]      (default: build, the default preset's)
# 1. a virtual environment BUILD_DIR/python-venv on Debian's /usr/bin/python3 (the one Python
#    of every Python test), kept between runs;
# 2. torch from PyPI without its CUDA wheels where it imports so (requirements-torch.txt: the
#    torch wheel plus the four NVIDIA libraries the CUDA toolkit here lacks, ~1.1 GB to
#    download; the toolkit's own libraries serve the rest); else the full torch (~2.8 GB);
# 3. the kla package, `pip install` of the repository: by default packaging the library the main
#    build made (BUILD_DIR/cuda/libkla_cuda.so.<KLA_ABI_VERSION>, KLA_PYTHON_LIBRARY) instead of compiling
#    cuda/ a second time; KLA_PYTHON_BUILD=full compiles it as `pip install .` does anywhere;
#    without that library (no nvcc) the package is built without CUDA, as it would be there.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=$(cd "${1:-$ROOT/build}" && pwd)
VENV=$BUILD/python-venv
PY=${KLA_PYTHON:-/usr/bin/python3}
HERE=$ROOT/tests/python
t0=$(date +%s)

[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
pip=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
if ! "$VENV/bin/python" -c "import torch, pytest, scikit_build_core" 2>/dev/null; then
  "${pip[@]}" install -r "$HERE/requirements.txt"
  "${pip[@]}" install --no-deps -r "$HERE/requirements-torch.txt"
  if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
    echo "setup_env: torch does not import without its CUDA wheels here; installing them"
    "${pip[@]}" install "$(grep '^torch==' "$HERE/requirements-torch.txt")"
  fi
fi

args=(--no-deps --no-build-isolation --force-reinstall
      --config-settings=build-dir="$BUILD/python-package")
abi=$(sed -n 's/^#define KLA_ABI_VERSION \([0-9]*\)$/\1/p' "$ROOT/cuda/include/kla/kla.h")
lib=$BUILD/cuda/libkla_cuda.so.$abi
if [ "${KLA_PYTHON_BUILD:-}" = full ]; then
  how="built with the package (cuda/ compiled)"
elif [ -e "$lib" ]; then
  args+=(--config-settings=cmake.define.KLA_PYTHON_LIBRARY="$lib")
  how="packaging $lib"
else
  args+=(--config-settings=cmake.define.KLA_ENABLE_CUDA=OFF)
  how="without CUDA (no $lib)"
fi
(cd "$ROOT" && "${pip[@]}" install "${args[@]}" .)
echo "setup_env: $VENV: torch $("$VENV/bin/python" -c 'import torch; print(torch.__version__)'), kla $how ($(($(date +%s) - t0)) s)"
