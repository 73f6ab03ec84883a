#!/usr/bin/env bash
# Session 45, call 2: w = HEAD + the parallel windows kernel + the prep's bounds only where the
# chain runs + the chain's de-duplications (374ccb7's); wx = w + KLA_EXP_CHAIN_SEG (experiment).
set -uo pipefail
S=out/s45; O=${OUT:-/tmp/o}; mkdir -p $O
L=$O/log2.txt; : > $L
say() { echo "[$(date +%T) +${SECONDS}s] $*" | tee -a $L; }
nvidia-smi -L | tee -a $L
cd $S && for f in dist hd w; do tar -xJf $f.tar.xz; done; cd - >/dev/null
B=$PWD/$S/dist; H=$PWD/$S/hd; W=$PWD/$S/w; X=$PWD/$S/wx
say "w: the bf16 and saved tests of test_cuda_backward; the mutant; package tests; sanitizers (concurrently)"
(LD_LIBRARY_PATH=$W timeout 170 $W/test_cuda_backward --gtest_filter='*Bf16*:*Saved*:*Bitwise*:*Graph*:*Refused*:*Unsupported*:*Invalid*' > $O/t_w.txt 2>&1; echo "w tests rc=$?" >> $O/rc.txt) &
(LD_LIBRARY_PATH=$W/mutants timeout 170 $W/test_cuda_backward --kla_mutant=bwd_chain_no_warmup --gtest_filter='*FromSaved*' > $O/mut_w.txt 2>&1; echo "mut w rc=$?" >> $O/rc.txt) &
(KLA_CUDA_LIBRARY=$W/libkla_cuda.so.0.2.0 PYTHONPATH=python timeout 170 python3 -m pytest -q -x tests/python/test_save_states.py tests/python/test_backward.py tests/python/test_backward_abi.py > $O/pytest_w.txt 2>&1; echo "pytest w rc=$?" >> $O/rc.txt) &
(for tool in memcheck racecheck synccheck; do
  LD_LIBRARY_PATH=$W timeout 80 compute-sanitizer --tool $tool --error-exitcode 9 $W/test_cuda_backward --gtest_filter='*SavedBeside*' > $O/w_$tool.txt 2>&1
  echo "w $tool rc=$?" >> $O/rc.txt
done) &
wait; cat $O/rc.txt | tee -a $L
grep -E "^\[  |FAIL|long_" $O/t_w.txt | grep -v "^\[ RUN" | tail -45 | tee -a $L
grep -E "^\[  " $O/mut_w.txt | tail -2 | tee -a $L; tail -1 $O/pytest_w.txt | tee -a $L
for tool in memcheck racecheck synccheck; do tail -1 $O/w_$tool.txt | tee -a $L; done
say "A/B"
PYTHONPATH=python timeout 140 python3 bench/ab_backward.py --out $O/ab2.json --rounds 2 --reps 10 base=$B/libkla_cuda.so.0.2.0 head=$H/libkla_cuda.so.0.2.0 w=$W/libkla_cuda.so.0.2.0 "w-off=$X/libkla_cuda.so.0.2.0?KLA_EXP_CHAIN_SEG=0" > $O/_ab2.txt 2>&1
say "ab rc=$?"; tail -n 11 $O/_ab2.txt | tee -a $L
cd $O && tar -czf logs2.tgz t_w.txt mut_w.txt pytest_w.txt w_*.txt rc.txt _ab2.txt 2>/dev/null; cd - >/dev/null
say done
