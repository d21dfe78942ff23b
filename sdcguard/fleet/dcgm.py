"""``dcgmi diag -j`` output, read: what NVIDIA's DCGM diagnostics said of each GPU, as typed records, so the store can
keep them beside the golden suite's results (a second opinion per device; ``sdcguard import dcgm``).

NVIDIA publishes no stable schema for this JSON (its own docs say to pin and test the release a tool reads), so the
two shapes DCGM has written are read, and anything else is refused in one line:

- **DCGM 4.x**: ``{"DCGM Diagnostic": {"test_categories": [{"category", "tests": [{"name", "results":
  [{"entity_group": "GPU", "entity_id", "status", "warnings": [{"warning", "error_id", "error_category",
  "error_severity"}], "info"}], "test_summary": {"status"}}]}], "runtime_error"?}, "entity_groups": [{"entity_group":
  "GPU", "entities": [{"entity_id", "serial_num", ...}]}], "metadata": {"version", "Driver Version Detected"}}``;
- **DCGM 3.x**: ``{"DCGM GPU Diagnostic": {"test_categories": [{"category", "tests": [{"name", "results":
  [{"gpu_ids" or "gpu_id", "status", "warnings" or "warning", "info"}]}]}]}, "Driver Version Detected",
  "GPU Device Serials": {index: serial}, "version"}``.

A result is about one GPU (its DCGM entity id, the NVML index on its host; its serial where the JSON gives one). A
status is one of ``pass``, ``fail``, ``warn``, ``skip`` (DCGM's Skip and "Not Run" alike: the test did not run on it).
Results of other entities (CPUs, NVSwitches) and tests of the whole system with no GPU are kept out: the store's
records are per device.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from ..errors import BadInput

__all__ = ["DiagStatus", "DiagWarning", "DiagResult", "DiagRun", "parse_diag"]

DiagStatus = Literal["pass", "fail", "warn", "skip"]

_STATUS: dict[str, DiagStatus] = {
    "pass": "pass",
    "fail": "fail",
    "warn": "warn",
    "warning": "warn",
    "skip": "skip",
    "skipped": "skip",
    "not run": "skip",
    "notrun": "skip",
}


@dataclass(frozen=True, kw_only=True, slots=True)
class DiagWarning:
    """One finding of a test on a GPU: DCGM's text, and its error id, category and severity where given."""

    text: str
    error_id: int | None = None
    category: int | None = None
    severity: int | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class DiagResult:
    """One test's result on one GPU."""

    index: int
    """The GPU's DCGM entity id: its NVML index on the host that ran the diagnostic."""
    serial: str | None
    category: str
    test: str
    status: DiagStatus
    warnings: tuple[DiagWarning, ...] = ()
    info: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True, slots=True)
class DiagRun:
    """One ``dcgmi diag -j`` output."""

    dcgm_version: str | None
    driver: str | None
    results: tuple[DiagResult, ...]

    @property
    def indices(self) -> tuple[int, ...]:
        """The GPUs it has results for."""
        return tuple(sorted({r.index for r in self.results}))


def _refuse(why: str) -> BadInput:
    return BadInput(f"not a dcgmi diag -j output: {why}")


def _status(value: Any, where: str) -> DiagStatus:
    status = _STATUS.get(str(value).strip().lower()) if isinstance(value, str) else None
    if status is None:
        raise _refuse(f"{where} has status {value!r} (expected Pass, Fail, Warn, Skip or Not Run)")
    return status


def _index(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str) or not str(value).strip().isdecimal():
        raise _refuse(f"{where} names GPU {value!r}, not an index")
    return int(value)


def _warnings(result: Mapping[str, Any], where: str) -> tuple[DiagWarning, ...]:
    raw = result.get("warnings", result.get("warning", []))
    items = raw if isinstance(raw, list) else [raw]
    out = []
    for w in items:
        if isinstance(w, str):
            out.append(DiagWarning(text=w))
        elif isinstance(w, Mapping) and isinstance(w.get("warning", ""), str):
            ints = {k: w.get(k) if isinstance(w.get(k), int) else None for k in ("error_id", "error_category")}
            severity = w.get("error_severity")
            out.append(
                DiagWarning(
                    text=str(w.get("warning", "")),
                    error_id=ints["error_id"],
                    category=ints["error_category"],
                    severity=severity if isinstance(severity, int) else None,
                )
            )
        else:
            raise _refuse(f"{where} has a warning that is neither text nor an object with a 'warning': {w!r}")
    return tuple(out)


