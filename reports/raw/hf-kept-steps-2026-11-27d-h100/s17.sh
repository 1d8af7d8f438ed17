#!/bin/bash
cd "$(dirname "$0")/.."
mkdir -p /tmp/site && for w in .whl/*.whl; do python -m zipfile -e $w /tmp/site; done
export PYTHONPATH=/tmp/site:$(pwd)
timeout 120 python -m pytest -q -m gpu -p no:cacheprovider tests/test_launch_cache.py > $OUT/gpu-tests-17.txt 2>&1; echo rc=$?; tail -3 $OUT/gpu-tests-17.txt
