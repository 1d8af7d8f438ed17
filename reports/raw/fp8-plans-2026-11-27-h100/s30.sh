#!/bin/bash
# one-chip call (2026-11-27 #6): decode split counts between the powers of two (fp8 and bf16 caches, GQA 32:8)
cd "$(dirname "$0")/.."
mkdir -p /tmp/site && for w in .whl/*.whl; do python -m zipfile -e $w /tmp/site; done
ROOT=$(pwd); export PYTHONPATH=/tmp/site:$ROOT
cd bench
timeout 280 python decode_sweep.py --kv-dtype fp8 --kv-heads 8 --problems 8x8192,8x16384 --grid splits --out $OUT --label fp8-splits > $OUT/log-fp8.txt 2>&1; echo fp8 rc=$?
timeout 250 python decode_sweep.py --kv-heads 8 --problems 8x8192,8x2048 --grid splits --out $OUT --label bf16-splits > $OUT/log-bf16.txt 2>&1; echo bf16 rc=$?
grep "^| [0-9]" $OUT/decode-sweep-*.md
