#!/bin/bash
# one-chip call (2026-11-27 #7): the fused decode merge by default for small caches on CUDA
cd "$(dirname "$0")/.."
mkdir -p /tmp/site && for w in .whl/*.whl; do python -m zipfile -e $w /tmp/site; done
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/gpu.txt; lscpu | grep "Model name" >> $OUT/gpu.txt
python -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)" >> $OUT/gpu.txt
timeout 170 python -m pytest -q -m gpu tests/test_decode_fused_gpu.py tests/test_kvcache_gpu.py tests/test_graphs_gpu.py \
  tests/test_hf_no_sync.py tests/test_decode_incumbent_gpu.py > $OUT/gpu-tests.txt 2>&1
echo "tests rc=$?"; tail -2 $OUT/gpu-tests.txt
cd bench
timeout 200 python decode_entry.py --rounds 3 --batches 1,8 --lengths 2048,8192,32768 --kv-heads 8,32 --fused --out $OUT/de > $OUT/de.log 2>&1; echo "de rc=$?"
timeout 60 python host_profile.py --case decode --no-profile --calls 300 --rounds 5 --out $OUT/hp > $OUT/hp.log 2>&1; echo "hp rc=$?"
timeout 70 python generate.py --batches 1 --caches dynamic,static --rounds 3 --label auto --out $OUT/gen > $OUT/gen-auto.log 2>&1; echo "gen auto rc=$?"
ROCMFLASH_DECODE_FUSED_COMBINE=0 timeout 70 python generate.py --batches 1 --caches dynamic,static --rounds 3 --label two-launches --out $OUT/gen > $OUT/gen-two.log 2>&1; echo "gen two rc=$?"
cd $OUT && tar czf all.tgz de hp gen *.log gpu-tests.txt gpu.txt && ls
