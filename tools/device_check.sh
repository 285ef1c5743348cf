#!/usr/bin/env bash
# Every GPU check in one run (for a machine with an NVIDIA GPU, torch with CUDA and
# cuda-python; vLLM is not needed). Results and logs go under $OUT (default ./gpu_out).
# Wheels of missing pure-Python dependencies may be placed in .whl/ (they are installed
# into a private target directory first).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-./gpu_out}
export OUT
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" > /dev/null; then
  site=$(mktemp -d)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$site" .whl/*.whl || exit 2
  export PYTHONPATH=$site
fi
export PYTHONPATH="$PWD/src:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
status=0
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/nvidia-smi.txt"
python3 benchmarks/gpu_check.py 2>&1 | tee "$OUT/gpu_check.stdout" || status=1
python3 -m pytest -o addopts="-ra --strict-markers" -m gpu -q -p no:cacheprovider tests/executor 2>&1 | tee "$OUT/pytest_gpu.log" \
  || status=1
python3 tests/planner/legacy/_gpu_check.py 2>&1 | tee "$OUT/legacy_gpu_check.log" || status=1
python3 benchmarks/gpu_elastic.py 2>&1 | tee "$OUT/gpu_elastic.log" || status=1
# elastic serving (#10): cuda-vmm map/unmap churn next to kvcached's per-2 MiB costs, and an
# eager 60 GiB bind at 2 MiB vs 128 MiB chunks; --write-docs fills the marked section of
# docs/performance.md, copied back through $OUT (this working tree does not come back)
python3 benchmarks/bench_vmm_gpu.py --eager-gib 60 --write-docs 2>&1 \
  | tee "$OUT/bench_vmm_gpu.log" || status=1
cp docs/performance.md "$OUT/performance.md" || status=1
echo "device_check: status $status"
exit $status
