#!/bin/bash
# one-chip call (2026-11-27 #4): #28 HF generate B1 diagnosis: where the decode step's time goes; HF decode call with a folded-GQA probe
cd "$(dirname "$0")/.."
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 ))s] $*" >> $OUT/steps11.txt; }
mkdir -p /tmp/site && for w in .whl/*.whl; do python -m zipfile -e $w /tmp/site; done
export PYTHONPATH=/tmp/site:$PWD
mkdir -p /tmp/o11
(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; git log --oneline -1; python -c "import transformers; print(transformers.__version__)") > /tmp/o11/gpu.txt 2>&1
cd bench
timeout 150 python hf_decode_call.py --out /tmp/o11 --batches 1,8 --used 576,4096 --rounds 5 > /tmp/o11/hf-decode-call.log 2>&1; stamp "hf_decode_call rc=$?"
timeout 300 python generate_profile.py --out /tmp/o11 --batch 1 --rounds 5 > /tmp/o11/generate-profile.log 2>&1; stamp "generate_profile rc=$?"
cd ..
cp $OUT/steps11.txt /tmp/o11/; cd /tmp/o11 && tar czf $OUT/s11.tgz . ; cat $OUT/steps11.txt; grep "^| " /tmp/o11/hf-decode-call.md; grep -A4 "^| impl" /tmp/o11/generate-profile-b1.md
