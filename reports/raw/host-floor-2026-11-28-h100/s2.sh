set -x
mkdir -p /tmp/site && for w in .whl/*.whl; do python -m zipfile -e $w /tmp/site; done
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name --format=csv,noheader
python bench/launch_floor.py --calls 1000 --rounds 7 --out $OUT 2>&1 | tail -30
cd bench
timeout 240 python decode_entry.py --rounds 5 --iters 50 --batches 1,8 --lengths 2048,8192,32768 --kv-heads 8 --out $OUT 2>&1 | tail -25
timeout 120 python host_overhead.py --n 300 --rounds 5 --label s2 --out $OUT 2>&1 | tail -25
