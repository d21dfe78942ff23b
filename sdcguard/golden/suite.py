"""The golden data on disk: writing it (``generate``), checking it (``verify``) and loading it (``load_suite``).

Layout of ``golden_vectors/``::

    manifest.json                 every case (id, family, dtype, shape, seed, params, generator version, sha256 of
                                  its device inputs and of its expected output) and the sha256 of every file;
                                  its own sha256 covers the rest of it, and it must be byte-for-byte canonical JSON
    <family>/<case>.bin           full expected output (raw little-endian) when it is at most FULL_LIMIT bytes
    <family>/<case>.rows.bin      otherwise: a few full rows of it (to localize an error); the output's sha256 is
                                  the authority, and the backends rebuild the full array from the reference
                                  arithmetic once per process, checked against that sha256
    intrinsics/<arch>/<case>.bin  per-architecture goldens of GPU-only cases (fast intrinsics), recorded on
                                  reference GPUs that agreed bit for bit (``record_arch_golden``): no reference
                                  arithmetic can recompute them, so ``verify`` checks their sha256 only

Every problem with the data raises :class:`~sdcguard.errors.GoldenDataError` naming the file: the suite, not the
device, is suspect.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import GoldenDataError
from ..resources import golden_dir
from .bits import raw_words, sha256_bytes, uint_view
from .cases import CASES, GENERATOR_VERSION, PORTABLE_CASES, Case, case_by_id
from .inputs import inputs_digest, make_inputs
from .reference import reference_output

__all__ = [
    "FULL_LIMIT",
    "ROW_LEN",
    "MANIFEST",
    "Suite",
    "load_suite",
    "assemble_suite",
    "generate",
    "verify",
    "VerifyReport",
    "record_arch_golden",
    "check_suite_files",
    "check_case_golden",
]

FULL_LIMIT = 64 * 1024
"""Outputs up to this many bytes are stored in full; larger ones as sha256 plus a few rows."""
ROW_LEN = 1024
"""Elements per stored row of a large output (1-D outputs); 2-D outputs store whole matrix rows."""
SAMPLE_ROWS = 8
MANIFEST = "manifest.json"
FORMAT = 1


_GPU_ONLY = {c.id for c in CASES if c.gpu_only}


def _canonical(obj: Any) -> bytes:
    return (json.dumps(obj, sort_keys=True, indent=1, separators=(",", ": ")) + "\n").encode()


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _row_geometry(case: Case) -> tuple[int, int]:
    """``(rows, row_len)`` of a case's output seen as a matrix."""
    if len(case.shape) == 2:
        return case.shape[0], case.shape[1]
    row_len = min(ROW_LEN, case.size)
    return case.size // row_len, row_len


def _sample_rows(case: Case) -> list[int]:
    rows, _ = _row_geometry(case)
    picks = {0, rows - 1}
    picks.update(int(v) for v in raw_words(case.seed, 999, SAMPLE_ROWS - 2) % np.uint64(rows))
    return sorted(picks)


def _entry_file(case: Case) -> str:
    suffix = ".bin" if case.nbytes <= FULL_LIMIT else ".rows.bin"
    return f"{case.family}/{case.id}{suffix}"


def _definition(case: Case) -> dict[str, Any]:
    return {
        "id": case.id,
        "family": case.family,
        "dtype": case.dtype,
        "shape": list(case.shape),
        "seed": case.seed,
        "params": case.params,
        "generator_version": case.generator_version,
        "out_dtype": case.out_dtype,
    }


def _rows_of(case: Case, output: np.ndarray, rows: list[int]) -> np.ndarray:
    _, row_len = _row_geometry(case)
    return np.ascontiguousarray(output.reshape(-1, row_len)[rows])


# ---------------------------------------------------------------------------------------------------- generate


