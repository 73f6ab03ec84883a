#!/usr/bin/env bash
# The precision report with the CUDA kernels' columns (issue 4, GPU part): docs/report/gpu/.
#
#   tools/report_gpu.sh stage       (here, no GPU needed) configure + build build-report-gpu
#                                   (sm_90a, static runtime, KLA_REPORT_CUDA=ON) and copy
#                                   kla_report, test_report_cuda, libkla_cuda.so*, plot_report.py
#                                   and the commit to build-report-gpu/dist (carried to the GPU
#                                   machine)
#   tools/report_gpu.sh [ARGS]      (on the GPU machine, from the repository root) check the CUDA
#                                   columns (test_report_cuda), then run
#                                   kla_report --out docs/report/gpu [ARGS]; with $OUT set (the
#                                   device tool's output folder) also pack the report into
#                                   $OUT/report-gpu.tar.gz, with report.md and the log beside it
#   tools/report_gpu.sh unpack TAR  (here) replace docs/report/gpu by the report in TAR; draws the
#                                   plots if the GPU machine could not
#   tools/report_gpu.sh plot DIR    (here) draw DIR's PNGs from its CSVs (tools/plot_report.py,
#                                   needs matplotlib) and replace the report's "Plots were
#                                   skipped" note
#
# The GPU run takes about a minute on an H200 machine (16 cores); every number in the report
# comes from that run. The recorded command and commit are in the report's provenance.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DIST=${KLA_REPORT_GPU_DIST:-$ROOT/build-report-gpu/dist}
SKIPPED_NOTE='> Plots were skipped (--no-plots); the CSV files hold all data.'

# A Python with matplotlib: Debian's (as kla_report uses by default), else python3 on the PATH.
matplotlib_python() {
  local py
  for py in /usr/bin/python3 python3; do
    if command -v "$py" >/dev/null && "$py" -c 'import matplotlib' 2>/dev/null; then
      command -v "$py"
      return 0
    fi
  done
  return 1
}

plot() {
  local dir=$1 py
  py=$(matplotlib_python) || { echo "no python3 with matplotlib (apt-get install python3-matplotlib)" >&2; exit 1; }
  "$py" "$ROOT/tools/plot_report.py" "$dir"
  python3 - "$dir/report.md" "$SKIPPED_NOTE" <<'EOF'
import sys
path, note = sys.argv[1], sys.argv[2]
text = open(path).read()
new = ("> Plots drawn afterwards from this folder's CSV files by `bash tools/report_gpu.sh plot` "
       "(the GPU machine had no matplotlib).")
if note in text:
    open(path, "w").write(text.replace(note, new))
EOF
}

case ${1:-} in
  stage)
    cd "$ROOT"
    export PATH="/usr/local/cuda/bin:$PATH"
    cmake -S . -B build-report-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DKLA_ENABLE_CUDA=ON \
      -DKLA_STATIC_RUNTIME=ON -DCMAKE_CUDA_ARCHITECTURES=90a \
      "-DCMAKE_EXE_LINKER_FLAGS=-static-libstdc++ -static-libgcc" \
      "-DCMAKE_SHARED_LINKER_FLAGS=-static-libstdc++ -static-libgcc" \
      -DKLA_BUILD_TESTS=OFF -DKLA_BUILD_BENCH=OFF -DKLA_REPORT_CUDA=ON >/dev/null
    nice -n 10 cmake --build build-report-gpu --target kla_report test_report_cuda \
      -j "${KLA_JOBS:-$(nproc)}"
    rm -rf "$DIST" && mkdir -p "$DIST"
    for b in tools/kla_report tools/test_report_cuda; do
      cp "build-report-gpu/$b" "$DIST/" && strip "$DIST/$(basename "$b")"
    done
    cp -P build-report-gpu/cuda/libkla_cuda.so* "$DIST/"
    strip "$DIST"/libkla_cuda.so.*.*.* 2>/dev/null || true
    cp tools/plot_report.py "$DIST/"
    commit=$(git rev-parse HEAD)
    if [[ -n $(git status --porcelain --untracked-files=no -- . ':(exclude)docs/report') ]]; then
      commit+=" + uncommitted changes"
    fi
    echo "$commit" >"$DIST/COMMIT"
    du -sh "$DIST"
    echo "staged $DIST ($commit); on the GPU machine, from the repository root:" \
      "bash tools/report_gpu.sh"
    exit 0
    ;;
  unpack)
    tar=${2:?usage: tools/report_gpu.sh unpack REPORT-GPU.TAR.GZ}
    tar=$(cd "$(dirname "$tar")" && pwd)/$(basename "$tar")
    cd "$ROOT"
    rm -rf docs/report/gpu.unpack && mkdir -p docs/report/gpu.unpack
    tar -xzf "$tar" -C docs/report/gpu.unpack
    [[ -f docs/report/gpu.unpack/gpu/report.md ]] || { echo "no gpu/report.md in $tar" >&2; exit 1; }
    rm -rf docs/report/gpu && mv docs/report/gpu.unpack/gpu docs/report/gpu
    rmdir docs/report/gpu.unpack
    if grep -qF "$SKIPPED_NOTE" docs/report/gpu/report.md; then plot docs/report/gpu; fi
    echo "docs/report/gpu/report.md: $(sed -n 's/^| GPU | \(.*\) |$/\1/p' docs/report/gpu/report.md)"
    exit 0
    ;;
  plot)
    plot "${2:?usage: tools/report_gpu.sh plot DIR}"
    exit 0
    ;;
esac

# ---- on the GPU machine -----------------------------------------------------------------------
cd "$ROOT"
[[ -x $DIST/kla_report ]] || { echo "no $DIST/kla_report: run 'bash tools/report_gpu.sh stage' first (and carry build-report-gpu/dist)" >&2; exit 1; }
OUTDIR=${OUT:-}
[[ -z $OUTDIR ]] || mkdir -p "$OUTDIR"  # a folder under the device tool's $OUT may not exist yet
LOG=${OUTDIR:-$DIST}/report-gpu.log
export LD_LIBRARY_PATH=$DIST${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
nvidia-smi -L 2>&1 | tee "$LOG" || true

echo "===== test_report_cuda" | tee -a "$LOG"
"$DIST/test_report_cuda" 2>&1 | tee -a "$LOG"

# A Python with matplotlib for the plots; without one the plots are drawn afterwards
# (tools/report_gpu.sh unpack / plot).
plot_args=(--no-plots)
if py=$(matplotlib_python); then plot_args=(--python "$py"); fi

exe=$DIST/kla_report
[[ $exe == "$ROOT"/* ]] && exe=${exe#"$ROOT"/}
echo "===== $exe --out docs/report/gpu ${plot_args[*]} $*" | tee -a "$LOG"
start=$SECONDS
KLA_REPORT_VIA="bash tools/report_gpu.sh" KLA_REPORT_COMMIT="$(cat "$DIST/COMMIT")" \
  "$exe" --out docs/report/gpu "${plot_args[@]}" "$@" 2>&1 | tee -a "$LOG"
echo "report_gpu: docs/report/gpu/report.md in $((SECONDS - start)) s" | tee -a "$LOG"
if [[ -n $OUTDIR ]]; then
  tar -czf "$OUTDIR/report-gpu.tar.gz" -C docs/report gpu
  cp docs/report/gpu/report.md "$OUTDIR/report-gpu.md"
  ls -l "$OUTDIR"
fi
