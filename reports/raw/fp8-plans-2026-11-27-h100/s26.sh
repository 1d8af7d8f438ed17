#!/bin/bash
# one-chip call (2026-11-27 #6): fp8-KV decode split kernel, V read as packed words (experiment), against the shipped
cd "$(dirname "$0")/.."
mkdir -p /tmp/site && for w in .whl/*.whl; do python -m zipfile -e $w /tmp/site; done
ROOT=$(pwd); export PYTHONPATH=/tmp/site:$ROOT
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv > $OUT/device.txt
for v in 0 2 1; do
  VPACK=$v timeout 200 python .devcheck/vpack/run.py --kv-dtype fp8 --kv-heads 8 --problems 8x8192,8x16384,32x8192 \
     --out $OUT --label fp8-vpack$v > $OUT/log$v.txt 2>&1; echo "VPACK=$v rc=$?"
  grep "rel L2\|^| [0-9]" $OUT/log$v.txt $OUT/decode-sweep-fp8-vpack$v.md | cut -c1-400
done
