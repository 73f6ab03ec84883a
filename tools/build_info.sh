#!/usr/bin/env bash
# Writes DIST/BUILD_INFO.json: the commit, whether cuda/ and bench/ had uncommitted files, a hash of
# the CUDA sources, the compiler and flags of the library in DIST. The benchmark scripts read it
# beside the library they time (bench/side_by_side.py), so a figure names what produced it.
#
#   tools/build_info.sh DIST NVCC FLAGS
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DIST=$1 NVCC=$2 FLAGS=$3
commit=$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)
dirty=$(git -C "$ROOT" status --porcelain --untracked-files=all -- cuda bench 2>/dev/null | wc -l)
cuda_sha=$(find "$ROOT"/cuda/include "$ROOT"/cuda/src -type f | sort | xargs cat | sha256sum |
  cut -c1-16)
cat >"$DIST/BUILD_INFO.json" <<JSON
{"commit": "$commit", "uncommitted_files_in_cuda_bench": $dirty, "cuda_sources_sha256": "$cuda_sha",
 "built": "$(date -u +%Y-%m-%dT%H:%M:%SZ)", "nvcc": "$("$NVCC" --version | tail -1)",
 "flags": "$FLAGS"}
JSON
