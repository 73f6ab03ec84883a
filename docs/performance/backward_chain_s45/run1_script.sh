#!/usr/bin/env bash
# Session 45, call 1: HEAD's (33ba0d8) saved-backward tests, sanitizers, mutant and package tests;
# the register-operand patch (rs) tests; A/B base (cda2387) vs HEAD vs rs.
set -uo pipefail
S=out/s45; O=${OUT:-/tmp/o}; mkdir -p $O
L=$O/log1.txt; : > $L
say() { echo "[$(date +%T) +${SECONDS}s] $*" | tee -a $L; }
nvidia-smi -L | tee -a $L
cd $S && for f in dist hd rs; do tar -xJf $f.tar.xz; done; cd - >/dev/null
B=$PWD/$S/dist; H=$PWD/$S/hd; R=$PWD/$S/rs
F='*FromSaved*:*SavedBeside*:*BitwiseDeterministic*:*GraphReplay*'
say "saved tests HEAD and rs, concurrently"
(LD_LIBRARY_PATH=$H timeout 240 $H/test_cuda_backward --gtest_filter="$F" > $O/t_hd.txt 2>&1; echo "hd rc=$?" >> $O/rc.txt) &
(LD_LIBRARY_PATH=$R timeout 240 $R/test_cuda_backward --gtest_filter="$F" > $O/t_rs.txt 2>&1; echo "rs rc=$?" >> $O/rc.txt) &
wait; cat $O/rc.txt | tee -a $L
for v in hd rs; do grep -E "^\[  |FAIL|long_" $O/t_$v.txt | grep -v "^\[ RUN" | tail -30 | tee -a $L; done
say "A/B"
PYTHONPATH=python timeout 200 python3 bench/ab_backward.py --out $O/ab1.json --rounds 2 --reps 10 base=$B/libkla_cuda.so.0.2.0 head=$H/libkla_cuda.so.0.2.0 rs=$R/libkla_cuda.so.0.2.0 > $O/_ab1.txt 2>&1
say "ab rc=$?"; tail -n 9 $O/_ab1.txt | tee -a $L
say "mutants (must fail) HEAD and rs concurrently, with the package tests on HEAD"
(LD_LIBRARY_PATH=$H/mutants timeout 150 $H/test_cuda_backward --kla_mutant=bwd_chain_no_warmup --gtest_filter='*FromSaved*' > $O/mut_hd.txt 2>&1; echo "mut hd rc=$?" >> $O/rc.txt) &
(LD_LIBRARY_PATH=$R/mutants timeout 150 $R/test_cuda_backward --kla_mutant=bwd_chain_no_warmup --gtest_filter='*FromSaved*' > $O/mut_rs.txt 2>&1; echo "mut rs rc=$?" >> $O/rc.txt) &
(KLA_CUDA_LIBRARY=$H/libkla_cuda.so.0.2.0 PYTHONPATH=python timeout 150 python3 -m pytest -q -x tests/python/test_save_states.py tests/python/test_backward.py tests/python/test_backward_abi.py > $O/pytest_hd.txt 2>&1; echo "pytest hd rc=$?" >> $O/rc.txt) &
wait; tail -3 $O/rc.txt | tee -a $L; tail -2 $O/pytest_hd.txt | tee -a $L
for v in hd rs; do grep -E "^\[  " $O/mut_$v.txt | tail -2 | tee -a $L; done
for v in hd rs; do
  for tool in memcheck racecheck synccheck; do
    X=$PWD/$S/$v
    say "$v $tool SavedBeside"
    LD_LIBRARY_PATH=$X timeout 60 compute-sanitizer --tool $tool --error-exitcode 9 $X/test_cuda_backward --gtest_filter='*SavedBeside*' > $O/${v}_$tool.txt 2>&1
    say "rc=$?"; tail -1 $O/${v}_$tool.txt | tee -a $L
  done
done
say done
