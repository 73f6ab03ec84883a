#!/usr/bin/env bash
# Session 47, not run (no device machine started); for the next session: bench/bench_backward.py beside FLA 0.6.0 with the library of 4aeb26a (land).
set -uo pipefail
S=out/s47; O=${OUT:-/tmp/o}; mkdir -p $O
T=/tmp/s47; mkdir -p $T; [[ -f $T/land/libkla_cuda.so.5 ]] || tar -C $T -xJf $S/land.tar.xz
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/kla-page-site .whl/fla/*.whl || exit 1
nvidia-smi --query-gpu=index,name,driver_version --format=csv | tee $O/gpus.txt
cat $T/land/BUILD_INFO.json | tee -a $O/gpus.txt
PYTHONPATH=$PWD/python:/tmp/kla-page-site KLA_CUDA_LIBRARY=$T/land/libkla_cuda.so.5 PYTHONUNBUFFERED=1 \
  timeout ${TMO:-570} python3 bench/bench_backward.py --no-accuracy --reps 10 --out $O/backward ${ARGS:-} 2>&1 | tee $O/backward.log
echo "rc=${PIPESTATUS[0]}"
