#!/bin/bash
# one-chip call B (2026-11-27 #3): #28 decode through every entry point on the issue's grid; GPU tests of the serving paths
cd "$(dirname "$0")/.."
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 ))s] $*" >> $OUT/steps8.txt; }
mkdir -p /tmp/site && for w in .whl/*.whl; do python -m zipfile -e $w /tmp/site; done
export PYTHONPATH=/tmp/site:$PWD
mkdir -p /tmp/o8
(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; git log --oneline -1) > /tmp/o8/gpu.txt 2>&1
timeout 330 python bench/decode_entry.py --out /tmp/o8 --rounds 3 --batches 1,8,32 --lengths 2048,8192,32768,65536 --kv-heads 8,32 > /tmp/o8/decode-entry.log 2>&1; stamp "decode_entry rc=$?"
timeout 200 python -m pytest -q -m gpu -p no:cacheprovider tests/test_kvcache_gpu.py tests/test_hf_gpu.py tests/test_hf_no_sync.py tests/test_decode_incumbent_gpu.py tests/test_graphs_gpu.py tests/test_small_incumbent_gpu.py tests/test_sdpa_gpu.py tests/test_ops_gpu.py > /tmp/o8/gpu-tests.txt 2>&1; stamp "gpu tests rc=$?"
cp $OUT/steps8.txt /tmp/o8/; cd /tmp/o8 && tar czf $OUT/s8.tgz . ; cat $OUT/steps8.txt; tail -3 /tmp/o8/gpu-tests.txt
