"""References are built off the device under test and handed over; a core that corrupts its own arithmetic
fails executions instead of stopping the scan; memory marches compute their words apart from the golden."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fleet_scan.devices.discovery import discover_cpus
from fleet_scan.options import ScanOptions
from sdcguard.errors import GoldenDataError
from sdcguard.golden import NumpyBackend, cpu_kernels, load_suite, references
from sdcguard.golden.references import load_references, write_references

ROOT = Path(__file__).resolve().parents[2]
CORES = sorted(os.sched_getaffinity(0))

# Loaded first in every Python process started with this directory on PYTHONPATH: the reference arithmetic and
# the input generators of that process come out one bit wrong, as on a core that corrupts what it computes.
_CORRUPTING_CORE = """
import numpy as np
import sdcguard.golden.inputs as inputs, sdcguard.golden.reference as reference, sdcguard.golden.suite as suite
import sdcguard.golden.references as references

_ref, _inp = reference.reference_output, inputs.make_inputs

def _flip(a):
    a = np.array(a, copy=True)
    a.reshape(-1).view(np.uint8)[0] ^= 1
    return a

def reference_output(case, inp):
    return _flip(_ref(case, inp))

def make_inputs(case):
    return {k: _flip(v) for k, v in _inp(case).items()}

for m in (reference, suite, references):
    m.reference_output = reference_output
for m in (inputs, suite, references):
    m.make_inputs = make_inputs
"""


def _worker(tmp: Path, refs: Path | None) -> dict:
    site = tmp / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(_CORRUPTING_CORE)
    target = [t for t in discover_cpus() if t.index == CORES[0]][0]
    options = ScanOptions(
        db=str(tmp / "fleet.db"), budget_s=1.0, only_idle=False, lock_dir=str(tmp / "locks"), retests=0
    )
    payload = {
        "target": target.to_json(),
        "options": options.to_json(),
        "references": None if refs is None else str(refs),
    }
    env = {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{ROOT}"}
    proc = subprocess.run(
        [sys.executable, "-m", "fleet_scan.device_scan.worker"],
        input=json.dumps(payload),
        text=True,
        capture_output=True,
        env=env,
        timeout=120,
    )
    events = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return [e for e in events if e["event"] == "done"][0]


@pytest.mark.slow
def test_a_core_that_corrupts_its_own_arithmetic_still_gets_scanned(tmp_path: Path) -> None:
    # Without references handed over, the worker builds them on the core it scans: they miss the manifest's
    # sha256 and the scan stops as a golden-data error, recording nothing (what issue 12 found).
    before = _worker(tmp_path, None)
    assert before["status"] == "error" and before["error_type"] == "GoldenDataError"
    # With the references the parent built off this core, the same worker computes none and scans normally.
    refs = tmp_path / "refs"
    write_references(load_suite(), refs, cores=CORES[::-1])
    after = _worker(tmp_path, refs)
    assert after["status"] == "complete" and after["executions"] > 0 and after["failures"] == 0, after


@pytest.mark.skipif(len(CORES) < 2, reason="needs a second core to rebuild a reference on")
def test_a_reference_built_wrong_on_one_core_is_built_again_on_another(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bad_core = CORES[0]
    real = references.reference_output

    def on_this_core(case, inputs):  # the arithmetic of bad_core flips a bit; the others are sound
        out = real(case, inputs)
        if os.sched_getaffinity(0) == {bad_core}:
            out = np.array(out, copy=True)
            out.reshape(-1).view(np.uint8)[-1] ^= 0x80
        return out

    monkeypatch.setattr(references, "reference_output", on_this_core)
    notes = write_references(load_suite(), tmp_path, cores=CORES)
    suite = load_suite()
    # every case's reference is computed (full outputs too: the stored file is checked against it, as `golden
    # verify` does), so the bad core got every one wrong
    assert len(notes) == len(suite.cases) and all(f"wrong on core {bad_core}" in n for n in notes)
    assert os.sched_getaffinity(0) == set(CORES)  # the builder's affinity is given back
    handed = load_references(tmp_path)
    for case in suite.cases:
        assert np.array_equal(handed.expected(case), suite.expected(case)), case.id
        assert all(np.array_equal(handed.inputs(case)[k], v) for k, v in suite.inputs(case).items())


def test_no_core_matching_the_manifest_means_the_golden_data_is_suspect(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(references, "reference_output", lambda case, inputs: np.zeros(case.shape, case.out_dtype))
    with pytest.raises(GoldenDataError, match="never matches"):
        write_references(load_suite(), tmp_path, cores=CORES)


@pytest.mark.parametrize("case_id", ["memory.u32.address", "memory.u32.random"])
def test_a_march_pattern_computed_wrong_is_a_failed_execution(monkeypatch: pytest.MonkeyPatch, case_id: str) -> None:
    """The march's words never come from the golden it is compared with: a pattern bug shows, not cancels."""
    real = cpu_kernels.march_words

    def buggy(kind, index, base, salt, *, out):
        words = real(kind, index, base, salt, out=out)
        if base == 0:
            words[5] ^= 1
        return words

    suite = load_suite()
    case = suite.case(case_id)
    with NumpyBackend(CORES[0], suite=suite) as backend:
        assert backend.run(case).passed
        monkeypatch.setattr(cpu_kernels, "march_words", buggy)
        r = backend.run(case)
    assert not r.passed and r.element == 5 and r.xor_mask == "0x00000001"
