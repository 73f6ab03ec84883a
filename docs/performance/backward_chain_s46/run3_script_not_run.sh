#!/usr/bin/env bash
# Session 46, call 3: land = f405120 (31458a2 with the chain kernel SASS-identical to 33ba0d8s, the beside path
# free of the chain code); landx = land + KLA_EXP_CHAIN_SEG (host only, never landed); new = 31458a2; hd = 33ba0d8; base = cda2387.
set -uo pipefail
S=out/s46b; O=${OUT:-/tmp/o}; mkdir -p $O
L=$O/log.txt; : > $L
say() { echo "[$(date +%T) +${SECONDS}s] $*" | tee -a $L; }
nvidia-smi -L | tee -a $L
T=/tmp/s46b; mkdir -p $T; for f in base land; do tar -C $T -xJf $S/$f.tar.xz; done
cat $T/land/BUILD_INFO.json | tee -a $L
W=$T/land
say "land: the saved, bitwise, graph and packed tests of test_cuda_backward; sanitizers (concurrently)"
(LD_LIBRARY_PATH=$W timeout 330 $W/test_cuda_backward --gtest_filter='*FromSaved*:*SavedBeside*:*Bitwise*:*Graph*' > $O/t_land.txt 2>&1; echo "land tests rc=$?" >> $O/rc.txt) &
(for tool in memcheck racecheck; do
  LD_LIBRARY_PATH=$W timeout 100 compute-sanitizer --tool $tool --error-exitcode 9 $W/test_cuda_backward --gtest_filter='*SavedBeside*' > $O/land_$tool.txt 2>&1
  echo "land $tool rc=$?" >> $O/rc.txt
done) &
wait
cat $O/rc.txt | tee -a $L
grep -E "^\[  |FAIL|long_" $O/t_land.txt | grep -v "^\[ RUN" | tail -60 | tee -a $L

for tool in memcheck racecheck; do tail -1 $O/land_$tool.txt | tee -a $L; done
say "A/B"
PYTHONPATH=python timeout 90 python3 bench/ab_backward.py --out $O/ab.json --rounds 1 --reps 10 base=$T/base/libkla_cuda.so.0.2.0 land=$W/libkla_cuda.so.0.2.0 "land-off=$T/landx/libkla_cuda.so.0.2.0?KLA_EXP_CHAIN_SEG=0" > $O/_ab.txt 2>&1
say "ab rc=$?"; tail -n 12 $O/_ab.txt | tee -a $L
say "package tests"
KLA_CUDA_LIBRARY=$W/libkla_cuda.so.0.2.0 PYTHONPATH=python timeout 40 python3 -m pytest -q -x -p no:cacheprovider tests/python/test_save_states.py tests/python/test_backward.py tests/python/test_backward_abi.py > $O/pytest_land.txt 2>&1; echo "pytest land rc=$?" >> $O/rc.txt
tail -1 $O/pytest_land.txt | tee -a $L
cd $O && tar -czf logs.tgz t_land.txt mut_land.txt pytest_land.txt land_*.txt rc.txt _ab.txt 2>/dev/null; cd - >/dev/null
say done