def generate(directory: Path | None = None) -> list[Path]:
    """Compute every portable case's golden output with the reference arithmetic and write ``directory``.

    Deterministic: running it twice gives identical bytes. Files of cases that no longer exist are removed.
    Returns the files written (manifest last).
    """
    d = Path(directory) if directory is not None else golden_dir()
    d.mkdir(parents=True, exist_ok=True)
    files: dict[str, str] = {}
    entries: list[dict[str, Any]] = []
    written: list[Path] = []
    arch_entries = _kept_arch_entries(d, files)
    for case in PORTABLE_CASES:
        inputs = make_inputs(case)
        out = reference_output(case, inputs)
        rel = _entry_file(case)
        entry = {
            **_definition(case),
            "inputs_sha256": inputs_digest(inputs),
            "output_sha256": sha256_bytes(out),
            "file": rel,
        }
        if case.nbytes <= FULL_LIMIT:
            data = np.ascontiguousarray(out).astype(out.dtype.newbyteorder("<")).tobytes()
            entry["mode"] = "full"
        else:
            rows = _sample_rows(case)
            data = _rows_of(case, out, rows).astype(out.dtype.newbyteorder("<")).tobytes()
            entry.update(mode="digest", rows=rows, row_len=_row_geometry(case)[1])
        path = d / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        written.append(path)
        files[rel] = _sha(data)
        entries.append(entry)
    _write_manifest(d, entries, arch_entries, files)
    for stale in sorted(d.rglob("*.bin")):
        if stale.relative_to(d).as_posix() not in files:
            stale.unlink()
    written.append(d / MANIFEST)
    return written


def _write_manifest(
    d: Path, entries: list[dict[str, Any]], arch_entries: list[dict[str, Any]], files: dict[str, str]
) -> None:
    body = {
        "format": FORMAT,
        "generator_version": GENERATOR_VERSION,
        "cases": entries,
        "arch_cases": arch_entries,
        "files": dict(sorted(files.items())),
    }
    manifest = {**body, "manifest_sha256": _sha(_canonical(body))}
    (d / MANIFEST).write_bytes(_canonical(manifest))


def _kept_arch_entries(d: Path, files: dict[str, str]) -> list[dict[str, Any]]:
    """Recorded per-architecture goldens that survive a regeneration (intact files of a valid manifest only)."""
    try:
        old = _read_manifest(d)
    except GoldenDataError:
        return []
    kept = []
    for entry in old.get("arch_cases", []):
        path = d / entry["file"]
        digest = old["files"].get(entry["file"])
        if path.is_file() and digest == _sha(path.read_bytes()) and entry["id"] in _GPU_ONLY:
            kept.append(entry)
            files[entry["file"]] = digest
    return kept


def record_arch_golden(
    directory: Path | None, case: Case, arch: str, outputs: list[tuple[str, np.ndarray]], *, min_devices: int = 2
) -> Path:
    """Record the per-architecture golden of a GPU-only case from the outputs of reference devices.

    Every device must agree bit for bit, and at least ``min_devices`` must have run it: a golden taken from one
    device's own result would let a consistently wrong device pass (gpu-burn's blind spot). Returns the file.
    """
    if not case.gpu_only:
        raise GoldenDataError(f"{case.id} has a portable golden: `sdcguard golden generate` computes it")
    if len(outputs) < min_devices:
        raise GoldenDataError(
            f"recording {case.id} for {arch} needs {min_devices} reference devices, got {len(outputs)}"
        )
    digests = {sha256_bytes(out) for _, out in outputs}
    if len(digests) != 1:
        raise GoldenDataError(
            f"reference devices disagree on {case.id} for {arch}: "
            + ", ".join(f"{dev}={sha256_bytes(out)[:12]}" for dev, out in outputs)
            + " (nothing recorded)"
        )
    out = np.ascontiguousarray(outputs[0][1])
    if out.shape != case.shape or out.dtype != np.dtype(case.out_dtype):
        raise GoldenDataError(
            f"{case.id}: output is {out.shape} {out.dtype}, the case defines {case.shape} {case.out_dtype}"
        )
    d = Path(directory) if directory is not None else golden_dir()
    manifest = _read_manifest(d)
    files = dict(manifest["files"])
    rel = f"{case.family}/{arch}/{case.id}.bin"
    data = out.astype(out.dtype.newbyteorder("<")).tobytes()
    (d / rel).parent.mkdir(parents=True, exist_ok=True)
    (d / rel).write_bytes(data)
    files[rel] = _sha(data)
    entry = {
        **_definition(case),
        "arch": arch,
        "file": rel,
        "mode": "full",
        "output_sha256": sha256_bytes(out),
        "inputs_sha256": inputs_digest(make_inputs(case)),
        "recorded_on": sorted(dev for dev, _ in outputs),
    }
    arch_entries = [e for e in manifest.get("arch_cases", []) if (e["id"], e["arch"]) != (case.id, arch)]
    arch_entries = sorted([*arch_entries, entry], key=lambda e: (e["id"], e["arch"]))
    _write_manifest(d, manifest["cases"], arch_entries, files)
    return d / rel


