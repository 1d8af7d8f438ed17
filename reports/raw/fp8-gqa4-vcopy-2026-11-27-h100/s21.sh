#!/bin/bash
# one-chip call (2026-11-27 #5): fp8 forward GQA 32:8 entries. bench/fp8.py forward before; tune --dtype fp8 at the
# bench's shape (B4 Hq32 Hkv8 D128), S 1k-8k, causal and not; bench after; fp8 GPU tests
cd "$(dirname "$0")/.."
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 ))s] $*" >> $OUT/steps21.txt; }
mkdir -p /tmp/site && for w in .whl/*.whl; do python -m zipfile -e $w /tmp/site; done
ROOT=$(pwd); export PYTHONPATH=/tmp/site:$ROOT
mkdir -p $OUT/r
B="python bench/fp8.py --quick --seqlens 1024,2048,4096,8192 --skip-decode"
timeout 100 $B --out $OUT/r/before > $OUT/r/before.log 2>&1; stamp "bench before rc=$?"
for S in 2048 1024 8192 4096; do for c in "" --causal; do
  timeout 70 python -m rocmflash.cli tune --gpu auto --dtype fp8 --head-dim 128 --seqlen $S $c --heads 32 --kv-heads 8 \
    --batch 4 --db configs/h100.json > $OUT/r/tune-s$S$c.log 2>&1; stamp "tune s$S $c rc=$?"
done; done
cp configs/h100.json $OUT/r/h100.json
timeout 100 $B --out $OUT/r/after > $OUT/r/after.log 2>&1; stamp "bench after rc=$?"
timeout 100 python -m pytest -q -m gpu tests/test_fp8_forward.py tests/test_fp8_tune_gpu.py -p no:cacheprovider \
  > $OUT/r/gpu-tests.txt 2>&1; stamp "gpu tests rc=$?"
cd $OUT && tar czf r.tgz r && rm -rf r
cat $OUT/steps21.txt
