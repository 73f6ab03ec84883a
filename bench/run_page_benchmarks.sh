#!/usr/bin/env bash
# The benchmarks behind docs/performance.md, beside FLA, with the GPU suite's library
# (`tools/gpu_suite.sh stage`: build-gpu/dist, its BUILD_INFO.json naming the commit), spread over
# the GPUs of one machine. No two jobs time on one GPU at once: a GPU runs its jobs one after the
# other.
#
#   bash bench/run_page_benchmarks.sh     on the GPU machine, from the repository root (device
#                                         tool: carry build-gpu/dist and .whl/fla)
#
# Jobs, in this order, dealt over the GPUs round robin (job i on GPU i mod the GPU count):
#   sbs       side_by_side.py's prefill, decode and accuracy rows   (about 430 s)
#   recipe    side_by_side.py's peers' recipe rows                  (about 190 s)
#   backward  bench_backward.py --no-accuracy                       (about 200 s)
#   split     kla_bench_cuda, then bench_split.py                   (about 240 s)
# Four GPUs run them all in one device call. With two, a call fits two jobs:
# KLA_PAGE_JOBS="sbs recipe" in one call, then "backward split" in the next.
# Round 2, session 27 ran this split by hand on two H200s, in two calls; session 28 ran the
# backward and split jobs with this script on two H200s of four (CUDA_VISIBLE_DEVICES=2,3: the
# others ran GPU tests meanwhile), 179 s and 221 s.
#
# Writes $OUT/<job>/ and prints a line as each job ends. Then, here, with the folders fetched:
#   python3 bench/make_performance_md.py OUT/sbs --recipe OUT/recipe --backward OUT/backward \
#       --split OUT/split --status bench/notes/status.md --command '...' ...
# Environment: KLA_PAGE_JOBS (the jobs to run, default all four), CUDA_VISIBLE_DEVICES (the GPUs
# to use), KLA_PAGE_GPUS (how many of them; default: all), KLA_PAGE_DRY=1 (print each GPU's
# queue and run nothing; the CPU test).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DIST=${KLA_GPU_DIST:-$ROOT/build-gpu/dist}
OUTDIR=${OUT:-$DIST/out-page}
JOBS=(${KLA_PAGE_JOBS:-sbs recipe backward split})
# The GPUs: CUDA_VISIBLE_DEVICES's entries where it is set (a caller keeping some GPUs for other
# work), else 0 .. nvidia-smi -L's count - 1; KLA_PAGE_GPUS=N takes the first N.
IFS=, read -r -a DEVS <<<"${CUDA_VISIBLE_DEVICES:-}"
if ((${#DEVS[@]} == 0)); then
  n=${KLA_PAGE_GPUS:-$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')}
  for ((g = 0; g < n; g++)); do DEVS+=("$g"); done
fi
GPUS=${KLA_PAGE_GPUS:-${#DEVS[@]}}
((GPUS >= 1)) || { echo "run_page_benchmarks: no GPU (KLA_PAGE_GPUS overrides)" >&2; exit 2; }
((GPUS <= ${#DEVS[@]})) || {
  echo "run_page_benchmarks: KLA_PAGE_GPUS=$GPUS, but CUDA_VISIBLE_DEVICES names ${#DEVS[@]}" >&2
  exit 2
}

# job NAME: the command of one job (its folder is $OUTDIR/NAME).
job() {
  local d=$OUTDIR/$1
  case $1 in
    sbs) echo "python3 bench/side_by_side.py --lib $DIST/libkla_cuda.so --out $d --budget 430" \
           "--only '^(?!recipe)' && python3 bench/side_by_side.py --plot $d" ;;
    recipe) echo "python3 bench/side_by_side.py --lib $DIST/libkla_cuda.so --out $d" \
              "--budget 430 --only '^recipe'" ;;
    backward) echo "python3 bench/bench_backward.py --no-accuracy --out $d" ;;
    # kla_bench_cuda's JSON goes beside the table's (make_performance_md.py reads it there).
    split) echo "mkdir -p $OUTDIR/sbs; timeout 80 $DIST/kla_bench_cuda" \
             "--benchmark_out=$OUTDIR/sbs/kla_bench_cuda.json --benchmark_out_format=json;" \
             "python3 bench/bench_split.py --out $d" ;;
    *) return 1 ;;
  esac
}

for name in "${JOBS[@]}"; do
  job "$name" >/dev/null || { echo "run_page_benchmarks: no job '$name'" >&2; exit 2; }
done
if [[ ${KLA_PAGE_DRY:-0} == 1 ]]; then
  for i in "${!JOBS[@]}"; do echo "gpu ${DEVS[i % GPUS]}: ${JOBS[$i]}: $(job "${JOBS[$i]}")"; done
  exit 0
fi

cd "$ROOT"
mkdir -p "$OUTDIR"
if compgen -G "$ROOT/.whl/fla/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/kla-page-site \
    "$ROOT"/.whl/fla/*.whl || exit 1
fi
export PYTHONPATH=$ROOT/python:/tmp/kla-page-site KLA_CUDA_LIBRARY=$DIST/libkla_cuda.so.5 \
  LD_LIBRARY_PATH=$DIST${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=index,name,driver_version --format=csv | tee "$OUTDIR/gpus.txt"
cat "$DIST/BUILD_INFO.json" 2>/dev/null | tee -a "$OUTDIR/gpus.txt"
SECONDS=0
for ((g = 0; g < GPUS; g++)); do
  (
    for i in "${!JOBS[@]}"; do
      ((i % GPUS == g)) || continue
      name=${JOBS[$i]}
      mkdir -p "$OUTDIR/$name"
      CUDA_VISIBLE_DEVICES=${DEVS[g]} bash -c "$(job "$name")" >"$OUTDIR/$name/run.log" 2>&1
      echo "run_page_benchmarks: $name on GPU ${DEVS[g]}: exit $? at ${SECONDS} s" |
        tee -a "$OUTDIR/jobs.txt"
    done
  ) &
done
wait
cat "$OUTDIR/jobs.txt"
! grep -q "exit [1-9]" "$OUTDIR/jobs.txt"