# ------------------------------------------------------------------------------------------------------ load


def _read_manifest(d: Path) -> dict[str, Any]:
    path = d / MANIFEST
    if not path.is_file():
        raise GoldenDataError(f"golden data: {path} is missing (run `sdcguard golden generate`, or reinstall)")
    raw = path.read_bytes()
    try:
        manifest = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise GoldenDataError(f"golden data: {path} is not valid JSON ({e})") from None
    if not isinstance(manifest, dict) or "manifest_sha256" not in manifest:
        raise GoldenDataError(f"golden data: {path} has no manifest_sha256")
    body = {k: v for k, v in manifest.items() if k != "manifest_sha256"}
    if _sha(_canonical(body)) != manifest["manifest_sha256"]:
        raise GoldenDataError(f"golden data: {path} does not match its own sha256 (edited or corrupted)")
    if _canonical(manifest) != raw:
        raise GoldenDataError(f"golden data: {path} is not in canonical form (edited or corrupted)")
    if manifest.get("format") != FORMAT:
        raise GoldenDataError(f"golden data: {path} has format {manifest.get('format')!r}, expected {FORMAT}")
    return manifest


def _check_files(d: Path, manifest: dict[str, Any]) -> dict[str, bytes]:
    blobs: dict[str, bytes] = {}
    for rel, digest in sorted(manifest["files"].items()):
        path = d / rel
        if not path.is_file():
            raise GoldenDataError(f"golden data: {path} is missing")
        data = path.read_bytes()
        if _sha(data) != digest:
            raise GoldenDataError(f"golden data: {path} does not match its sha256 in {MANIFEST} (corrupted or edited)")
        blobs[rel] = data
    return blobs


def _check_definitions(d: Path, manifest: dict[str, Any]) -> dict[str, dict[str, Any]]:
    by_id = {e["id"]: e for e in manifest["cases"]}
    for case in PORTABLE_CASES:
        entry = by_id.get(case.id)
        if entry is None:
            raise GoldenDataError(
                f"golden data: {d / MANIFEST} has no case {case.id} (golden data older than the code: regenerate)"
            )
        for key, value in _definition(case).items():
            if entry.get(key) != json.loads(json.dumps(value)):
                raise GoldenDataError(
                    f"golden data: {d / MANIFEST}: case {case.id} has {key}={entry.get(key)!r}, the code defines "
                    f"{value!r} (regenerate the golden data)"
                )
    return by_id


