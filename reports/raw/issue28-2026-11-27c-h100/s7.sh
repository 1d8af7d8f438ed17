#!/bin/bash
# one-chip call A (2026-11-27 #3): #28 acceptance on this checkout: user grid, tiny-shape host, e2e train/prefill, HF generate
cd "$(dirname "$0")/.."
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/steps.txt; }
mkdir -p /tmp/site && for w in .whl/*.whl; do python -m zipfile -e $w /tmp/site; done
export PYTHONPATH=/tmp/site:$PWD
(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; git log --oneline -1; python -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)"; lscpu | grep "Model name") > $OUT/gpu.txt 2>&1
C=$(git rev-parse --short HEAD)
timeout 210 python bench/user_grid.py --rounds 3 --label h100 --commit $C --out $OUT > $OUT/user-grid.log 2>&1; stamp "user_grid rc=$?"
timeout 80 python bench/host_overhead.py --n 300 --rounds 5 --label h100 --out $OUT > $OUT/host-overhead.log 2>&1; stamp "host_overhead rc=$?"
timeout 130 python bench/generate.py --out $OUT --batches 1,8,32 --caches dynamic,static --rounds 3 --label h100 > $OUT/generate.log 2>&1; stamp "generate rc=$?"
timeout 140 python bench/e2e.py --out $OUT/e2e --prefill 4096 --train 2048,4096 > $OUT/e2e.log 2>&1; stamp "e2e rc=$?"
cd $OUT && tar czf s7.tgz --exclude=s7.tgz . && cat steps.txt
