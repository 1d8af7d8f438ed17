#!/bin/bash
# one-chip call (2026-11-27 #5): HF generate() B1/B8/B32 x dynamic/static, 12 interleaved rounds, paired ratios
cd "$(dirname "$0")/.."
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 ))s] $*" >> $OUT/steps20.txt; }
mkdir -p /tmp/site && for w in .whl/*.whl; do python -m zipfile -e $w /tmp/site; done
ROOT=$(pwd); export PYTHONPATH=/tmp/site:$ROOT
python -c "import transformers; print('transformers', transformers.__version__)" > $OUT/versions.txt
cd bench
for b in 1 8 32; do
  timeout 190 python generate.py --out $OUT --batches $b --caches dynamic,static --new 32 --rounds 12 --label b$b \
    > $OUT/gen-b$b.log 2>&1; stamp "generate b$b rc=$?"
done
cat $OUT/steps20.txt; grep -h "^| [0-9]" $OUT/generate-b*.md