@dataclass
class Suite:
    """The loaded golden suite: cases, their seeded inputs and their expected outputs, checked against the manifest.

    Inputs and digest-mode expected outputs are built on first use and cached (once per process).
    """

    directory: Path
    cases: tuple[Case, ...]
    """Every portable case, in suite order: what every backend runs (GPU-only cases: :meth:`arch_cases`)."""
    entries: dict[str, dict[str, Any]]
    _blobs: dict[str, bytes] = field(repr=False)
    arch_entries: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    """Recorded per-architecture goldens, keyed by (case id, architecture such as ``sm_90``)."""
    _inputs: dict[str, dict[str, np.ndarray]] = field(default_factory=dict, repr=False)
    _expected: dict[str, np.ndarray] = field(default_factory=dict, repr=False)

    def entry_for(self, case: Case, arch: str | None = None) -> dict[str, Any]:
        """The manifest entry of a case's golden (GPU-only cases: the one recorded for ``arch``)."""
        if case.gpu_only:
            entry = self.arch_entries.get((case.id, arch or ""))
            if entry is None:
                raise GoldenDataError(f"no golden of {case.id} recorded for {arch} in {self.directory / MANIFEST}")
            return entry
        return self.entries[case.id]

    def arch_cases(self, arch: str) -> tuple[Case, ...]:
        """GPU-only cases with a golden recorded for ``arch``."""
        return tuple(c for c in CASES if (c.id, arch) in self.arch_entries)

    def case(self, case_id: str) -> Case:
        """The case with this id (``KeyError`` if the suite has none)."""
        for c in self.cases:
            if c.id == case_id:
                return c
        raise KeyError(case_id)

    def inputs(self, case: Case) -> dict[str, np.ndarray]:
        """The case's inputs, rebuilt from its seed and checked against the manifest's sha256 (a GPU-only case
        recorded for no architecture yet has none to be checked against)."""
        got = self._inputs.get(case.id)
        if got is None:
            got = make_inputs(case)
            entry = self.entries.get(case.id) or next(
                (e for (cid, _), e in self.arch_entries.items() if cid == case.id), None
            )
            # A GPU-only case with no golden recorded for any architecture has nothing to be checked against: that
            # is how the first one is taken (sdcguard.golden.candidates records the inputs' sha256 itself).
            unchecked = entry is None and case.gpu_only
            if not unchecked and (entry is None or inputs_digest(got) != entry["inputs_sha256"]):
                raise GoldenDataError(
                    f"golden data: inputs of {case.id} rebuilt from seed {case.seed} do not match "
                    f"{self.directory / MANIFEST} (input generator changed: regenerate)"
                )
            for a in got.values():
                a.flags.writeable = False
            self._inputs[case.id] = got
        return got

    def expected(self, case: Case, arch: str | None = None) -> np.ndarray:
        """The full expected output (read-only). Digest-mode cases are rebuilt by the reference arithmetic and
        checked against the stored sha256 and rows; GPU-only cases need the ``arch`` they were recorded for."""
        key = case.id if not case.gpu_only else f"{case.id}@{arch}"
        got = self._expected.get(key)
        if got is not None:
            return got
        entry = self.entry_for(case, arch)
        dt = np.dtype(case.out_dtype).newbyteorder("<")
        blob = self._blobs[entry["file"]]
        if entry["mode"] == "full":
            got = np.frombuffer(blob, dtype=dt).astype(case.out_dtype).reshape(case.shape)
        else:
            got = reference_output(case, self.inputs(case))
            if sha256_bytes(got) != entry["output_sha256"]:
                raise GoldenDataError(
                    f"golden data: the reference output of {case.id} does not match its sha256 in "
                    f"{self.directory / MANIFEST} (reference arithmetic changed, or this host computed it wrongly)"
                )
        if sha256_bytes(got) != entry["output_sha256"]:
            raise GoldenDataError(f"golden data: {self.directory / entry['file']} does not match output_sha256")
        got.flags.writeable = False
        self._expected[key] = got
        return got

    def adopt(self, case: Case, *, inputs: dict[str, np.ndarray], expected: np.ndarray) -> None:
        """Use ``inputs`` and ``expected`` for ``case`` instead of building them here: arrays built and checked
        against the manifest's sha256 in another process, where the device under test could not touch them
        (:mod:`.references`). They are made read-only."""
        for a in (*inputs.values(), expected):
            a.flags.writeable = False
        self._inputs[case.id] = dict(inputs)
        self._expected[case.id] = expected

    def stored_rows(self, case: Case) -> tuple[list[int], np.ndarray] | None:
        """``(row indices, rows)`` kept on disk for a digest-mode case; None for a fully stored one."""
        entry = self.entries[case.id]
        if entry["mode"] != "digest":
            return None
        dt = np.dtype(case.out_dtype).newbyteorder("<")
        rows = np.frombuffer(self._blobs[entry["file"]], dtype=dt).astype(case.out_dtype)
        return list(entry["rows"]), rows.reshape(len(entry["rows"]), entry["row_len"])


def load_suite(directory: Path | None = None) -> Suite:
    """Load the golden suite, checking the manifest's own sha256 and every file's sha256.

    Raises :class:`~sdcguard.errors.GoldenDataError` naming the file on any mismatch. Recomputing the references
    (what ``verify`` adds) is left out here: it takes seconds, and digest-mode outputs are rebuilt and checked on
    first use anyway.
    """
    d = Path(directory) if directory is not None else golden_dir()
    manifest = _read_manifest(d)
    return assemble_suite(d, manifest, _check_files(d, manifest))


