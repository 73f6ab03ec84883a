#!/usr/bin/env bash
# Session 46, call 1: new = 31458a2 (the s45 windows-scan patch landed; tools/gpu_suite.sh stage at
# a clean tree); hd = 33ba0d8; base = cda2387's library; wx = 33ba0d8 + the patch + the experiment
# switch KLA_EXP_CHAIN_SEG (host code not in the repository; =0 turns the chain off).
set -uo pipefail
S=out/s46; O=${OUT:-/tmp/o}; mkdir -p $O
L=$O/log.txt; : > $L
say() { echo "[$(date +%T) +${SECONDS}s] $*" | tee -a $L; }
nvidia-smi -L | tee -a $L
T=/tmp/s46; mkdir -p $T; for f in dist hd new wx; do tar -C $T -xJf $S/$f.tar.xz; done
cat $T/new/BUILD_INFO.json | tee -a $L
B=$T/dist; H=$T/hd; W=$T/new; X=$T/wx
say "new: the whole test_cuda_backward; the mutant; package tests; sanitizers (concurrently)"
(LD_LIBRARY_PATH=$W timeout 330 $W/test_cuda_backward > $O/t_new.txt 2>&1; echo "new tests rc=$?" >> $O/rc.txt) &
(LD_LIBRARY_PATH=$W/mutants timeout 200 $W/test_cuda_backward --kla_mutant=bwd_chain_no_warmup --gtest_filter='*FromSaved*' > $O/mut_new.txt 2>&1; echo "mut new rc=$?" >> $O/rc.txt) &
(KLA_CUDA_LIBRARY=$W/libkla_cuda.so.0.2.0 PYTHONPATH=python timeout 200 python3 -m pytest -q -x -p no:cacheprovider tests/python/test_save_states.py tests/python/test_backward.py tests/python/test_backward_abi.py > $O/pytest_new.txt 2>&1; echo "pytest new rc=$?" >> $O/rc.txt) &
(for tool in memcheck racecheck synccheck; do
  LD_LIBRARY_PATH=$W timeout 100 compute-sanitizer --tool $tool --error-exitcode 9 $W/test_cuda_backward --gtest_filter='*SavedBeside*' > $O/new_$tool.txt 2>&1
  echo "new $tool rc=$?" >> $O/rc.txt
done) &
wait; cat $O/rc.txt | tee -a $L
grep -E "^\[  |FAIL|long_" $O/t_new.txt | grep -v "^\[ RUN" | tail -60 | tee -a $L
grep -E "^\[  " $O/mut_new.txt | tail -2 | tee -a $L; tail -1 $O/pytest_new.txt | tee -a $L
for tool in memcheck racecheck synccheck; do tail -1 $O/new_$tool.txt | tee -a $L; done
say "A/B"
PYTHONPATH=python timeout 150 python3 bench/ab_backward.py --out $O/ab.json --rounds 2 --reps 10 base=$B/libkla_cuda.so.0.2.0 head=$H/libkla_cuda.so.0.2.0 new=$W/libkla_cuda.so.0.2.0 "new-off=$X/libkla_cuda.so.0.2.0?KLA_EXP_CHAIN_SEG=0" > $O/_ab.txt 2>&1
say "ab rc=$?"; tail -n 12 $O/_ab.txt | tee -a $L
cd $O && tar -czf logs.tgz t_new.txt mut_new.txt pytest_new.txt new_*.txt rc.txt _ab.txt 2>/dev/null; cd - >/dev/null
say done
