#!/usr/bin/env bash
# Create a virtualenv with sdcguard and everything its tests need.
# Where no NVIDIA GPU is present, torch is pinned to the CPU build first, so the package's own
# range requirement (torch>=2.3,<3) is already satisfied and pip never pulls a multi-GB CUDA build.
set -euo pipefail
venv=${1:-.venv}
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
"$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || {
    echo "sdcguard needs Python >= 3.11 (found $("$python" --version 2>&1)); set PYTHON=..." >&2; exit 2; }
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
pip=("$venv/bin/python" -m pip install --quiet --disable-pip-version-check)
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    extras="torch,gpu,plot,metrics,test"
else
    # CPU-only machine: the CPU build of torch (override with SDCGUARD_TORCH_SPEC).
    "${pip[@]}" "${SDCGUARD_TORCH_SPEC:-torch==2.13.0}"
    extras="torch,nvrtc,plot,metrics,test"
fi
"${pip[@]}" -e ".[${extras}]"
echo "sdcguard installed in $venv (extras: $extras)"
