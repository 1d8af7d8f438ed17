#!/bin/bash
# one-chip call (2026-11-27 #4): #28 HF one-token steps kept per step: hf_decode_call before (HEAD's package) / after, interleaved processes; generate; GPU tests
cd "$(dirname "$0")/.."
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 ))s] $*" >> $OUT/steps13.txt; }
mkdir -p /tmp/site && for w in .whl/*.whl; do python -m zipfile -e $w /tmp/site; done
mkdir -p /tmp/o13
(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; git log --oneline -1; lscpu | grep "Model name") > /tmp/o13/gpu.txt 2>&1
cd bench
for i in 1 2; do
  for which in before after; do
    if [ $which = before ]; then P=/tmp/site:$(cd ..; pwd)/.devcheck/old; else P=/tmp/site:$(cd ..; pwd); fi
    PYTHONPATH=$P timeout 100 python hf_decode_call.py --out /tmp/o13/hfd-$which-$i --batches 1,8 --used 576,4096 --rounds 5 > /tmp/o13/hfd-$which-$i.log 2>&1; stamp "hfd $which $i rc=$?"
  done
done
export PYTHONPATH=/tmp/site:$(cd ..; pwd)
timeout 260 python generate.py --out /tmp/o13 --batches 1,8 --caches dynamic,static --rounds 7 --label h100 > /tmp/o13/generate.log 2>&1; stamp "generate rc=$?"
cd ..
timeout 150 python -m pytest -q -m gpu -p no:cacheprovider tests/test_hf_gpu.py tests/test_hf_no_sync.py tests/test_decode_incumbent_gpu.py > /tmp/o13/gpu-tests.txt 2>&1; stamp "gpu tests rc=$?"
cp $OUT/steps13.txt /tmp/o13/; cd /tmp/o13 && tar czf $OUT/s13.tgz . ; cat $OUT/steps13.txt; for f in /tmp/o13/hfd-*/hf-decode-call.md; do echo $f; grep "^| [18] " $f; done; grep "^| " /tmp/o13/generate-h100.md; tail -2 /tmp/o13/gpu-tests.txt
