#!/bin/bash
# one-chip call (2026-11-27 #5): fp8 V copy with its kept launch key: bench/fp8_overhead.py (both copies, same process),
# bench/fp8.py forward (S 1k-8k) and decode, fp8 GPU tests
cd "$(dirname "$0")/.."
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 ))s] $*" >> $OUT/steps24.txt; }
mkdir -p /tmp/site && for w in .whl/*.whl; do python -m zipfile -e $w /tmp/site; done
ROOT=$(pwd); export PYTHONPATH=/tmp/site:$ROOT
mkdir -p $OUT/r
cd bench
timeout 200 python fp8_overhead.py --out $OUT/r --seqlens 1024,2048,8192 --rounds 7 --iters 20 > $OUT/r/overhead.log 2>&1; stamp "overhead rc=$?"
timeout 200 python fp8.py --seqlens 1024,2048,4096,8192 --skip-decode --out $OUT/r/fp8 > $OUT/r/fp8.log 2>&1; stamp "fp8 bench rc=$?"
cd $ROOT
timeout 150 python -m pytest -q -m gpu tests/test_fp8_vlayout.py tests/test_fp8_forward.py tests/test_fp8_tune_gpu.py \
  tests/test_fp8_kvcache.py -p no:cacheprovider > $OUT/r/gpu-tests.txt 2>&1; stamp "gpu tests rc=$?"
tail -2 $OUT/r/gpu-tests.txt
cat $OUT/r/fp8_overhead.md; grep "^| " $OUT/r/fp8/fp8.md
cd $OUT && tar czf r.tgz r && rm -rf r
cat $OUT/steps24.txt
