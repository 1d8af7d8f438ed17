#!/usr/bin/env bash
# Which earlier GPU test file leaves state that breaks a later test? Runs groups of files concurrently, each group
# followed by the target test in the same pytest process. Usage: bash benchmarks/diag/bisect_gpu_tests.sh TARGET G1 G2 ...
# (a group: comma-separated test files). Writes $OUT/bisect-N.txt per group.
set -u
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
target="$1"; shift
n=0
for group in "$@"; do
  n=$((n + 1))
  (timeout "${LIMIT:-300}" python3 -m pytest -q -m gpu -p no:cacheprovider -rfE ${group//,/ } "$target" \
     > "$OUT/bisect-$n.txt" 2>&1; echo "rc=$?" >> "$OUT/bisect-$n.txt") &
done
wait
for i in $(seq 1 $n); do echo "== group $i"; grep -E "^FAILED|passed|failed|rc=" "$OUT/bisect-$i.txt" | tail -8; done
