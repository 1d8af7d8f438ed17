set -x
mkdir -p /tmp/site && for w in .whl/*.whl; do python -m zipfile -e $w /tmp/site; done
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name --format=csv,noheader
python .devcheck/pack_gpu.py 2>&1 | tee $OUT/pack_gpu.txt
cd bench
timeout 230 python decode_sweep.py --kv-dtype fp8 --kv-heads 8 --problems 8x8192,8x16384 --grid pack --packs 1,2,4 --label fp8-pack --out $OUT 2>&1 | tail -30
timeout 120 python decode_sweep.py --kv-heads 8 --problems 8x8192 --grid pack --packs 1,2,4 --label bf16-pack --out $OUT 2>&1 | tail -20
cd ..
timeout 100 python -m pytest -q -m gpu tests/test_decode_fused_gpu.py -x 2>&1 | tail -3
