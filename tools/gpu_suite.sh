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
# binaries are copied to and run from, default $KLA_GPU_BUILD/dist), KLA_SUITE_STEPS (a regex of
# the steps to run), KLA_SUITE_MUTANT (a kernel mutant left planted in every test step: the suite
# must then fail; tests/cuda/README.md), KLA_SUITE_TAR=1 (pack the outputs into suite.tgz: the
# device tool returns only a few files a call).
#
# Kernel mutants: `stage` also builds the test-only library with planted faults (preset
# gpu-mutants) into $DIST/mutants; the mutant-* steps run the GPU tests against it, one fault at a
# time (--kla_mutant), and pass only when the tests reject the fault.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${KLA_GPU_BUILD:-$ROOT/build-gpu}
DIST=${KLA_GPU_DIST:-$BUILD/dist}

if [[ ${1:-} == stage ]]; then
  set -e
  cd "$ROOT"
  cmake --preset gpu -B "$BUILD" -DKLA_BUILD_BENCH=ON >/dev/null
  cmake --build "$BUILD" --target kla_cuda test_cuda_validate test_cuda_kernels test_cuda_props \
    test_cuda_accuracy test_cuda_backward kla_example_c kla_example_cpp kla_bench_cuda \
    kla_wgmma_latency
  rm -rf "$DIST" && mkdir -p "$DIST"
  for b in tests/cuda/test_cuda_validate tests/cuda/test_cuda_kernels tests/cuda/test_cuda_props \
           tests/cuda/test_cuda_accuracy tests/cuda/test_cuda_backward tests/cuda/kla_example_c \
           tests/cuda/kla_example_cpp \
           bench/kla_bench_cuda bench/kla_wgmma_latency; do
    cp "$BUILD/$b" "$DIST/" && strip "$DIST/$(basename "$b")"
  done
  cp -P "$BUILD"/cuda/libkla_cuda.so* "$DIST/"
  strip "$DIST"/libkla_cuda.so.*.*.* 2>/dev/null || true
  MBUILD=${KLA_GPU_MUTANT_BUILD:-$ROOT/build-gpu-mutants}
  cmake --preset gpu-mutants -B "$MBUILD" >/dev/null
  cmake --build "$MBUILD" --target kla_cuda
  mkdir -p "$DIST/mutants"
  cp -P "$MBUILD"/cuda/libkla_cuda.so* "$DIST/mutants/"
  strip "$DIST"/mutants/libkla_cuda.so.*.*.* 2>/dev/null || true
  # libbenchmark is shared-only here (Debian); it travels under its soname.
  bm=$(ldd "$BUILD/bench/kla_bench_cuda" | awk '/libbenchmark/ {print $3}')
  if [[ -n $bm ]]; then cp -L "$bm" "$DIST/"; fi
  # What the benchmarks report beside their figures when they time this library.
  bash "$ROOT/tools/build_info.sh" "$DIST" "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)" \
    "preset gpu: Release, sm_90a, static cudart/libstdc++/libgcc"
  du -sh "$DIST"
  exit 0
fi

