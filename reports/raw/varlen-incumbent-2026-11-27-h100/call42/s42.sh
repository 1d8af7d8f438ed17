#!/bin/bash
# one-chip call (2026-11-27 #7): GPU tests on the final code (after the TaskItem read-back)
cd "$(dirname "$0")/.."
mkdir -p /tmp/site && for w in .whl/*.whl; do python -m zipfile -e $w /tmp/site; done
export PYTHONPATH=/tmp/site:$PWD
timeout 540 python -m pytest -q -m gpu tests/test_varlen_tune_gpu.py tests/test_varlen_incumbent_gpu.py tests/test_decode_tune_gpu.py \
  tests/test_decode_fused_gpu.py tests/test_varlen_bwd_tune_gpu.py tests/test_fp8_tune_gpu.py tests/test_kvcache_gpu.py \
  tests/test_decode_incumbent_gpu.py tests/test_launch_cache.py > $OUT/gpu-tests.txt 2>&1
echo "tests rc=$?"; tail -3 $OUT/gpu-tests.txt
