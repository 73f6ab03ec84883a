#!/usr/bin/env bash
# ctest's python.pytest (tests/python/CMakeLists.txt): the package tests in the environment
# tests/python/setup_env.sh made in BUILD_DIR; exit 77 (skipped) where it has not been made.
#   bash tests/python/run_pytest.sh BUILD_DIR [pytest arguments]
set -uo pipefail
BUILD=$(cd "$1" && pwd)
shift
PY=$BUILD/python-venv/bin/python
if ! "$PY" -c "import kla, pytest" 2>/dev/null; then
  echo "python tests skipped: no test environment in $BUILD/python-venv (tools/test.sh makes" \
       "it: bash tests/python/setup_env.sh $BUILD)"
  exit 77
fi
cd "$(dirname "$0")"
exec "$PY" -m pytest -q -p no:cacheprovider -rs "$@" .
