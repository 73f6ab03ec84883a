#!/usr/bin/env bash
# The GPU suite: every GPU test and kernel benchmark of kla::cuda in one call, a summary table
# printed last.
#
#   tools/gpu_suite.sh stage   (here, no GPU needed) configure + build the `gpu` CMake preset
#                              and copy the stripped binaries to build-gpu/dist (a few MB,
#                              carried to the GPU machine)
#   tools/gpu_suite.sh         (on the GPU machine, from the repository root) run everything
#
# The binaries are invoked directly (ctest's absolute paths differ on the GPU machine). Logs
# and tables go to $OUT (the device tool's output folder) or build-gpu/dist/out. The benchmark
# table is kla_bench_cuda's (bench/bench_cuda.cpp, --kla_summary), its full results beside it
# as kla_bench_cuda.json.
# Environment: KLA_GPU_BUILD (the build folder, default build-gpu), KLA_GPU_DIST (where the
# binaries are copied to and run from, default $KLA_GPU_BUILD/dist).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${KLA_GPU_BUILD:-$ROOT/build-gpu}
DIST=${KLA_GPU_DIST:-$BUILD/dist}

if [[ ${1:-} == stage ]]; then
  set -e
  cd "$ROOT"
  cmake --preset gpu -B "$BUILD" -DKLA_BUILD_BENCH=ON >/dev/null
  cmake --build "$BUILD" --target kla_cuda test_cuda_validate test_cuda_kernels test_cuda_props \
    test_cuda_accuracy kla_example_c kla_example_cpp kla_bench_cuda kla_wgmma_latency
  rm -rf "$DIST" && mkdir -p "$DIST"
  for b in tests/cuda/test_cuda_validate tests/cuda/test_cuda_kernels tests/cuda/test_cuda_props \
           tests/cuda/test_cuda_accuracy tests/cuda/kla_example_c tests/cuda/kla_example_cpp \
           bench/kla_bench_cuda bench/kla_wgmma_latency; do
    cp "$BUILD/$b" "$DIST/" && strip "$DIST/$(basename "$b")"
  done
  cp -P "$BUILD"/cuda/libkla_cuda.so* "$DIST/"
  strip "$DIST"/libkla_cuda.so.*.*.* 2>/dev/null || true
  # libbenchmark is shared-only here (Debian); it travels under its soname.
  bm=$(ldd "$BUILD/bench/kla_bench_cuda" | awk '/libbenchmark/ {print $3}')
  if [[ -n $bm ]]; then cp -L "$bm" "$DIST/"; fi
  du -sh "$DIST"
  exit 0
fi

