#!/usr/bin/env bash
# One prepared command for a CUDA machine: check the golden data, run the GPU tests, then run every golden family
# on every GPU against the goldens and print each family's throughput next to the device's own reference (GEMM
# TFLOP/s against cupy.matmul on random data, memory GB/s against a device-to-device copy).
#
#   scripts/gpu_check.sh                 # uses $PYTHON, else .venv/bin/python, else python3
#   MEMORY_SHARE=0.5 scripts/gpu_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-}"
if [[ -z "$PY" ]]; then
    if [[ -x .venv/bin/python ]]; then PY=.venv/bin/python; else PY=python3; fi
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

echo "== golden data"
"$PY" -m sdcguard golden verify
echo "== nvidia-smi"
nvidia-smi --query-gpu=index,name,uuid,driver_version,memory.total --format=csv || true
echo "== GPU tests"
"$PY" -m pytest -q -p no:cacheprovider tests/test_golden_gpu.py tests/test_golden_kernels.py -k "gpu or nvrtc" \
    || status=$?
echo "== every family on every GPU"
"$PY" benchmarks/suite_gpu.py --memory-share "${MEMORY_SHARE:-0.25}" || status=$?
exit "${status:-0}"
