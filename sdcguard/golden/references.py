"""References built off the device under test, and handed to the process that scans it.

A core that corrupts arithmetic would corrupt a reference computed on it too: the reference would no longer
match the manifest's sha256, the scan would stop with a golden-data error, and the core would never be
quarantined. So the scanner's parent process builds every case's inputs and expected output *before* any device
is scanned, pinned to a core that is not being scanned when there is one, and checks each against the manifest's
sha256 there; a result that does not match is built again on another core (up to three in all), and only when
none matches is the golden data suspect. The checked arrays, the manifest and the golden files are written to a
private directory that the per-device workers (and their retest processes) read back as they are: a worker
computes no reference and checks no hash, so whatever its core corrupts shows up where it belongs, as a failed
execution of that core.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..errors import GoldenDataError
from .bits import sha256_bytes
from .inputs import inputs_digest, make_inputs
from .reference import reference_output
from .suite import MANIFEST, Suite, assemble_suite, check_case_golden

__all__ = ["write_references", "load_references", "INDEX"]

INDEX = "references.json"
_ATTEMPTS = 3


def _build(suite: Suite, case_id: str) -> tuple[dict[str, np.ndarray], np.ndarray, bool]:
    """``(inputs, expected, matches the manifest)`` of one case, computed here and now."""
    case = suite.case(case_id)
    entry = suite.entries[case_id]
    inputs = make_inputs(case)
    expected = reference_output(case, inputs)
    ok = inputs_digest(inputs) == entry["inputs_sha256"] and sha256_bytes(expected) == entry["output_sha256"]
    if ok:
        # This core computed the reference right: a stored output or stored rows that differ from it are the
        # golden data's fault (an edited file whose manifest entry was re-signed), exactly what `verify` refuses.
        check_case_golden(suite, case, expected)
    return inputs, expected, ok


def write_references(suite: Suite, directory: Path, *, cores: Sequence[int]) -> list[str]:
    """Build every case's inputs and expected output on ``cores[0]`` (the next core when one does not match the
    manifest), write them and the golden data to ``directory``; returns one note per core that got a reference
    wrong. :class:`GoldenDataError` when no core matches: the golden data, not a device, is suspect."""
    directory = Path(directory)
    (directory / "golden").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(suite.directory / MANIFEST, directory / "golden" / MANIFEST)
    manifest = json.loads((directory / "golden" / MANIFEST).read_text())
    for rel in manifest["files"]:
        target = directory / "golden" / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(suite.directory / rel, target)
    saved = os.sched_getaffinity(0)
    tries: list[int | None] = list[int | None](dict.fromkeys(cores))[:_ATTEMPTS]
    if not tries:
        tries = [None]  # no core to pin to: wherever this process runs
    notes: list[str] = []
    index: dict[str, list[str]] = {}
    try:
        for case in suite.cases:
            wrong: list[int] = []
            for core in tries:
                if core is not None:
                    os.sched_setaffinity(0, {core})
                inputs, expected, ok = _build(suite, case.id)
                if ok:
                    break
                wrong.append(-1 if core is None else core)
            else:
                raise GoldenDataError(
                    f"golden data: the reference of {case.id} built on {len(tries)} core(s) never matches "
                    f"{suite.directory / MANIFEST} (reference arithmetic or golden data changed)"
                )
            notes += [
                f"the reference of {case.id} came out wrong on core {c} and right on core {core}: core {c} is suspect"
                for c in wrong
            ]
            for name, a in inputs.items():
                np.save(directory / f"{case.id}.in.{name}.npy", np.ascontiguousarray(a), allow_pickle=False)
            np.save(directory / f"{case.id}.out.npy", np.ascontiguousarray(expected), allow_pickle=False)
            index[case.id] = sorted(inputs)
    finally:
        os.sched_setaffinity(0, saved)
    (directory / INDEX).write_text(json.dumps({"golden_dir": str(suite.directory), "cases": index, "notes": notes}))
    return notes


def load_references(directory: Path) -> Suite:
    """The suite a worker runs: the golden data and every case's arrays as the parent checked them, read back
    without computing or hashing anything (arrays are memory-mapped, shared by every worker)."""
    directory = Path(directory)
    try:
        index = json.loads((directory / INDEX).read_text())
        manifest = json.loads((directory / "golden" / MANIFEST).read_text())
        blobs = {rel: (directory / "golden" / rel).read_bytes() for rel in manifest["files"]}
    except (OSError, ValueError, KeyError) as e:
        raise GoldenDataError(
            f"references in {directory} are unreadable ({e}): the scanner's parent wrote them"
        ) from None
    suite = assemble_suite(directory / "golden", manifest, blobs)
    for case in suite.cases:
        names = index["cases"].get(case.id)
        if names is None:
            continue
        inputs = {n: np.load(directory / f"{case.id}.in.{n}.npy", mmap_mode="r").view(np.ndarray) for n in names}
        expected = np.load(directory / f"{case.id}.out.npy", mmap_mode="r").view(np.ndarray)
        suite.adopt(case, inputs=inputs, expected=expected)
    return suite
