#!/bin/bash
# one-chip call (2026-11-27 #4): generate B8 dynamic (left-padded), 25e50a1's package against this checkout's, order alternating by round
cd "$(dirname "$0")/.."
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 ))s] $*" >> $OUT/steps18.txt; }
mkdir -p /tmp/site && for w in .whl/*.whl; do python -m zipfile -e $w /tmp/site; done
ROOT=$(pwd); cd bench
for which in after before; do
  if [ $which = before ]; then P=/tmp/site:$ROOT/.devcheck/old; else P=/tmp/site:$ROOT; fi
  PYTHONPATH=$P timeout 75 python generate.py --out $OUT --batches 8 --caches dynamic --new 32 --rounds 6 --label b8-$which > $OUT/gen-$which.log 2>&1; stamp "generate $which rc=$?"
done
cat $OUT/steps18.txt; grep "^| 8 " $OUT/generate-b8-*.md | cut -d'|' -f1-9
