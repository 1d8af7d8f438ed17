#!/bin/bash
# one-chip call (2026-11-27 #6): fp8 forward kept plans (03704ff+): GPU tests, fp8_overhead on the new code (with the
# checked-every-call row) and the old code (2028bd8, .devcheck/old) in turn, then bench/fp8.py forward rows
cd "$(dirname "$0")/.."
mkdir -p /tmp/site && for w in .whl/*.whl; do python -m zipfile -e $w /tmp/site; done
ROOT=$(pwd); export PYTHONPATH=/tmp/site:$ROOT
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv > $OUT/device.txt
timeout 200 python -m pytest -q -m gpu tests/test_fp8_plans_gpu.py tests/test_fp8_forward.py tests/test_fp8_vlayout.py \
  tests/test_fp8_kvcache.py tests/test_kvcache_gpu.py tests/test_decode_fused_gpu.py > $OUT/gpu-tests.txt 2>&1; echo "tests rc=$?"
tail -3 $OUT/gpu-tests.txt
cd bench
mkdir -p $OUT/new1 $OUT/old1 $OUT/new2
timeout 90 python fp8_overhead.py --out $OUT/new1 --seqlens 128,512,1024,2048 --rounds 7 > $OUT/new1/log.txt 2>&1; echo new1 rc=$?
PYTHONPATH=/tmp/site:$ROOT/.devcheck/old timeout 90 python fp8_overhead.py --out $OUT/old1 --seqlens 128,512,1024,2048 --rounds 7 > $OUT/old1/log.txt 2>&1; echo old1 rc=$?
timeout 90 python fp8_overhead.py --out $OUT/new2 --seqlens 128,512,1024,2048 --rounds 7 > $OUT/new2/log.txt 2>&1; echo new2 rc=$?
for d in new1 old1 new2; do echo "== $d"; grep "^| [0-9]" $OUT/$d/fp8_overhead.md; done
timeout 150 python fp8.py --out $OUT/fp8 --quick --seqlens 1024,2048,4096,8192 --skip-decode > $OUT/fp8-log.txt 2>&1; echo fp8 rc=$?
grep "^| " $OUT/fp8/*.md | head -30
cd $OUT && tar czf raw.tgz new1 old1 new2 fp8 fp8-log.txt && rm -rf new1 old1 new2 fp8