def assemble_suite(directory: Path, manifest: dict[str, Any], blobs: dict[str, bytes]) -> Suite:
    """A :class:`Suite` from a manifest and the contents of its files, *already checked* against their sha256
    (by :func:`load_suite`, or by the process that handed them over: :mod:`.references`). The case definitions
    are still compared with the code's."""
    d = Path(directory)
    entries = _check_definitions(d, manifest)
    cases = tuple(c for c in PORTABLE_CASES if c.id in entries)
    arch_entries: dict[tuple[str, str], dict[str, Any]] = {}
    for entry in manifest.get("arch_cases", []):
        if entry.get("id") not in _GPU_ONLY:
            raise GoldenDataError(f"golden data: {d / MANIFEST} records an unknown GPU-only case {entry.get('id')!r}")
        for key, value in _definition(case_by_id(entry["id"])).items():
            if entry.get(key) != json.loads(json.dumps(value)):
                raise GoldenDataError(
                    f"golden data: {d / entry['file']} was recorded for a different definition "
                    f"of {entry['id']} ({key}): record it again"
                )
        arch_entries[(entry["id"], entry["arch"])] = entry
    return Suite(directory=d, cases=cases, entries=entries, _blobs=blobs, arch_entries=arch_entries)


# ---------------------------------------------------------------------------------------------------- verify


@dataclass(frozen=True, kw_only=True)
class VerifyReport:
    """What ``verify`` checked."""

    directory: Path
    cases: int
    files: int


def verify(directory: Path | None = None) -> VerifyReport:
    """Re-check everything: the manifest, every file's sha256, no unlisted file, the case definitions, every
    case's inputs, and every golden output recomputed by the reference arithmetic (full files compared bit for bit,
    large outputs through their sha256 and stored rows). Raises ``GoldenDataError`` naming the first bad file.

    The scanner runs the same checks (:func:`check_suite_files`, and :func:`check_case_golden` on each reference
    it builds), so golden data ``verify`` refuses is never scanned against."""
    suite = load_suite(directory)
    listed = check_suite_files(suite)
    for case in suite.cases:
        if not case.gpu_only:
            check_case_golden(suite, case, reference_output(case, suite.inputs(case)))
    return VerifyReport(directory=suite.directory, cases=len(suite.cases) + len(suite.arch_entries), files=listed)


def check_suite_files(suite: Suite) -> int:
    """No file in the golden directory the manifest does not list, and every per-architecture golden matches its
    output_sha256; returns how many files are listed. ``GoldenDataError`` names the first bad file."""
    d = suite.directory
    listed = {suite.entries[c.id]["file"] for c in suite.cases} | {MANIFEST}
    listed |= {e["file"] for e in suite.arch_entries.values()}
    for path in sorted(p for p in d.rglob("*") if p.is_file()):
        if path.relative_to(d).as_posix() not in listed:
            raise GoldenDataError(f"golden data: {path} is not listed in {MANIFEST} (stray or renamed file)")
    for (cid, arch), entry in suite.arch_entries.items():
        # recorded on reference GPUs: the sha256 is all there is to check (no reference arithmetic exists)
        if sha256_bytes(suite.expected(case_by_id(cid), arch)) != entry["output_sha256"]:
            raise GoldenDataError(f"golden data: {d / entry['file']} does not match its output_sha256")
    return len(listed)


def check_case_golden(suite: Suite, case: Case, reference: np.ndarray) -> None:
    """The stored golden of a portable ``case`` against its output recomputed by the reference arithmetic: the
    manifest's output_sha256, and the stored output (full mode) or stored rows (digest mode) bit for bit.
    ``GoldenDataError`` names the file: a file whose manifest entry was re-signed after an edit is caught here."""
    entry = suite.entries[case.id]
    path = suite.directory / entry["file"]
    if sha256_bytes(reference) != entry["output_sha256"]:
        raise GoldenDataError(f"golden data: {path}: recomputed reference of {case.id} does not match output_sha256")
    if entry["mode"] == "full":
        if not np.array_equal(uint_view(suite.expected(case)), uint_view(reference)):
            raise GoldenDataError(f"golden data: {path}: stored output of {case.id} differs from the reference")
        return
    picked = suite.stored_rows(case)
    assert picked is not None
    rows, data = picked
    if not np.array_equal(uint_view(_rows_of(case, reference, rows)), uint_view(data)):
        raise GoldenDataError(f"golden data: {path}: stored rows of {case.id} differ from the reference")
