mkdir -p /tmp/site && for w in .whl/*.whl; do python -m zipfile -e $w /tmp/site; done
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 300 python -m pytest -q -m gpu tests/test_decode_incumbent_gpu.py tests/test_small_incumbent_gpu.py -rA 2>&1 | grep -v "^  \|warn" | tail -25 | tee $OUT/gpu-tests-s6.txt