def _info(result: Mapping[str, Any]) -> tuple[str, ...]:
    raw = result.get("info", [])
    return tuple(str(i) for i in (raw if isinstance(raw, list) else [raw]) if i not in (None, ""))


def _gpus(result: Mapping[str, Any], where: str) -> list[int]:
    """The GPUs one result is about ([] for another kind of entity)."""
    if "entity_group" in result or "entity_id" in result:
        group = result.get("entity_group", "GPU")
        return [_index(result.get("entity_id"), where)] if str(group).upper() == "GPU" else []
    ids = result.get("gpu_ids", result.get("gpu_id"))
    if ids is None:
        return []  # a result of the whole system
    if isinstance(ids, str):
        ids = [x for x in ids.replace(" ", "").split(",") if x]
    return [_index(i, where) for i in (ids if isinstance(ids, list) else [ids])]


def _serials(doc: Mapping[str, Any]) -> dict[int, str]:
    out: dict[int, str] = {}
    for group in doc.get("entity_groups", []) if isinstance(doc.get("entity_groups"), list) else []:
        if isinstance(group, Mapping) and str(group.get("entity_group", "")).upper() == "GPU":
            for e in group.get("entities", []) or []:
                if isinstance(e, Mapping) and isinstance(e.get("entity_id"), int) and e.get("serial_num"):
                    out[int(e["entity_id"])] = str(e["serial_num"])
    legacy = doc.get("GPU Device Serials")
    if isinstance(legacy, Mapping):
        out.update({int(k): str(v) for k, v in legacy.items() if str(k).isdecimal() and v})
    return out


def _tests(categories: Iterable[Any]) -> Iterable[tuple[str, str, Mapping[str, Any]]]:
    for c in categories:
        if not isinstance(c, Mapping) or not isinstance(c.get("tests"), list):
            raise _refuse(f"a test category is not an object with a list of tests: {str(c)[:80]}")
        for t in c["tests"]:
            if (
                not isinstance(t, Mapping)
                or not isinstance(t.get("name"), str)
                or not isinstance(t.get("results"), list)
            ):
                raise _refuse(f"a test of {c.get('category')!r} has no name or no list of results: {str(t)[:80]}")
            yield str(c.get("category", "")), t["name"], t


def parse_diag(text: str) -> DiagRun:
    """The results of a ``dcgmi diag -j`` output; :class:`BadInput` (one line) for anything else, or for a run that
    failed to run (DCGM's ``runtime_error``) or holds no GPU result."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise _refuse(f"invalid JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(doc, Mapping):
        raise _refuse(f"the JSON is a {type(doc).__name__}, not an object")
    key = next((k for k in ("DCGM Diagnostic", "DCGM GPU Diagnostic") if k in doc), None)
    if key is None or not isinstance(doc[key], Mapping):
        raise _refuse(f"no 'DCGM Diagnostic' object (its keys: {sorted(doc)[:6]})")
    body = doc[key]
    if body.get("runtime_error"):
        raise BadInput(f"the diagnostic did not run: {' '.join(str(body['runtime_error']).split())}")
    if not isinstance(body.get("test_categories"), list):
        raise _refuse(f"'{key}' has no list of test_categories")
    serials = _serials(doc)
    results = []
    for category, test, t in _tests(body["test_categories"]):
        for r in t["results"]:
            where = f"test {test!r}"
            if not isinstance(r, Mapping):
                raise _refuse(f"{where} has a result that is not an object: {r!r}")
            gpus = _gpus(r, where)
            if not gpus:
                continue
            status, warnings, info = _status(r.get("status"), where), _warnings(r, where), _info(r)
            for i in gpus:
                result = DiagResult(
                    index=i,
                    serial=serials.get(i),
                    category=category,
                    test=test,
                    status=status,
                    warnings=warnings,
                    info=info,
                )
                results.append(result)
    if not results:
        raise BadInput("the dcgmi diag output holds no result of any GPU: nothing to record")
    metadata = doc.get("metadata")
    meta: Mapping[str, Any] = metadata if isinstance(metadata, Mapping) else doc
    version = meta.get("version", body.get("version"))
    driver = meta.get("Driver Version Detected", doc.get("Driver Version Detected"))
    return DiagRun(
        dcgm_version=None if version is None else str(version),
        driver=None if driver is None else str(driver),
        results=tuple(results),
    )
