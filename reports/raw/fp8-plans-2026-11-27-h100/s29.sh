#!/bin/bash
# one-chip call (2026-11-27 #6): fp8_overhead with the device-time table: V K-major (copy + kernel) against V as given
cd "$(dirname "$0")/.."
mkdir -p /tmp/site && for w in .whl/*.whl; do python -m zipfile -e $w /tmp/site; done
ROOT=$(pwd); export PYTHONPATH=/tmp/site:$ROOT
cd bench
timeout 300 python fp8_overhead.py --out $OUT --seqlens 128,256,512,1024,2048,4096,8192 --rounds 5 > $OUT/log.txt 2>&1; echo rc=$?
cat $OUT/fp8_overhead.md
