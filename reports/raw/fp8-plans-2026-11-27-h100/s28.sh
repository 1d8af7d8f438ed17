#!/bin/bash
# one-chip call (2026-11-27 #6): host profiles on the GPU: the fp8 forward (planned) and the decode default call
cd "$(dirname "$0")/.."
mkdir -p /tmp/site && for w in .whl/*.whl; do python -m zipfile -e $w /tmp/site; done
ROOT=$(pwd); export PYTHONPATH=/tmp/site:$ROOT
cd bench
timeout 200 python host_profile.py --case fp8 --calls 500 --rounds 5 --top 40 --out $OUT > /dev/null 2>&1; echo fp8 rc=$?
timeout 250 python host_profile.py --case decode --calls 300 --rounds 3 --top 40 --out $OUT > /dev/null 2>&1; echo decode rc=$?
head -14 $OUT/host-profile-fp8.txt; head -16 $OUT/host-profile-decode.txt
