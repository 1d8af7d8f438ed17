#!/bin/bash
# one-chip call (2026-11-27 #6): the equal-length dense route with return_lse: GPU tests, bench/varlen.py (LSE rows)
cd "$(dirname "$0")/.."
mkdir -p /tmp/site && for w in .whl/*.whl; do python -m zipfile -e $w /tmp/site; done
export PYTHONPATH=/tmp/site:$PWD
timeout 150 python -m pytest -q -m gpu tests/test_varlen_gpu.py tests/test_varlen_no_sync.py > $OUT/gpu-tests.txt 2>&1
echo "tests rc=$?"; tail -2 $OUT/gpu-tests.txt
cd bench
timeout 400 python varlen.py --out $OUT --rounds 5 > $OUT/log.txt 2>&1; echo rc=$?
grep "equal" $OUT/varlen.md | grep -v jagged | cut -c1-160
