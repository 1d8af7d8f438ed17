#!/usr/bin/env bash
# One device call: the GPU-marked tests for the safety work (issue 46) and the host-overhead
# comparison against the previous release copy. Writes everything under $OUT.
# Usage (repo root, on the GPU box): bash benchmarks/gpu_checks.sh [tests|bench|all]
set -u
what="${1:-all}"
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD:$PWD/.baseline
{ nvidia-smi -L; python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version())"; date -u; } > "$OUT/device.txt" 2>&1
if [[ "$what" == tests || "$what" == all ]]; then
  timeout "${TEST_LIMIT:-420}" python3 -m pytest -q -m gpu -p no:cacheprovider -rfEs \
    tests/test_kvcache_gpu.py tests/test_decode_fused_gpu.py tests/test_graphs_gpu.py tests/test_hf_gpu.py \
    tests/test_decode_incumbent_gpu.py tests/test_hf_no_sync.py tests/test_error_words.py tests/test_replay_guard.py \
    tests/test_sdpa_registry.py tests/test_served_backend_gpu.py tests/test_ops_gpu.py tests/test_sdpa_gpu.py \
    tests/test_fp8_plans_gpu.py tests/test_small_incumbent_gpu.py tests/test_launch_cache.py tests/test_varlen_no_sync.py \
    tests/test_varlen_incumbent_gpu.py ${EXTRA_TESTS:-} > "$OUT/gpu_tests.txt" 2>&1
  echo "pytest rc=$?" >> "$OUT/gpu_tests.txt"
  tail -30 "$OUT/gpu_tests.txt"
fi
if [[ "$what" == bench || "$what" == all ]]; then
  timeout "${BENCH_LIMIT:-150}" python3 benchmarks/host_overhead.py --modules rocmflash_before,rocmflash --label issue46 \
    --out "$OUT" > "$OUT/host_overhead.log" 2>&1
  echo "bench rc=$?" >> "$OUT/host_overhead.log"
  tail -40 "$OUT/host_overhead.log"
fi
