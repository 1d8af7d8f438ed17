#!/bin/bash
# one-chip call (2026-11-27 #7): varlen incumbent with training steps: GPU tests, re-tune the H100 varlen entries, bench
cd "$(dirname "$0")/.."
mkdir -p /tmp/site && for w in .whl/*.whl; do python -m zipfile -e $w /tmp/site; done
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/gpu.txt; lscpu | grep "Model name" >> $OUT/gpu.txt
python -c "import torch, triton, inspect; print(torch.__version__, triton.__version__); from torch.nn.attention.varlen import varlen_attn; print(inspect.signature(varlen_attn))" >> $OUT/gpu.txt 2>&1
timeout 200 python -m pytest -q -m gpu tests/test_varlen_incumbent_gpu.py tests/test_varlen_tune_gpu.py tests/test_varlen_gpu.py \
  tests/test_varlen_no_sync.py > $OUT/gpu-tests.txt 2>&1
echo "tests rc=$?"; tail -2 $OUT/gpu-tests.txt
mkdir -p $OUT/cfg
export ROCMFLASH_CONFIG_DIR=$OUT/cfg
( timeout 200 python -m rocmflash.cli tune --mode varlen --gpu auto --head-dim 128 --dtype bf16 --causal --heads 32 --kv-heads 8 --batch 16 --seqlen 4096
  timeout 120 python -m rocmflash.cli tune --mode varlen --gpu auto --head-dim 128 --dtype bf16 --causal --heads 32 --kv-heads 8 --batch 64 --seqlen 1024
  timeout 200 python -m rocmflash.cli tune --mode varlen --gpu auto --head-dim 64 --dtype bf16 --causal --heads 16 --kv-heads 16 --batch 32 --seqlen 8192
  timeout 200 python -m rocmflash.cli tune --mode varlen --gpu auto --head-dim 128 --dtype bf16 --causal --heads 16 --kv-heads 16 --batch 16 --seqlen 4096 ) > $OUT/tune.log 2>&1
echo "tune rc=$?"; grep -i "platform\|best:\|before:" $OUT/tune.log
cd bench && timeout 200 python varlen.py --mha --rounds 3 --out $OUT/bench > $OUT/bench.log 2>&1; echo "bench rc=$?"; unset ROCMFLASH_CONFIG_DIR
cd $OUT && tar czf all.tgz cfg bench *.log gpu-tests.txt gpu.txt && ls
