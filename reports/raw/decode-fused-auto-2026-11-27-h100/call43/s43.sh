#!/bin/bash
# one-chip call (2026-11-27 #7): fp8-KV decode GPU tests under the fused-merge default (small caches fuse on CUDA)
cd "$(dirname "$0")/.."
mkdir -p /tmp/site && for w in .whl/*.whl; do python -m zipfile -e $w /tmp/site; done
export PYTHONPATH=/tmp/site:$PWD
timeout 250 python -m pytest -q -m gpu tests/test_decode_fused_gpu.py -k "fp8 or shipped_rule" > $OUT/gpu-tests.txt 2>&1
echo "tests rc=$?"; tail -3 $OUT/gpu-tests.txt
