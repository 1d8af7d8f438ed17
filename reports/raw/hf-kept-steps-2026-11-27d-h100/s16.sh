#!/bin/bash
# one-chip call (2026-11-27 #4): GPU tests of the serving paths on the final code; hf_decode_call once more
cd "$(dirname "$0")/.."
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 ))s] $*" >> $OUT/steps16.txt; }
mkdir -p /tmp/site && for w in .whl/*.whl; do python -m zipfile -e $w /tmp/site; done
export PYTHONPATH=/tmp/site:$(pwd)
mkdir -p /tmp/o16
(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; lscpu | grep "Model name"; grep -c "_KEPT_STEPS" rocmflash/integrations/hf.py; grep -c fits_buffer_addressing rocmflash/kernels/launch.py) > /tmp/o16/gpu.txt 2>&1
timeout 260 python -m pytest -q -m gpu -p no:cacheprovider tests/test_kvcache_gpu.py tests/test_hf_gpu.py tests/test_hf_no_sync.py tests/test_decode_incumbent_gpu.py tests/test_graphs_gpu.py tests/test_small_incumbent_gpu.py tests/test_sdpa_gpu.py tests/test_ops_gpu.py tests/test_launch_cache.py > /tmp/o16/gpu-tests.txt 2>&1; stamp "gpu tests rc=$?"
cd bench && timeout 60 python hf_decode_call.py --out /tmp/o16/hfd --batches 1,8 --used 576,4096 --rounds 5 > /tmp/o16/hfd.log 2>&1; stamp "hfd rc=$?"
cp $OUT/steps16.txt /tmp/o16/; cd /tmp/o16 && tar czf $OUT/s16.tgz . ; cat $OUT/steps16.txt; tail -3 /tmp/o16/gpu-tests.txt; grep "^| [18] " /tmp/o16/hfd/hf-decode-call.md | cut -d'|' -f2-9
