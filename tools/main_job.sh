#!/usr/bin/env bash
# The main job (README, first command): installs the Debian packages, builds, and runs every
# statement of the paper as an exact property check (proofs_check prints its table), the mutant
# check that shows the properties can fail, and the precision / eps report. On a machine with a
# GPU it also builds the report's CUDA-kernel columns and runs the kernels' property tests against
# MPFR; without one it says what it skipped.
#
#   bash tools/main_job.sh                  report into out/report/ (git-ignored)
#   bash tools/main_job.sh --refresh-docs   report into docs/report/ (the tracked copy)
# Other arguments go to proofs_check (e.g. --cases 500).
set -euo pipefail
cd "$(dirname "$0")/.."
out=out/report
args=()
for a in "$@"; do
  if [[ $a == --refresh-docs ]]; then out=docs/report; else args+=("$a"); fi
done
bash tools/install_deps.sh
export PATH="/usr/local/cuda/bin:$PATH"
py_args=()
[ -x /usr/bin/python3 ] && py_args=(-DPython3_EXECUTABLE=/usr/bin/python3)
gpu=0
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then gpu=1; fi
cmake --preset default "${py_args[@]}" >/dev/null
cmake --build --preset default --target proofs_check
./build/proofs_check/proofs_check "${args[@]+"${args[@]}"}"
./build/proofs_check/proofs_check --mutants

# Precision / eps sensitivity report: kla_report writes report.md + CSV + PNG. A few minutes on
# 2 cores; `kla_report --help` lists larger sweeps. With a GPU, tools/CMakeLists.txt turns the
# CUDA columns on (KLA_REPORT_CUDA) at configure time.
cmake --build --preset default --target kla_report
mkdir -p "$out"
KLA_REPORT_VIA="bash tools/main_job.sh" ./build/tools/kla_report --out "$out"
echo "main_job: report written to $out/report.md"

if ((gpu)); then
  echo "main_job: a GPU is present: the report has the CUDA kernels' columns; running the kernels'"
  echo "main_job: property tests and kernel tests against MPFR (tests/cuda, every path the plan picks)"
  cmake --build --preset default --target test_cuda_props test_cuda_kernels
  ./build/tests/cuda/test_cuda_props
  ./build/tests/cuda/test_cuda_kernels
else
  echo "main_job: no GPU: skipped the report's CUDA-kernel columns and the kernels' tests"
  echo "main_job: (on a GPU machine: bash tools/main_job.sh, or bash tools/gpu_suite.sh for all of them)"
fi
