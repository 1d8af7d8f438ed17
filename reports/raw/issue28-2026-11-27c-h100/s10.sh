#!/bin/bash
# one-chip call D (2026-11-27 #3): tune the untuned H100 decode entries (D128 bf16, Hq32, Hkv 32 and 8, B 32/8/1,
# KV 2k-64k) into a fresh user DB, then decode through every entry point with it
cd "$(dirname "$0")/.."
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 ))s] $*" >> /tmp/o9/steps.txt; }
mkdir -p /tmp/site /tmp/o9 /tmp/cfg && for w in .whl/*.whl; do python -m zipfile -e $w /tmp/site; done
export PYTHONPATH=/tmp/site:$PWD ROCMFLASH_CONFIG_DIR=/tmp/cfg
(nvidia-smi --query-gpu=name --format=csv,noheader; git log --oneline -1) > /tmp/o9/gpu.txt 2>&1
END=$((T0 + 340))
for BH in "8 32" "32 8" "8 8"; do set -- $BH; B=$1; H=$2; {
  left=$((END - $(date +%s))); [ $left -lt 20 ] && break 2
  timeout $left python -m rocmflash.cli tune --mode decode --gpu auto --head-dim 128 --dtype bf16 --heads 32 --kv-heads $H \
    --batch $B --seqlen 2048 --seqlen 8192 --seqlen 32768 --seqlen 65536 > /tmp/o9/tune-b$B-h$H.log 2>&1
  stamp "tune B$B Hkv$H rc=$?"
}; done
cp /tmp/cfg/*.json /tmp/o9/ 2>/dev/null
timeout 100 python bench/decode_entry.py --out /tmp/o9 --rounds 3 --batches 1,8,32 --lengths 2048,8192,32768,65536 --kv-heads 8,32 > /tmp/o9/decode-entry.log 2>&1; stamp "decode_entry rc=$?"
cd /tmp/o9 && tar czf $OUT/s10.tgz . ; cat steps.txt
