mkdir -p /tmp/site && for w in .whl/*.whl; do python -m zipfile -e $w /tmp/site; done
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 500 python -m pytest -q -m gpu --durations=8 tests/test_kvcache_gpu.py tests/test_decode_fused_gpu.py tests/test_graphs_gpu.py tests/test_ops_gpu.py tests/test_sdpa_gpu.py tests/test_backward_gpu.py tests/test_kernels_gpu.py tests/test_fp8_plans_gpu.py tests/test_small_incumbent_gpu.py tests/test_decode_incumbent_gpu.py tests/test_fp8_kvcache.py tests/test_fp8_forward.py 2>&1 | tail -20 | tee $OUT/gpu-tests-s5.txt
