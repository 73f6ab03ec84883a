#!/usr/bin/env bash
# Ours vs flash-linear-attention on the GPU machine, in one call (issue 6; docs/performance.md).
#
#   bash bench/run_side_by_side.sh stage      here (no GPU needed): build libkla_cuda.so and
#                                             kla_bench_cuda for sm_90a with static runtimes into
#                                             build-bench-gpu/, copy what the GPU machine needs to
#                                             build-bench-gpu/dist (a few MB), fetch the FLA wheel
#                                             into .whl/fla and build the kla wheel into .whl/kla
#                                             (both git-ignored)
#   bash bench/run_side_by_side.sh [OUTDIR]   on the GPU machine, from the repository root, with
#                                             build-bench-gpu/dist and .whl carried: installs
#                                             the wheel to /tmp/kla-site, runs kla_bench_cuda
#                                             (Google Benchmark, JSON), side_by_side.py (ours vs
#                                             FLA, JSON + CSV) and draws the plots. OUTDIR
#                                             defaults to $OUT (the device tool's folder).
#   python3 bench/make_performance_md.py OUTDIR   here, afterwards: docs/performance.md + plots
#
# With the device tool (carry: build-bench-gpu/dist and .whl; timeout_s 595): the whole run
# takes about 7 minutes on an H200, most of it FLA's Triton autotuning (about 30 s for each
# dtype and (H, K, V)); the most valuable cases run first, so a smaller budget drops the fp16 /
# fp32 prefill shapes last.
#   bash bench/run_side_by_side.sh
# Time limits (seconds, environment): KLA_BENCH_CUDA_TIMEOUT (75), KLA_SBS_BUDGET (450: no
# side-by-side case starts later; the fp32 fast rows need it), KLA_SBS_TIMEOUT (500: hard stop).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${KLA_BENCH_BUILD:-$ROOT/build-bench-gpu}
DIST=$BUILD/dist
FLA_VERSION=0.6.0

if [[ ${1:-} == stage ]]; then
  set -e
  cd "$ROOT"
  NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
  cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKLA_ENABLE_CUDA=ON \
    -DCMAKE_CUDA_COMPILER="$NVCC" -DKLA_STATIC_RUNTIME=ON -DCMAKE_CUDA_ARCHITECTURES=90a \
    -DKLA_BUILD_BENCH=ON -DKLA_BUILD_TESTS=OFF \
    "-DCMAKE_EXE_LINKER_FLAGS=-static-libstdc++ -static-libgcc" \
    "-DCMAKE_SHARED_LINKER_FLAGS=-static-libstdc++ -static-libgcc" >/dev/null
  cmake --build "$BUILD" --target kla_cuda kla_bench_cuda
  rm -rf "$DIST" && mkdir -p "$DIST"
  cp "$BUILD/bench/kla_bench_cuda" "$DIST/" && strip "$DIST/kla_bench_cuda"
  cp -P "$BUILD"/cuda/libkla_cuda.so* "$DIST/"
  strip "$DIST"/libkla_cuda.so.*.*.* 2>/dev/null || true
  # libbenchmark is shared-only here (Debian); it travels under its soname.
  bm=$(ldd "$BUILD/bench/kla_bench_cuda" | awk '/libbenchmark/ {print $3}')
  cp -L "$bm" "$DIST/"
  bash "$ROOT/tools/build_info.sh" "$DIST" "$NVCC" "Release, sm_90a, static cudart/libstdc++/libgcc"
  mkdir -p "$ROOT/.whl/fla"
  if ! ls "$ROOT"/.whl/fla/fla_core-$FLA_VERSION-*.whl >/dev/null 2>&1; then
    python3 -m pip download -q --no-deps -d "$ROOT/.whl/fla" "fla-core==$FLA_VERSION"
  fi
  # The kla package (side_by_side.py calls the library through kla.lowlevel).
  rm -rf "$ROOT/.whl/kla"
  python3 -m pip wheel -q --no-deps "$ROOT" -w "$ROOT/.whl/kla"
  du -sh "$DIST" "$ROOT/.whl/fla" "$ROOT/.whl/kla"
  exit 0
fi

OUTDIR=${1:-${OUT:-$DIST/out}}
mkdir -p "$OUTDIR"

main() {
  cd "$ROOT"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/kla-site "$ROOT"/.whl/fla/*.whl "$ROOT"/.whl/kla/*.whl || return 1
  export PYTHONPATH=/tmp/kla-site${PYTHONPATH:+:$PYTHONPATH}
  export LD_LIBRARY_PATH=$DIST${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export PYTHONUNBUFFERED=1
  cat "$DIST/BUILD_INFO.json"

  echo "===== kla_bench_cuda"
  timeout "${KLA_BENCH_CUDA_TIMEOUT:-75}" "$DIST/kla_bench_cuda" \
    --benchmark_out="$OUTDIR/kla_bench_cuda.json" --benchmark_out_format=json
  echo "kla_bench_cuda rc=$?"

  echo "===== side_by_side.py"
  timeout "${KLA_SBS_TIMEOUT:-500}" python3 bench/side_by_side.py \
    --lib "$DIST/libkla_cuda.so" --out "$OUTDIR" --budget "${KLA_SBS_BUDGET:-450}"
  local rc=$?
  echo "side_by_side rc=$rc"
  python3 bench/side_by_side.py --plot "$OUTDIR" || echo "plotting failed"
  # cut short: print the table of what was measured
  ((rc == 0)) || python3 bench/side_by_side.py --table "$OUTDIR" || true
}

main 2>&1 | tee "$OUTDIR/run.log"
