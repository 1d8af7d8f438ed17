#!/bin/bash
# one-chip call (2026-11-27 #7): kept launches hand Triton's launcher addresses (ints) instead of tensors
cd "$(dirname "$0")/.."
mkdir -p /tmp/site && for w in .whl/*.whl; do python -m zipfile -e $w /tmp/site; done
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/gpu.txt; lscpu | grep "Model name" >> $OUT/gpu.txt
python -c "import torch, triton; print(torch.__version__, triton.__version__)" >> $OUT/gpu.txt
cd bench
timeout 100 python host_profile.py --case decode --pointers both --no-profile --calls 300 --rounds 5 --out $OUT/hp > $OUT/hp-decode.log 2>&1; echo "hp decode rc=$?"
timeout 80 python host_profile.py --case fp8 --pointers both --no-profile --calls 300 --rounds 5 --out $OUT/hp > $OUT/hp-fp8.log 2>&1; echo "hp fp8 rc=$?"
timeout 90 python decode_entry.py --rounds 3 --batches 1,8 --lengths 2048,8192,32768 --kv-heads 8 --fused --out $OUT/de-ints > $OUT/de-ints.log 2>&1; echo "de ints rc=$?"
ROCMFLASH_TENSOR_POINTERS=1 timeout 90 python decode_entry.py --rounds 3 --batches 1,8 --lengths 2048,8192,32768 --kv-heads 8 --fused --out $OUT/de-tensors > $OUT/de-tensors.log 2>&1; echo "de tensors rc=$?"
cd ..
timeout 200 python -m pytest -q -m gpu tests/test_launch_cache.py tests/test_kvcache_gpu.py tests/test_fp8_plans_gpu.py \
  tests/test_fp8_forward.py tests/test_graphs_gpu.py tests/test_decode_fused_gpu.py tests/test_varlen_gpu.py \
  tests/test_hf_no_sync.py > $OUT/gpu-tests.txt 2>&1
echo "tests rc=$?"; tail -2 $OUT/gpu-tests.txt
cd $OUT && tar czf all.tgz hp de-ints de-tensors *.log gpu-tests.txt gpu.txt && ls
