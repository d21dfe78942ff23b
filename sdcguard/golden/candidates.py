"""Candidates for per-architecture goldens: one device's output of a GPU-only case, kept until another agrees.

GPU-only cases (``intrinsics``) have no reference arithmetic: their golden is what healthy GPUs of one
architecture compute. :data:`RULE` is how one is accepted. A machine with one GPU therefore cannot record a golden
on its own; it writes a *candidate file* instead (``write_candidates``): JSON holding the case definition, the
sha256 of its inputs, and each device's output (base64, little-endian) with its sha256. Candidate files from
different runs (different machines, lent at different times) are committed as they come, and :func:`promote`
records the golden into ``golden_vectors/`` (:func:`~sdcguard.golden.suite.record_arch_golden`) once two
different devices of an architecture agree bit for bit::

    write_candidates(out / "intrinsics-sm_90.json", [candidate(case, "sm_90", "GPU-...", output, model="H200")])
    promote(read_candidates(a) + read_candidates(b))    # -> [golden_vectors/intrinsics/sm_90/<case>.bin]

Every problem with a candidate file raises :class:`~sdcguard.errors.GoldenDataError` naming the file.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import GoldenDataError
from .bits import sha256_bytes
from .cases import GENERATOR_VERSION, Case, case_by_id
from .inputs import inputs_digest, make_inputs
from .suite import record_arch_golden

__all__ = ["RULE", "MIN_DEVICES", "FORMAT", "Candidate", "candidate", "write_candidates", "read_candidates", "promote"]

MIN_DEVICES = 2
"""Different devices that must agree before an architecture's golden is recorded."""

RULE = (
    f"an architecture's golden of a GPU-only case is recorded only when at least {MIN_DEVICES} different "
    "devices of that architecture computed bit-identical outputs: a golden taken from one device's own result "
    "would let a consistently wrong device pass (gpu-burn's blind spot)"
)
"""The rule, as written into every candidate file."""

FORMAT = "sdcguard-golden-candidates/1"


@dataclass(frozen=True, kw_only=True)
class Candidate:
    """One device's output of a GPU-only case."""

    case: Case
    arch: str
    """Architecture the output was computed on, e.g. ``sm_90``."""
    device: str
    """Device id (``GPU-<uuid>``): two candidates of one device are one opinion, not two."""
    output: np.ndarray = field(repr=False)
    model: str | None = None

    @property
    def sha256(self) -> str:
        return sha256_bytes(self.output)


def candidate(case: Case, arch: str, device: str, output: np.ndarray, *, model: str | None = None) -> Candidate:
    """A checked candidate: ``case`` must be GPU-only and ``output`` of its shape and dtype."""
    if not case.gpu_only:
        raise GoldenDataError(f"{case.id} has a portable golden (`sdcguard golden generate`), not candidates")
    out = np.ascontiguousarray(output)
    if out.shape != case.shape or out.dtype != np.dtype(case.out_dtype):
        raise GoldenDataError(
            f"{case.id}: output is {out.shape} {out.dtype}, the case defines {case.shape} {case.out_dtype}"
        )
    if not arch.startswith("sm_") or not arch[3:].isdigit():
        raise GoldenDataError(f"bad architecture {arch!r}: expected sm_<major><minor>, e.g. sm_90")
    return Candidate(case=case, arch=arch, device=device, output=out, model=model)


def _entry(c: Candidate) -> dict[str, Any]:
    data = c.output.astype(c.output.dtype.newbyteorder("<")).tobytes()
    return {
        "case": c.case.id,
        "arch": c.arch,
        "device": c.device,
        "model": c.model,
        "shape": list(c.case.shape),
        "out_dtype": c.case.out_dtype,
        "seed": c.case.seed,
        "generator_version": c.case.generator_version,
        "inputs_sha256": inputs_digest(make_inputs(c.case)),
        "output_sha256": c.sha256,
        "output_base64": base64.b64encode(data).decode("ascii"),
    }


def write_candidates(path: Path, candidates: list[Candidate]) -> Path:
    """Write ``candidates`` to one JSON file (the rule stated in it, and whether its devices already agree)."""
    by_key: dict[tuple[str, str], set[str]] = {}
    for c in candidates:
        by_key.setdefault((c.case.id, c.arch), set()).add(c.sha256)
    body = {
        "format": FORMAT,
        "rule": RULE,
        "agreement": {
            f"{cid}@{arch}": "agree" if len(shas) == 1 else "DISAGREE" for (cid, arch), shas in sorted(by_key.items())
        },
        "candidates": [_entry(c) for c in candidates],
    }
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(body, indent=1, sort_keys=True) + "\n")
    return path


