#!/bin/bash
# one-chip call (2026-11-27 #6): tune the untuned H100 decode entries B1 GQA 32:8 at KV 32k/64k into a fresh user DB;
# decode through every entry point with the shipped DB (before) and with the new entries (after), twice each
cd "$(dirname "$0")/.."
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 ))s] $*" >> $OUT/steps.txt; }
mkdir -p /tmp/site /tmp/cfg /tmp/empty && for w in .whl/*.whl; do python -m zipfile -e $w /tmp/site; done
export PYTHONPATH=/tmp/site:$PWD
(nvidia-smi --query-gpu=name --format=csv,noheader; git log --oneline -1) > $OUT/gpu.txt 2>&1
ROCMFLASH_CONFIG_DIR=/tmp/cfg timeout 300 python -m rocmflash.cli tune --mode decode --gpu auto --head-dim 128 --dtype bf16 \
  --heads 32 --kv-heads 8 --batch 1 --seqlen 32768 --seqlen 65536 > $OUT/tune-b1-h8.log 2>&1
stamp "tune rc=$?"
cp /tmp/cfg/*.json $OUT/ 2>/dev/null
cd bench
for i in 1 2; do
  for side in before after; do
    dir=/tmp/empty; [ $side = after ] && dir=/tmp/cfg
    mkdir -p $OUT/$side$i
    ROCMFLASH_CONFIG_DIR=$dir timeout 80 python decode_entry.py --out $OUT/$side$i --rounds 5 --batches 1 \
      --lengths 32768,65536 --kv-heads 8 > $OUT/$side$i/log.txt 2>&1; stamp "$side$i rc=$?"
  done
done
cat $OUT/steps.txt; tail -4 $OUT/tune-b1-h8.log
for d in before1 after1 before2 after2; do echo "== $d"; grep "^| 8" $OUT/$d/decode_entry.md; done
cd $OUT && tar czf runs.tgz before1 after1 before2 after2 && rm -rf before1 after1 before2 after2
