#!/usr/bin/env bash
# One device call: every GPU-marked test file, in three chains run side by side (one GPU; the chains share it).
# Chain 1 keeps the order that found the kept-plan aliasing bug (state one file leaves for a later one).
# Usage (repo root, on the GPU box): bash benchmarks/gpu_suite.sh   (LIMIT: seconds per chain, default 540;
# CHAINS: which chains to run, default "1 2 3")
# Writes $OUT/chain-N.txt (pytest -v: a line per test as it finishes, so a timeout still says how far it got).
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  > /dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD
{ nvidia-smi -L; python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version())"; date -u; } > "$OUT/device.txt" 2>&1
T=tests
CHAIN1="$T/test_kvcache_gpu.py $T/test_decode_fused_gpu.py $T/test_graphs_gpu.py $T/test_hf_gpu.py
 $T/test_decode_incumbent_gpu.py $T/test_hf_no_sync.py $T/test_error_words.py $T/test_replay_guard.py
 $T/test_sdpa_registry.py $T/test_served_backend_gpu.py $T/test_ops_gpu.py $T/test_sdpa_gpu.py $T/test_fp8_plans_gpu.py
 $T/test_small_incumbent_gpu.py $T/test_launch_cache.py $T/test_varlen_no_sync.py $T/test_varlen_incumbent_gpu.py
 $T/test_decode_sinks_gpu.py $T/test_sinks_gpu.py $T/test_export.py $T/test_hf_families_gpu.py
 $T/test_compile_varlen_kvcache_gpu.py $T/test_build_check_gpu.py $T/test_first_use_gpu.py"
CHAIN2="$T/test_kernels_gpu.py $T/test_varlen_gpu.py $T/test_backward_gpu.py $T/test_fp8_forward.py $T/test_fp8_vlayout.py
 $T/test_static_reuse_gpu.py $T/test_multi_gpu.py"
CHAIN3="$T/test_tune_gpu.py $T/test_backward_tune_gpu.py $T/test_decode_tune_gpu.py $T/test_fp8_tune_gpu.py
 $T/test_varlen_tune_gpu.py $T/test_varlen_bwd_tune_gpu.py $T/test_tune_pool_gpu.py $T/test_worker_warm_gpu.py"
n=0
for chain in "$CHAIN1" "$CHAIN2" "$CHAIN3"; do
  n=$((n + 1))
  case " ${CHAINS:-1 2 3} " in *" $n "*) ;; *) continue ;; esac
  (timeout "${LIMIT:-540}" python3 -m pytest -v -m gpu -p no:cacheprovider -rfEs $chain > "$OUT/chain-$n.txt" 2>&1
   echo "rc=$?" >> "$OUT/chain-$n.txt") &
done
wait
for i in ${CHAINS:-1 2 3}; do echo "== chain $i"; grep -E "^FAILED|^ERROR| passed| failed|rc=" "$OUT/chain-$i.txt" | tail -12; done