OUTDIR=${OUT:-$DIST/out}
mkdir -p "$OUTDIR"
LOG=$OUTDIR/suite.log
: >"$LOG"
export LD_LIBRARY_PATH=$DIST${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
SUMMARY=()

nvidia-smi -L 2>&1 | tee -a "$LOG"

# run NAME TIMEOUT CMD...: runs a step, keeps its output in the log, records gtest counts.
run() {
  local name=$1 limit=$2
  shift 2
  local t0=$SECONDS
  echo "===== $name: $*" | tee -a "$LOG"
  local tmp=$OUTDIR/.step.log
  timeout "$limit" "$@" >"$tmp" 2>&1
  local rc=$?
  cat "$tmp" >>"$LOG"
  local passed failed skipped
  passed=$(grep -Eo '^\[  PASSED  \] [0-9]+' "$tmp" | grep -Eo '[0-9]+$' | tail -1)
  failed=$(grep -Eo '^\[  FAILED  \] [0-9]+ test' "$tmp" | grep -Eo '[0-9]+' | tail -1)
  skipped=$(grep -Eo '^\[  SKIPPED \] [0-9]+' "$tmp" | grep -Eo '[0-9]+$' | tail -1)
  local errs
  errs=$(grep -Eo 'ERROR SUMMARY: [0-9]+' "$tmp" | tail -1 | grep -Eo '[0-9]+$')
  # racecheck prints its own summary line: the hazards it found.
  [[ -z $errs ]] && errs=$(grep -Eo 'RACECHECK SUMMARY: [0-9]+ hazards' "$tmp" | tail -1 |
    grep -Eo '[0-9]+' | head -1)
  tail -n 25 "$tmp"
  rm -f "$tmp"
  SUMMARY+=("$(printf '| %-22s | %3s | %6s | %6s | %7s | %9s | %5ss |' "$name" "$rc" \
    "${passed:--}" "${failed:-0}" "${skipped:-0}" "${errs:--}" "$((SECONDS - t0))")")
}

run validate 120 "$DIST/test_cuda_validate"
run kernels 400 "$DIST/test_cuda_kernels"
run props 400 "$DIST/test_cuda_props"
# The other chunkwise paths on the same GPU (docs/api.md, KLA_CHUNK_PATH): the WY scan with
# 32-column slices (chosen only for many heads), with 16 (small problems at K >= 96 take 8 by
# default) and with 8 (three copy stages) on every shape it takes, the transposed scan (wy64:
# bf16 / fp16, 64-column slices; the default only where its blocks fill the GPU, so its accuracy
# table is a step of its own), and the sm_80-level TF32 path.
KLA_CHUNK_PATH=wy16 run kernels-wy16 400 "$DIST/test_cuda_kernels"
KLA_CHUNK_PATH=wy8 run kernels-wy8 400 "$DIST/test_cuda_kernels"
KLA_CHUNK_PATH=wy32 run kernels-wy32 400 "$DIST/test_cuda_kernels"
KLA_CHUNK_PATH=wy32 run props-wy32 400 "$DIST/test_cuda_props"
KLA_CHUNK_PATH=wy64 run kernels-wy64 400 "$DIST/test_cuda_kernels"
KLA_CHUNK_PATH=wy64 run props-wy64 400 "$DIST/test_cuda_props"
KLA_CHUNK_PATH=portable run kernels-portable 400 "$DIST/test_cuda_kernels"
KLA_CHUNK_PATH=portable run props-portable 400 "$DIST/test_cuda_props"
KLA_ACCURACY_OUT=$OUTDIR/accuracy.md run accuracy 400 "$DIST/test_cuda_accuracy"
KLA_CHUNK_PATH=wy64 KLA_ACCURACY_OUT=$OUTDIR/accuracy-wy64.md run accuracy-wy64 400 \
  "$DIST/test_cuda_accuracy"
run example_c 60 "$DIST/kla_example_c"
run example_cpp 60 "$DIST/kla_example_cpp"
if command -v compute-sanitizer >/dev/null; then
  # Every sanitizer over every kernel test; memcheck also over the RapidCheck properties.
  run memcheck 400 compute-sanitizer --tool memcheck --error-exitcode 9 "$DIST/test_cuda_kernels"
  run racecheck 400 compute-sanitizer --tool racecheck --error-exitcode 9 "$DIST/test_cuda_kernels"
  run memcheck-props 400 compute-sanitizer --tool memcheck --error-exitcode 9 "$DIST/test_cuda_props"
  run initcheck 400 compute-sanitizer --tool initcheck --error-exitcode 9 "$DIST/test_cuda_kernels"
  run synccheck 400 compute-sanitizer --tool synccheck --error-exitcode 9 "$DIST/test_cuda_kernels"
  KLA_CHUNK_PATH=wy32 run memcheck-wy32 400 compute-sanitizer --tool memcheck --error-exitcode 9 \
    "$DIST/test_cuda_kernels"
  KLA_CHUNK_PATH=wy64 run memcheck-wy64 400 compute-sanitizer --tool memcheck --error-exitcode 9 \
    "$DIST/test_cuda_kernels"
  KLA_CHUNK_PATH=wy64 run racecheck-wy64 400 compute-sanitizer --tool racecheck --error-exitcode 9 \
    "$DIST/test_cuda_kernels"
else
  SUMMARY+=("| sanitizers             | compute-sanitizer not found |")
fi
# The medians as Markdown tables in bench.md (printed below); 77: no GPU, as the examples.
run bench 300 "$DIST/kla_bench_cuda" --kla_no_gpu_exit_code=77 --kla_summary="$OUTDIR/bench.md" \
  --benchmark_out="$OUTDIR/kla_bench_cuda.json" --benchmark_out_format=json

# Cycles of the scan's product shapes on one multiprocessor (docs/prefill_notes.md, session 9).
run wgmma_latency 60 "$DIST/kla_wgmma_latency"

{
  echo
  [[ -f $OUTDIR/accuracy.md ]] && { echo "accuracy (relative RMS vs MPFR, T=2048, K=V=128):"; cat "$OUTDIR/accuracy.md"; echo; }
  [[ -f $OUTDIR/accuracy-wy64.md ]] && { echo "accuracy, KLA_CHUNK_PATH=wy64 (bf16 / fp16 chunk rows: the transposed scan):"; cat "$OUTDIR/accuracy-wy64.md"; echo; }
  [[ -f $OUTDIR/bench.md ]] && { cat "$OUTDIR/bench.md"; echo; }
  echo "| step                   |  rc | passed | failed | skipped | sanitizer | time  |"
  echo "|------------------------|-----|--------|--------|---------|-----------|-------|"
  printf '%s\n' "${SUMMARY[@]}"
} | tee "$OUTDIR/summary.md"
