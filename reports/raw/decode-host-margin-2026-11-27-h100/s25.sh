#!/bin/bash
# one-chip call (2026-11-27 #5): #28 decode grid B1/B8 x KV 2k-64k x GQA 32:8 and 32:32 through attention, patch_sdpa
# and flash_attn_with_kvcache, code 98fdf80 (host margin) with the shipped database
cd "$(dirname "$0")/.."
mkdir -p /tmp/site && for w in .whl/*.whl; do python -m zipfile -e $w /tmp/site; done
ROOT=$(pwd); export PYTHONPATH=/tmp/site:$ROOT
cd bench && timeout 540 python decode_entry.py --out $OUT --batches 1,8 --lengths 2048,8192,32768,65536 --kv-heads 8,32 \
  --rounds 5 --iters 50 > $OUT/log.txt 2>&1; echo rc=$?
grep "^| " $OUT/decode_entry.md | grep -v "unchecked"
