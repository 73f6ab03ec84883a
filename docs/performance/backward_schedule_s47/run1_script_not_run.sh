#!/usr/bin/env bash
# Sessions 47 and 48, not run (no ask of either session got a machine); for the next session. land = a
# build of the commit under test (tools/gpu_suite.sh stage; pack build-gpu/dist's libkla_cuda.so*,
# test_cuda_backward, test_cuda_validate, BUILD_INFO.json and mutants/ as land/ in
# out/s47/land.tar.xz); base = cda2387's library (out/s46b/base.tar.xz). Session 48 built land at
# b3e65a2 (host code of the plan moved; every kernel 29fc4ff's: sass_compare_29fc4ff_b3e65a2.txt).
# 1. the whole test_cuda_backward, test_cuda_validate, mutant bwd_scan_ready_ignored, memcheck and
#    racecheck over *SavedBeside* (concurrently); 2. the package's saved-backward GPU tests;
# 3. A/B of the saved backward: cda2387 (base), land (AUTO: the chain), land with the scan pinned
#    (each run's plan recorded: bench_backward.saved_schedule);
# 4. with BENCH=1 (a second call: carry .whl too), bench/bench_backward.py beside FLA 0.6.0.
set -uo pipefail
S=out/s47; O=${OUT:-/tmp/o}; mkdir -p $O
L=$O/log.txt; : > $L
say() { echo "[$(date +%T) +${SECONDS}s] $*" | tee -a $L; }
nvidia-smi -L | tee -a $L
T=/tmp/s47; mkdir -p $T; for f in base land; do tar -C $T -xJf $S/$f.tar.xz; done
cat $T/land/BUILD_INFO.json | tee -a $L
W=$T/land
say "tests"
(LD_LIBRARY_PATH=$W timeout 255 $W/test_cuda_backward > $O/t_land.txt 2>&1; echo "land tests rc=$?" >> $O/rc.txt) &
(LD_LIBRARY_PATH=$W timeout 60 $W/test_cuda_validate > $O/v_land.txt 2>&1; echo "land validate rc=$?" >> $O/rc.txt) &
(LD_LIBRARY_PATH=$W/mutants timeout 60 $W/test_cuda_backward --kla_mutant=bwd_scan_ready_ignored --gtest_filter='*SavedBeside*' > $O/mut_ready.txt 2>&1; echo "mut ready rc=$?" >> $O/rc.txt) &
(for tool in memcheck racecheck; do
  LD_LIBRARY_PATH=$W timeout 90 compute-sanitizer --tool $tool --error-exitcode 9 $W/test_cuda_backward --gtest_filter='*SavedBeside*' > $O/land_$tool.txt 2>&1
  echo "land $tool rc=$?" >> $O/rc.txt
done) &
wait; cat $O/rc.txt | tee -a $L
grep -E "^\[  |FAIL|long_" $O/t_land.txt | grep -v "^\[ RUN" | tail -80 | tee -a $L
tail -3 $O/v_land.txt | tee -a $L
grep -E "^\[  |FAIL" $O/mut_ready.txt | grep -v "^\[ RUN" | tail -4 | tee -a $L
for tool in memcheck racecheck; do tail -1 $O/land_$tool.txt | tee -a $L; done
say "package tests"
KLA_CUDA_LIBRARY=$W/libkla_cuda.so.0.2.0 PYTHONPATH=python timeout 60 python3 -m pytest -q -p no:cacheprovider tests/python/test_save_states.py tests/python/test_backward_abi.py tests/python/test_gpu.py -k "schedule or test_save_states or test_backward_abi" > $O/pytest_land.txt 2>&1; echo "pytest land rc=$?" | tee -a $O/rc.txt $L
tail -3 $O/pytest_land.txt | tee -a $L
say "A/B"
PYTHONPATH=python timeout 75 python3 bench/ab_backward.py --out $O/ab.json --rounds 1 --reps 10 base=$T/base/libkla_cuda.so.0.2.0 land=$W/libkla_cuda.so.0.2.0 "land-scan=$W/libkla_cuda.so.0.2.0?KLA_AB_STATE_GRAD=scan" > $O/_ab.txt 2>&1
say "ab rc=$?"; tail -n 8 $O/_ab.txt | tee -a $L
if [[ ${BENCH:-0} == 1 ]]; then  # the backward beside FLA 0.6.0 at land (about 200 s: FLA's tuning)
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/kla-page-site .whl/fla/*.whl
  PYTHONPATH=$PWD/python:/tmp/kla-page-site KLA_CUDA_LIBRARY=$W/libkla_cuda.so.5 timeout 230 \
    python3 bench/bench_backward.py --no-accuracy --reps 10 --out $O/backward > $O/backward.log 2>&1
  say "bench rc=$?"
fi
cd $O && tar -czf logs.tgz t_land.txt v_land.txt mut_*.txt pytest_land.txt land_*.txt rc.txt _ab.txt 2>/dev/null; cd - >/dev/null
say done