def _parse_entry(path: Path, e: Any) -> Candidate:
    def bad(why: str) -> GoldenDataError:
        return GoldenDataError(f"golden candidates: {path}: {why}")

    if not isinstance(e, dict):
        raise bad("a candidate is not an object")
    try:
        case = case_by_id(str(e["case"]))
    except KeyError:
        raise bad(f"unknown case {e.get('case')!r}") from None
    if e.get("generator_version") != GENERATOR_VERSION or e.get("inputs_sha256") != inputs_digest(make_inputs(case)):
        raise bad(
            f"{case.id} was recorded from other inputs (generator {e.get('generator_version')!r}, this code "
            f"has {GENERATOR_VERSION!r}): run the GPU check again"
        )
    try:
        raw = base64.b64decode(str(e["output_base64"]), validate=True)
    except (KeyError, ValueError):
        raise bad(f"{case.id}: output_base64 is missing or not base64") from None
    dt = np.dtype(case.out_dtype).newbyteorder("<")
    if len(raw) != case.nbytes:
        raise bad(f"{case.id}: {len(raw)} output bytes, the case has {case.nbytes}")
    out = np.frombuffer(raw, dtype=dt).astype(case.out_dtype).reshape(case.shape)
    if sha256_bytes(out) != e.get("output_sha256"):
        raise bad(f"{case.id} on {e.get('device')}: the output does not match its output_sha256 (edited or corrupted)")
    try:
        return candidate(case, str(e["arch"]), str(e["device"]), out, model=e.get("model"))
    except KeyError as k:
        raise bad(f"{case.id}: no {k.args[0]}") from None
    except GoldenDataError as g:
        raise bad(str(g)) from None


def read_candidates(path: Path) -> list[Candidate]:
    """The candidates of one file, every output checked against its sha256 and every case against this code."""
    path = Path(path)
    try:
        body = json.loads(path.read_text())
    except OSError as e:
        raise GoldenDataError(f"golden candidates: cannot read {path}: {e.strerror or e}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise GoldenDataError(f"golden candidates: {path} is not JSON ({e})") from None
    if not isinstance(body, dict) or body.get("format") != FORMAT:
        raise GoldenDataError(f"golden candidates: {path} is not a candidates file (format {FORMAT!r})")
    entries = body.get("candidates")
    if not isinstance(entries, list):
        raise GoldenDataError(f"golden candidates: {path} has no candidates list")
    return [_parse_entry(path, e) for e in entries]


def promote(
    candidates: list[Candidate], directory: Path | None = None, *, min_devices: int = MIN_DEVICES
) -> list[Path]:
    """Record the golden of every (case, architecture) whose candidates come from at least ``min_devices``
    different devices that all agree bit for bit; returns the files written (commit ``golden_vectors/``).

    Raises ``GoldenDataError`` (nothing written) when a group has too few devices or any two outputs differ,
    the same device included: a device that disagrees with itself is no reference.
    """
    groups: dict[tuple[str, str], list[Candidate]] = {}
    for c in candidates:
        groups.setdefault((c.case.id, c.arch), []).append(c)
    if not groups:
        raise GoldenDataError("golden candidates: nothing to promote")
    plans = []
    for (cid, arch), group in sorted(groups.items()):
        shas = {c.sha256 for c in group}
        if len(shas) != 1:
            raise GoldenDataError(
                f"golden candidates of {cid} for {arch} disagree: "
                + ", ".join(f"{c.device}={c.sha256[:12]}" for c in group)
                + " (nothing recorded)"
            )
        devices = sorted({c.device for c in group})
        if len(devices) < min_devices:
            raise GoldenDataError(
                f"{cid} for {arch}: {len(devices)} device(s) ({', '.join(devices)}), the rule "
                f"needs {min_devices} different devices that agree (nothing recorded)"
            )
        first = {c.device: c for c in group}
        plans.append((group[0].case, arch, [(d, first[d].output) for d in devices]))
    return [
        record_arch_golden(directory, case, arch, outputs, min_devices=min_devices) for case, arch, outputs in plans
    ]
