#!/bin/bash
# one-chip call (2026-11-27 #6): varlen equal-length dense route: GPU tests, bench/varlen.py (all mixes, SDPA jagged too)
cd "$(dirname "$0")/.."
mkdir -p /tmp/site && for w in .whl/*.whl; do python -m zipfile -e $w /tmp/site; done
ROOT=$(pwd); export PYTHONPATH=/tmp/site:$ROOT
timeout 200 python -m pytest -q -m gpu tests/test_varlen_gpu.py tests/test_varlen_no_sync.py tests/test_fp8_plans_gpu.py \
  tests/test_multi_gpu.py > $OUT/gpu-tests.txt 2>&1; echo "tests rc=$?"; tail -3 $OUT/gpu-tests.txt
cd bench
timeout 330 python varlen.py --out $OUT --rounds 5 > $OUT/log.txt 2>&1; echo rc=$?
grep "equal\|^- " $OUT/varlen.md | grep -v "jagged" | cut -c1-200
