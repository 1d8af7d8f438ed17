#!/bin/bash
# one-chip call (2026-11-27 #6): GPU tests on the final code, the suites this session's changes reach
cd "$(dirname "$0")/.."
mkdir -p /tmp/site && for w in .whl/*.whl; do python -m zipfile -e $w /tmp/site; done
export PYTHONPATH=/tmp/site:$PWD
git log --oneline -1 > $OUT/rev.txt 2>&1
timeout 560 python -m pytest -q -m gpu tests/test_hf_gpu.py tests/test_hf_no_sync.py tests/test_decode_incumbent_gpu.py \
  tests/test_graphs_gpu.py tests/test_ops_gpu.py tests/test_sdpa_gpu.py tests/test_small_incumbent_gpu.py \
  tests/test_launch_cache.py tests/test_kernels_gpu.py tests/test_varlen_gpu.py tests/test_varlen_no_sync.py \
  tests/test_fp8_plans_gpu.py tests/test_fp8_forward.py tests/test_kvcache_gpu.py > $OUT/gpu-tests.txt 2>&1
echo "rc=$?"; tail -5 $OUT/gpu-tests.txt
