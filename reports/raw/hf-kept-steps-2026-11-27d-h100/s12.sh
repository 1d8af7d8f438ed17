#!/bin/bash
# one-chip call (2026-11-27 #4): #28 where the host time of a B1 decode call goes on a GPU host (host_profile decode, host_breakdown floors)
cd "$(dirname "$0")/.."
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 ))s] $*" >> $OUT/steps12.txt; }
mkdir -p /tmp/site && for w in .whl/*.whl; do python -m zipfile -e $w /tmp/site; done
export PYTHONPATH=/tmp/site:$PWD
mkdir -p /tmp/o12
(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; git log --oneline -1; lscpu | grep "Model name") > /tmp/o12/gpu.txt 2>&1
cd bench
timeout 200 python host_profile.py --case decode --calls 2000 --rounds 5 --top 30 --out /tmp/o12 > /tmp/o12/host-profile-decode.log 2>&1; stamp "host_profile decode rc=$?"
timeout 200 python host_breakdown.py --out /tmp/o12 > /tmp/o12/host-breakdown.log 2>&1; stamp "host_breakdown rc=$?"
cd ..
cp $OUT/steps12.txt /tmp/o12/; cd /tmp/o12 && tar czf $OUT/s12.tgz . ; cat $OUT/steps12.txt; grep "^| " /tmp/o12/host-profile-decode.log | head -20; grep "^| " /tmp/o12/host-breakdown.log | head -30
