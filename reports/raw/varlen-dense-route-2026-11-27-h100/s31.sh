#!/bin/bash
# one-chip call (2026-11-27 #6): varlen against SDPA on jagged nested tensors (the platform's varlen attention)
cd "$(dirname "$0")/.."
mkdir -p /tmp/site && for w in .whl/*.whl; do python -m zipfile -e $w /tmp/site; done
ROOT=$(pwd); export PYTHONPATH=/tmp/site:$ROOT
cd bench
timeout 500 python varlen.py --out $OUT --rounds 5 > $OUT/log.txt 2>&1; echo rc=$?
cat $OUT/varlen.md; tail -5 $OUT/log.txt
