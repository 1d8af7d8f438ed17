#!/bin/bash
# one-chip call (2026-11-27 #4): #28 generate before (25e50a1's package) / after (this checkout), alternating processes on one host
cd "$(dirname "$0")/.."
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 ))s] $*" >> $OUT/steps14.txt; }
mkdir -p /tmp/site && for w in .whl/*.whl; do python -m zipfile -e $w /tmp/site; done
mkdir -p /tmp/o14
(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; git log --oneline -1; lscpu | grep "Model name") > /tmp/o14/gpu.txt 2>&1
ROOT=$(pwd)
cd bench
for i in 1 2; do
  for which in before after; do
    if [ $which = before ]; then P=/tmp/site:$ROOT/.devcheck/old; else P=/tmp/site:$ROOT; fi
    PYTHONPATH=$P timeout 140 python generate.py --out /tmp/o14 --batches 1,8 --caches dynamic,static --new 32 --rounds 5 --label $which-$i > /tmp/o14/gen-$which-$i.log 2>&1; stamp "generate $which $i rc=$?"
  done
done
PYTHONPATH=/tmp/site:$ROOT/.devcheck/old timeout 60 python hf_decode_call.py --out /tmp/o14/hfd-before --batches 1,8 --used 576,4096 --rounds 5 > /tmp/o14/hfd-before.log 2>&1; stamp "hfd before rc=$?"
PYTHONPATH=/tmp/site:$ROOT timeout 60 python hf_decode_call.py --out /tmp/o14/hfd-after --batches 1,8 --used 576,4096 --rounds 5 > /tmp/o14/hfd-after.log 2>&1; stamp "hfd after rc=$?"
cp $OUT/steps14.txt /tmp/o14/; cd /tmp/o14 && tar czf $OUT/s14.tgz . ; cat $OUT/steps14.txt; for f in /tmp/o14/generate-*.md; do echo $f; grep "rocmflash |" $f; done; for f in /tmp/o14/hfd-*/hf-decode-call.md; do echo $f; grep "^| [18] " $f | cut -d'|' -f2-9; done
