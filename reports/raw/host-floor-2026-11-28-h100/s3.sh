mkdir -p /tmp/site && for w in .whl/*.whl; do python -m zipfile -e $w /tmp/site; done
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name --format=csv,noheader
cd bench
timeout 150 python host_overhead.py --n 300 --rounds 5 --label s3a --out $OUT > /dev/null 2>&1; sed -n '/## tiny fwd$/,/## B1/p' $OUT/host_overhead-s3a.md
timeout 150 python host_profile.py --case forward --calls 300 --rounds 5 --top 30 --out $OUT 2>&1 | tail -3
ls $OUT; grep "^|" $OUT/host-profile*.txt | head -20
timeout 150 python host_overhead.py --n 300 --rounds 5 --label s3b --out $OUT > /dev/null 2>&1; sed -n '/## tiny fwd$/,/## B1/p' $OUT/host_overhead-s3b.md
