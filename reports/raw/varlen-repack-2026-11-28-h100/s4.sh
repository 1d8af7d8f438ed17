mkdir -p /tmp/site && for w in .whl/*.whl; do python -m zipfile -e $w /tmp/site; done
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 330 python -m pytest -q -m gpu tests/test_varlen_gpu.py tests/test_varlen_no_sync.py tests/test_launch_cache.py tests/test_varlen_incumbent_gpu.py tests/test_hf_gpu.py tests/test_varlen_bwd_tune_gpu.py tests/test_varlen_tune_gpu.py 2>&1 | tail -8 | tee $OUT/gpu-tests.txt
cd bench
for i in 1 2; do
  timeout 60 python varlen_repack.py --rounds 5 --calls 150 --code ../.devcheck/before --label before-$i --out $OUT | tail -8
  timeout 60 python varlen_repack.py --rounds 5 --calls 150 --label after-$i --out $OUT | tail -8
done
