#!/bin/bash
# one-chip call (2026-11-27 #5): decode host margin. decode_entry B8 GQA4 before (f05ad25) / after, on the host as it is
# and with the bench sharing its one core with a spinning process (a host ~2x slower); explain; GPU tests
cd "$(dirname "$0")/.."
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 ))s] $*" >> $OUT/steps19.txt; }
mkdir -p /tmp/site && for w in .whl/*.whl; do python -m zipfile -e $w /tmp/site; done
ROOT=$(pwd)
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/device.txt; nproc >> $OUT/device.txt
lscpu | grep -E "Model name|MHz" >> $OUT/device.txt
cd bench
ARGS="--batches 8 --lengths 2048,8192,32768 --kv-heads 8 --rounds 5 --iters 50"
run() {  # which tag [taskset prefix]
  if [ $1 = before ]; then P=/tmp/site:$ROOT/.devcheck/old; else P=/tmp/site:$ROOT; fi
  PYTHONPATH=$P timeout 120 $3 python decode_entry.py $ARGS --out $OUT/r/$2-$1 > $OUT/r/$2-$1.log 2>&1; stamp "$2 $1 rc=$?"
}
mkdir -p $OUT/r
for rnd in 1 2; do run before normal$rnd; run after normal$rnd; done
taskset -c 3 python -c "while True: pass" & SPIN=$!
for rnd in 1 2; do run before slow$rnd "taskset -c 3"; run after slow$rnd "taskset -c 3"; done
kill $SPIN
cd $ROOT
for b in 1 8 32; do
  PYTHONPATH=/tmp/site:$ROOT timeout 60 python -m rocmflash.cli explain --gpu h100 --head-dim 128 --dtype bf16 --seqlen 1 \
    --seqlen-k 8192 --gqa 4 --batch $b --no-compile > $OUT/r/explain-b$b.txt 2>&1; stamp "explain b$b rc=$?"
done
PYTHONPATH=/tmp/site:$ROOT timeout 400 python -m pytest -q -m gpu tests/test_decode_incumbent_gpu.py tests/test_sdpa_gpu.py \
  tests/test_hf_gpu.py tests/test_hf_no_sync.py tests/test_kvcache_gpu.py tests/test_small_incumbent_gpu.py \
  -p no:cacheprovider > $OUT/r/gpu-tests.txt 2>&1; stamp "gpu tests rc=$?"
tail -3 $OUT/r/gpu-tests.txt
cd $OUT && tar czf r.tgz r && rm -rf r
cat $OUT/steps19.txt
