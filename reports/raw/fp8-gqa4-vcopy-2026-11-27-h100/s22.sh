#!/bin/bash
# one-chip call (2026-11-27 #5): fp8 forward, the public call against its parts (bench/fp8_overhead.py), with the
# GQA 32:8 fp8 entries tuned in call 21 (now in configs/h100.json)
cd "$(dirname "$0")/.."
mkdir -p /tmp/site && for w in .whl/*.whl; do python -m zipfile -e $w /tmp/site; done
ROOT=$(pwd); export PYTHONPATH=/tmp/site:$ROOT
cd bench && timeout 300 python fp8_overhead.py --out $OUT --seqlens 1024,2048,8192 --rounds 5 --iters 20 > $OUT/log.txt 2>&1
echo rc=$?; tail -3 $OUT/log.txt; cat $OUT/fp8_overhead.md
