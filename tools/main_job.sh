#!/usr/bin/env bash
# The main job (README, first command): installs the Debian packages, builds, and runs every
# statement of the paper as an exact property check (proofs_check prints its table), then the
# mutant check that shows the properties can fail.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install_deps.sh
export PATH="/usr/local/cuda/bin:$PATH"
cmake --preset default >/dev/null
cmake --build --preset default --target proofs_check
./build/proofs_check/proofs_check "$@"
./build/proofs_check/proofs_check --mutants
# Precision / eps sensitivity report (issue 4): builds kla_report and writes docs/report/
# (report.md + CSV + PNG). A few minutes on 2 cores; `kla_report --help` lists larger sweeps.
cmake --build --preset default --target kla_report
KLA_REPORT_VIA="bash tools/main_job.sh" ./build/tools/kla_report --out docs/report
echo "main_job: report written to docs/report/report.md"