# `list`: print the step names, one a line, and run nothing (tools/gpu_suite_parallel.py groups
# them over the GPUs of one machine).
LIST=0
[[ ${1:-} == list ]] && LIST=1
OUTDIR=${OUT:-$DIST/out}
SUMMARY=()
FAILED=()
if ((!LIST)); then
  mkdir -p "$OUTDIR"
  LOG=$OUTDIR/suite.log
  : >"$LOG"
  : >"$OUTDIR/steps.md"  # each finished step's summary row, written as it finishes
  export LD_LIBRARY_PATH=$DIST${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  nvidia-smi -L 2>&1 | tee -a "$LOG"
fi

# KLA_SUITE_STEPS (an extended regex) runs only the steps whose name it matches, so a long suite
# can be split over calls; the summary lists the skipped ones.
selected() { [[ -z ${KLA_SUITE_STEPS:-} ]] || [[ $1 =~ ^(${KLA_SUITE_STEPS})$ ]]; }

# run NAME TIMEOUT CMD...: runs a step, keeps its output in the log, records gtest counts.
run() {
  local name=$1 limit=$2
  shift 2
  if ((LIST)); then echo "$name"; return; fi
  if ! selected "$name"; then
    SUMMARY+=("$(printf '| %-24s | not run (KLA_SUITE_STEPS) |' "$name")")
    return
  fi
  local t0=$SECONDS
  local cmd=("$@")
  if [[ -n ${KLA_SUITE_MUTANT:-} ]] && [[ " ${cmd[*]}" == *"/test_cuda_"* ]]; then
    cmd+=("--kla_mutant=$KLA_SUITE_MUTANT")
  fi
  echo "===== $name: ${cmd[*]}" | tee -a "$LOG"
  local tmp=$OUTDIR/.step.log
  timeout "$limit" "${cmd[@]}" >"$tmp" 2>&1
  local rc=$?
  cat "$tmp" >>"$LOG"
  local passed failed skipped
  passed=$(grep -Eo '^\[  PASSED  \] [0-9]+' "$tmp" | grep -Eo '[0-9]+$' | tail -1)
  failed=$(grep -Eo '^\[  FAILED  \] [0-9]+ test' "$tmp" | grep -Eo '[0-9]+' | tail -1)
  skipped=$(grep -Eo '^\[  SKIPPED \] [0-9]+' "$tmp" | grep -Eo '[0-9]+$' | tail -1)
  if [[ -z $passed ]]; then  # pytest's closing line: "N passed, M failed, K skipped in ..."
    local last
    last=$(grep -E '[0-9]+ (passed|failed|skipped)' "$tmp" | tail -1)
    passed=$(grep -Eo '[0-9]+ passed' <<<"$last" | grep -Eo '[0-9]+')
    failed=$(grep -Eo '[0-9]+ failed' <<<"$last" | grep -Eo '[0-9]+')
    skipped=$(grep -Eo '[0-9]+ skipped' <<<"$last" | grep -Eo '[0-9]+')
  fi
  local errs
  errs=$(grep -Eo 'ERROR SUMMARY: [0-9]+' "$tmp" | tail -1 | grep -Eo '[0-9]+$')
  # racecheck prints its own summary line: the hazards it found.
  [[ -z $errs ]] && errs=$(grep -Eo 'RACECHECK SUMMARY: [0-9]+ hazards' "$tmp" | tail -1 |
    grep -Eo '[0-9]+' | head -1)
  # The path ledger of a GPU test (tests/cuda/path_pin.hpp): which plans ran, how many refused.
  local paths
  paths=$(grep -Eo '^kla paths \(pin [^)]*\):.*' "$tmp" | tail -1 | sed 's/^kla paths //')
  tail -n 25 "$tmp"
  rm -f "$tmp"
  [[ $rc -ne 0 ]] && FAILED+=("$name (rc $rc)")
  SUMMARY+=("$(printf '| %-24s | %3s | %6s | %6s | %7s | %9s | %5ss | %s |' "$name" "$rc" \
    "${passed:--}" "${failed:-0}" "${skipped:-0}" "${errs:--}" "$((SECONDS - t0))" "${paths:--}")")
  echo "${SUMMARY[-1]}" >>"$OUTDIR/steps.md"
}

if [[ -n ${KLA_SUITE_MUTANT:-} ]]; then
  export LD_LIBRARY_PATH=$DIST/mutants:$LD_LIBRARY_PATH
  echo "gpu_suite: kernel mutant $KLA_SUITE_MUTANT left planted in every test step" | tee -a "$LOG"
fi

# run_mutant NAME PIN [BINARIES]: the GPU tests against the mutant library with fault NAME active,
# chunkwise calls pinned to PIN: the kernel tests, then (if they let it through) the properties
# with fewer cases, then the accuracy test, then the backward's (BINARIES: only these, for a fault
# that only the backward runs). Passes when a binary rejects the fault (some test fails: exit 1);
# exit 2 (no such mutant, or the release library) fails the step.
MUTANT_ROWS=()
run_mutant() {
  local name=$1 pin=$2 step="mutant-$1"
  if ((LIST)); then echo "$step"; return; fi
  local bins=${3:-test_cuda_kernels test_cuda_props test_cuda_accuracy test_cuda_backward}
  if ! selected "$step"; then
    SUMMARY+=("$(printf '| %-24s | not run (KLA_SUITE_STEPS) |' "$step")")
    return
  fi
  local t0=$SECONDS rejected="" rcs=""
  for bin in $bins; do
    local tmp=$OUTDIR/.mutant.log
    echo "===== $step: $bin --kla_path=$pin --kla_mutant=$name" | tee -a "$LOG"
    LD_LIBRARY_PATH=$DIST/mutants:$LD_LIBRARY_PATH RC_PARAMS="max_success=8 noshrink=1" \
      KLA_LONG_CASES=2 timeout 400 "$DIST/$bin" "--kla_path=$pin" "--kla_mutant=$name" \
      >"$tmp" 2>&1
    local rc=$?
    cat "$tmp" >>"$LOG"
    grep -E '^\[  FAILED  \] [A-Za-z]' "$tmp" | sed 's/ (.*//' | tail -n 12
    local nf
    nf=$(grep -Eo '^\[  FAILED  \] [0-9]+ test' "$tmp" | grep -Eo '[0-9]+' | tail -1)
    rcs+="$bin:$rc "
    rm -f "$tmp"
    if [[ $rc -eq 1 && -n $nf ]]; then rejected="$bin ($nf failed tests)"; break; fi
    if [[ $rc -eq 2 ]]; then break; fi
  done
  if [[ -n $rejected ]]; then
    SUMMARY+=("$(printf '| %-24s | rejected by %s (%ss) |' "$step" "$rejected" "$((SECONDS - t0))")")
    MUTANT_ROWS+=("| $name | $pin | rejected: $rejected |")
  else
    FAILED+=("$step (survived: $rcs)")
    SUMMARY+=("$(printf '| %-24s | SURVIVED (%s) |' "$step" "$rcs")")
    MUTANT_ROWS+=("| $name | $pin | SURVIVED ($rcs) |")
  fi
  echo "${SUMMARY[-1]}" >>"$OUTDIR/steps.md"
}

run validate 120 "$DIST/test_cuda_validate"
run kernels 400 "$DIST/test_cuda_kernels"
run props 400 "$DIST/test_cuda_props"
# Every chunkwise path pinned through kla_params.path / value_slice (--kla_path, the tests' flag;
# tests/cuda/path_pin.hpp): each call asks the plan first, runs the pinned path where it applies
# (the plan asserted) and counts the calls it refuses; a step whose path never ran fails. The WY
# scan with 16, 8 (K >= 96) and 32-column slices, the transposed scan (bf16 / fp16), the TF32 path
# and the generic kernel.
for path in wy16 wy8 wy32 wy_transposed tf32 generic; do
  run "kernels-$path" 400 "$DIST/test_cuda_kernels" "--kla_path=$path"
done
for path in wy32 wy_transposed tf32; do
  run "props-$path" 400 "$DIST/test_cuda_props" "--kla_path=$path"
done
# The backward (kla_chunk_backward) against the reference gradients, every dtype; its table of
# measured worst relative RMS per gradient goes to backward.md.
KLA_BACKWARD_OUT=$OUTDIR/backward.md run backward 400 "$DIST/test_cuda_backward"
KLA_ACCURACY_OUT=$OUTDIR/accuracy.md run accuracy 400 "$DIST/test_cuda_accuracy"
KLA_ACCURACY_OUT=$OUTDIR/accuracy-wy_transposed.md run accuracy-wy_transposed 400 \
  "$DIST/test_cuda_accuracy" --kla_path=wy_transposed
# Every planted kernel fault (cuda/src/common/kernel_mutants.hpp), on the path it lives in.
if ((LIST)) || [[ -d $DIST/mutants && -z ${KLA_SUITE_MUTANT:-} ]]; then
  run_mutant split_lo_dropped wy16
  run_mutant handoff_decay_off_by_one wy
  run_mutant beta_eps_zero auto
  run_mutant transposed_rescale_missed wy_transposed
  run_mutant tf32_fast_grade tf32
  run_mutant bwd_carry_no_gamma auto test_cuda_backward
  run_mutant fast_in_accurate wy_transposed
  run_mutant wy_column_scale_missed wy16
  run_mutant bwd_fast_in_accurate auto test_cuda_backward
  run_mutant bwd_fast_bf16_operands auto test_cuda_backward
  run_mutant bwd_bf16_truncated auto test_cuda_backward
  run_mutant bwd_prep_split_hi_only auto test_cuda_backward
  run_mutant bwd_sums_default_stream auto test_cuda_backward
  run_mutant bwd_running_sum_restarts auto test_cuda_backward
  run_mutant bwd_prep_norm_pair_unsummed auto test_cuda_backward
  run_mutant bwd_scan_x_rows_skipped auto test_cuda_backward
  run_mutant bwd_scan_keys_own_record auto test_cuda_backward
  run_mutant bwd_grads_next_states_skipped auto test_cuda_backward
  run_mutant split_fold_transition_skipped auto test_cuda_kernels
  run_mutant saved_u_update_scaled auto test_cuda_backward
  run_mutant saved_u_update_scaled_transposed auto test_cuda_backward
  run_mutant bwd_scan_ready_ignored auto test_cuda_backward
fi
# The Python package's GPU tests (tests/python/test_gpu.py: every function against the float64
# recurrence, autograd, graphs, torch.compile; against FLA where .whl/fla is carried) on the
# package's source with this build's library; skipped where python3 has no torch.
if ((LIST)) || python3 -c "import torch" 2>/dev/null; then
  # Only where the step runs: groups of tools/gpu_suite_parallel.py share /tmp.
  if ((!LIST)) && selected python-fla && compgen -G "$ROOT/.whl/fla/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --target /tmp/kla-suite-site "$ROOT"/.whl/fla/*.whl
  fi
  abi=$(sed -n 's/^#define KLA_ABI_VERSION \([0-9]*\)$/\1/p' "$ROOT/cuda/include/kla/kla.h")
  # Two steps: the comparisons with FLA (-k fla) compile and autotune FLA's Triton kernels and
  # build float64 reference gradients, minutes on an H200 (round 2, session 27: the whole file did
  # not finish inside one 400 s step, twice), so they have a step and a limit of their own.
  PYTHONPATH=$ROOT/python:/tmp/kla-suite-site KLA_CUDA_LIBRARY=$DIST/libkla_cuda.so.$abi \
    run python 300 python3 -m pytest "$ROOT/tests/python/test_gpu.py" -q -p no:cacheprovider -rfs \
    -k "not fla"
  PYTHONPATH=$ROOT/python:/tmp/kla-suite-site KLA_CUDA_LIBRARY=$DIST/libkla_cuda.so.$abi \
    run python-fla 540 python3 -m pytest "$ROOT/tests/python/test_gpu.py" -q -p no:cacheprovider \
    -rfs -k fla
else
  SUMMARY+=("| python, python-fla       | python3 has no torch: not run |")
fi
run example_c 60 "$DIST/kla_example_c"
run example_cpp 60 "$DIST/kla_example_cpp"
if ((LIST)) || command -v compute-sanitizer >/dev/null; then
  # Every sanitizer over every kernel test; memcheck also over the RapidCheck properties.
  run memcheck 400 compute-sanitizer --tool memcheck --error-exitcode 9 "$DIST/test_cuda_kernels"
  run racecheck 400 compute-sanitizer --tool racecheck --error-exitcode 9 "$DIST/test_cuda_kernels"
  run memcheck-props 400 compute-sanitizer --tool memcheck --error-exitcode 9 "$DIST/test_cuda_props"
  run memcheck-backward 400 compute-sanitizer --tool memcheck --error-exitcode 9 \
    "$DIST/test_cuda_backward"
  # Without the graph test: its kernels are those the MPFR tests run, and under racecheck its 48
  # backward calls (12 configurations, each direct and replayed three times) took over 150 s on
  # an H100 (round 2, session 15); memcheck-backward covers it.
  run racecheck-backward 400 compute-sanitizer --tool racecheck --error-exitcode 9 \
    "$DIST/test_cuda_backward" --gtest_filter=-CudaBackward.GraphReplayMatchesDirectCall
  run initcheck 400 compute-sanitizer --tool initcheck --error-exitcode 9 "$DIST/test_cuda_kernels"
  run synccheck 400 compute-sanitizer --tool synccheck --error-exitcode 9 "$DIST/test_cuda_kernels"
  run memcheck-wy32 400 compute-sanitizer --tool memcheck --error-exitcode 9 \
    "$DIST/test_cuda_kernels" --kla_path=wy32
  run memcheck-wy_transposed 400 compute-sanitizer --tool memcheck --error-exitcode 9 \
    "$DIST/test_cuda_kernels" --kla_path=wy_transposed
  run racecheck-wy_transposed 400 compute-sanitizer --tool racecheck --error-exitcode 9 \
    "$DIST/test_cuda_kernels" --kla_path=wy_transposed
else
  SUMMARY+=("| sanitizers             | compute-sanitizer not found |")
fi
# The medians as Markdown tables in bench.md (printed below); 77: no GPU, as the examples.
run bench 300 "$DIST/kla_bench_cuda" --kla_no_gpu_exit_code=77 --kla_summary="$OUTDIR/bench.md" \
  --benchmark_out="$OUTDIR/kla_bench_cuda.json" --benchmark_out_format=json

# Cycles of the scan's product shapes on one multiprocessor (docs/prefill_notes.md, session 9).
run wgmma_latency 60 "$DIST/kla_wgmma_latency"
((LIST)) && exit 0

{
  echo
  [[ -f $OUTDIR/backward.md ]] && { echo "backward (relative RMS vs the reference gradients):"; cat "$OUTDIR/backward.md"; echo; }
  [[ -f $OUTDIR/accuracy.md ]] && { echo "accuracy (relative RMS vs MPFR, T=2048, K=V=128):"; cat "$OUTDIR/accuracy.md"; echo; }
  [[ -f $OUTDIR/accuracy-wy_transposed.md ]] && { echo "accuracy, --kla_path=wy_transposed (bf16 / fp16 chunk rows: the transposed scan):"; cat "$OUTDIR/accuracy-wy_transposed.md"; echo; }
  [[ -f $OUTDIR/bench.md ]] && { cat "$OUTDIR/bench.md"; echo; }
  if ((${#MUTANT_ROWS[@]})); then
    echo "kernel mutants (each must be rejected by the GPU tests):"
    echo "| mutant | pinned path | result |"
    echo "|---|---|---|"
    printf '%s\n' "${MUTANT_ROWS[@]}"
    echo
  fi
  echo "| step                     |  rc | passed | failed | skipped | sanitizer | time  | paths (plan/slice x calls; refused) |"
  echo "|--------------------------|-----|--------|--------|---------|-----------|-------|-----|"
  printf '%s\n' "${SUMMARY[@]}"
  echo
  if ((${#FAILED[@]})); then
    echo "gpu_suite: FAILED steps: ${FAILED[*]}"
  else
    echo "gpu_suite: every step passed"
  fi
} | tee "$OUTDIR/summary.md"
# KLA_SUITE_TAR=1: everything the suite wrote into one archive, suite.tgz, beside summary.md (the
# device tool returns only a few files a call; logs beyond them are dropped).
if [[ ${KLA_SUITE_TAR:-0} == 1 ]]; then
  (cd "$OUTDIR" && find . -mindepth 1 -maxdepth 1 ! -name summary.md ! -name suite.tgz \
     -printf '%P\n' | tar czf suite.tgz -T - && find . -mindepth 1 -maxdepth 1 \
     ! -name summary.md ! -name suite.tgz -exec rm -rf {} +)
fi
# Non-zero when any step failed, so a caller (or CI on a GPU machine) cannot miss it.
((${#FAILED[@]} == 0))
