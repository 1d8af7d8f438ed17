#!/bin/bash
# one-chip call (2026-11-27 #4): #28 generate with the first implementation alternating by round (this checkout); generate_profile B1
cd "$(dirname "$0")/.."
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 ))s] $*" >> $OUT/steps15.txt; }
mkdir -p /tmp/site && for w in .whl/*.whl; do python -m zipfile -e $w /tmp/site; done
export PYTHONPATH=/tmp/site:$(pwd)
mkdir -p /tmp/o15
(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; git log --oneline -1; lscpu | grep "Model name") > /tmp/o15/gpu.txt 2>&1
cd bench
timeout 200 python generate.py --out /tmp/o15 --batches 1,8 --caches dynamic,static --new 32 --rounds 8 --label alt-1 > /tmp/o15/gen-1.log 2>&1; stamp "generate 1 rc=$?"
timeout 200 python generate_profile.py --out /tmp/o15 --batch 1 --new 32 --rounds 8 > /tmp/o15/generate-profile.log 2>&1; stamp "generate_profile rc=$?"
timeout 150 python generate.py --out /tmp/o15 --batches 1,8 --caches dynamic,static --new 32 --rounds 8 --label alt-2 > /tmp/o15/gen-2.log 2>&1; stamp "generate 2 rc=$?"
cp $OUT/steps15.txt /tmp/o15/; cd /tmp/o15 && tar czf $OUT/s15.tgz . ; cat $OUT/steps15.txt; for f in /tmp/o15/generate-*.md; do echo $f; grep "^| [18] " $f | cut -d'|' -f2-8; done; grep -A4 "^| impl" /tmp/o15/generate-profile-b1.md | cut -c1-150
