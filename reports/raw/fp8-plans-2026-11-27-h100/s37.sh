#!/bin/bash
# one-chip call (2026-11-27 #6): GPU tests after the read-back (one fp8 execution path, launch.seen_before)
cd "$(dirname "$0")/.."
mkdir -p /tmp/site && for w in .whl/*.whl; do python -m zipfile -e $w /tmp/site; done
export PYTHONPATH=/tmp/site:$PWD
timeout 400 python -m pytest -q -m gpu tests/test_fp8_plans_gpu.py tests/test_fp8_forward.py tests/test_fp8_vlayout.py \
  tests/test_fp8_kvcache.py tests/test_kvcache_gpu.py tests/test_hf_no_sync.py tests/test_decode_incumbent_gpu.py \
  tests/test_varlen_gpu.py > $OUT/gpu-tests.txt 2>&1
echo "rc=$?"; tail -2 $OUT/gpu-tests.txt
