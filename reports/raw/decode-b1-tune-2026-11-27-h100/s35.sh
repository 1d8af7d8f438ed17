#!/bin/bash
# one-chip call (2026-11-27 #6): B1/B8 decode through every entry point with the fused merge timed beside (one launch)
cd "$(dirname "$0")/.."
mkdir -p /tmp/site && for w in .whl/*.whl; do python -m zipfile -e $w /tmp/site; done
export PYTHONPATH=/tmp/site:$PWD
cd bench
timeout 400 python decode_entry.py --out $OUT --rounds 5 --batches 1,8 --lengths 2048,8192,32768,65536 --kv-heads 8 \
  --fused > $OUT/log.txt 2>&1; echo rc=$?
grep "kvcache\|sdpa default" $OUT/decode_entry.md
