#!/usr/bin/env bash
# Create a virtualenv with sdcguard.
#   scripts/setup.sh VENV          everything the tests, `make lint` and `make docs` need (torch, CuPy/NVRTC,
#                                  plots, metrics, adapters, ruff, mypy, mkdocs)
#   scripts/setup.sh VENV --light  only what `sdcguard scan` and `sdcguard report` need (no torch): `make run`
# Where no NVIDIA GPU is present, torch is pinned to the CPU build first, so the package's own
# range requirement (torch>=2.3,<3) is already satisfied and pip never pulls a multi-GB CUDA build.
# pip's own output shows what is being downloaded and installed; each step says what it does first.
set -euo pipefail
venv=${1:-.venv}
mode=${2:-full}
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
step() { echo "==> setup ($venv): $*" >&2; }
"$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || {
    echo "sdcguard needs Python >= 3.11 (found $("$python" --version 2>&1)); set PYTHON=..." >&2; exit 2; }
if [ ! -x "$venv/bin/python" ]; then
    step "creating the virtualenv with $("$python" --version 2>&1)"
    "$python" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip install --disable-pip-version-check --progress-bar on)
# This project's distribution was named `sdcguard` before it became `sdcguard-fleet` (PyPI's `sdcguard` is another
# project). A virtualenv made before, or one that holds PyPI's, has a distribution of that name claiming the same
# import package: remove it, so only this checkout provides `sdcguard`.
if "$venv/bin/python" -m pip show sdcguard >/dev/null 2>&1; then
    step "removing the distribution named sdcguard (this project's old name, or PyPI's unrelated project)"
    "$venv/bin/python" -m pip uninstall -y -q sdcguard
fi
if [ "$mode" = "--light" ]; then
    step "installing sdcguard for scan and report (numpy, scipy, click, rich; no torch, no CuPy)"
    "${pip[@]}" -e .
    echo "sdcguard (scan and report) installed in $venv" >&2
    exit 0
fi
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    extras="torch,gpu,plot,metrics,test,lint,docs"
else
    # CPU-only machine: the CPU build of torch (override with SDCGUARD_TORCH_SPEC).
    step "installing the CPU build of torch (${SDCGUARD_TORCH_SPEC:-torch==2.13.0}; about 1 GB of the install)"
    "${pip[@]}" "${SDCGUARD_TORCH_SPEC:-torch==2.13.0}"
    extras="torch,nvrtc,plot,metrics,test,lint,docs"
fi
step "installing sdcguard with the extras the tests and the lint need ($extras)"
"${pip[@]}" -e ".[${extras}]"
echo "sdcguard installed in $venv (extras: $extras)" >&2
