"""Checkpoint records: the fingerprint of every tensor of a state, kept beside a checkpoint and checked against what
is read back. One format for every checkpoint sdcguard verifies: DCP checkpoints (:mod:`.dcp`), Lightning's
checkpoint files and Hugging Face ``Trainer`` checkpoint folders (:mod:`sdcguard.adapters`).

A record is JSON: ``{"format", "step", "verified", "digest", "ranks", "fingerprints": {key: {hex: [ranks]}}}``,
and, since records got them, ``"metadata"`` (the fingerprint of DCP's ``.metadata`` file, so a damaged index is
found as such) and ``"check"`` (the fingerprint of the record's own canonical JSON without it, so a damaged record
is never mistaken for a damaged tensor). Older records without them are read as before.
Keys are the state's nested keys joined by dots (``model.layer.weight``, DCP's spelling); a sharded tensor's local
shard adds the rank's coordinates in its device mesh (``#0,1``). Several ranks saving one key (replicas) list the
value each saw. It is written last and atomically: a record means its checkpoint was complete.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch

from ..errors import CheckpointCorrupted, CheckpointError
from ..fingerprints import combine, fingerprint_many, local_tensor
from ..logs import get_logger

if TYPE_CHECKING:
    from torch.distributed.tensor import DTensor

__all__ = [
    "fingerprints",
    "child_key",
    "make_record",
    "write_record",
    "read_record",
    "differences",
    "corrupted",
    "FORMAT",
    "file_fingerprint",
    "bytes_fingerprint",
]

_log = get_logger("checkpoint")

FORMAT = "sdcguard-checkpoint/1"


def child_key(prefix: str, name: Any) -> str:
    """The record's key of entry ``name`` (a mapping's key or a sequence's index) of the value at ``prefix``."""
    return f"{prefix}.{name}" if prefix else str(name)


def _entries(obj: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(obj, torch.Tensor):
        yield prefix, obj
    elif isinstance(obj, Mapping):
        for k, v in obj.items():
            yield from _entries(v, child_key(prefix, k))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from _entries(v, child_key(prefix, i))
    elif hasattr(obj, "state_dict") and callable(obj.state_dict):  # DCP's Stateful objects
        yield from _entries(obj.state_dict(), prefix)


def _local(key: str, t: torch.Tensor) -> tuple[str, torch.Tensor]:
    """This rank's part of ``t``, keyed by the shard's coordinates in its mesh when ``t`` is sharded."""
    shard = local_tensor(t)
    if shard is t:
        return key, t
    coords: Sequence[int] = cast("DTensor", t).device_mesh.get_coordinate() or []  # a DTensor: it has to_local
    return f"{key}#{','.join(map(str, coords))}", shard


def fingerprints(state: Any) -> dict[str, int]:
    """Every tensor of a nested state (each rank's local shard), fingerprinted on its own device."""
    items = [_local(k, t) for k, t in _entries(state)]
    items = [(k, t) for k, t in items if t.layout == torch.strided and t.device.type != "meta"]
    values = fingerprint_many([t.detach() for _, t in items])
    return dict(zip([k for k, _ in items], values))


def make_record(per_rank: Sequence[dict[str, int]], *, step: int | None, verified: bool | None) -> dict[str, Any]:
    """The record of a checkpoint from every saving rank's fingerprints."""
    table: dict[str, dict[str, list[int]]] = {}
    for rank, mine in enumerate(per_rank):
        for key, value in mine.items():
            table.setdefault(key, {}).setdefault(f"{value:016x}", []).append(rank)
    split = sorted(k for k, v in table.items() if len(v) > 1)
    if split:
        _log.warning(
            "the ranks held different values of %s when saving: replicas disagree (see guard.incidents)",
            ", ".join(split[:5]),
        )
    digest = f"{combine([int(min(table[k]), 16) for k in sorted(table)]):016x}"
    return {
        "format": FORMAT,
        "step": step,
        "verified": verified,
        "digest": digest,
        "ranks": len(per_rank),
        "fingerprints": table,
    }


def bytes_fingerprint(data: bytes) -> str:
    """The fingerprint of some bytes (16 hex digits)."""
    import numpy as np

    return f"{fingerprint_many([np.frombuffer(data, dtype=np.uint8)])[0]:016x}"


def file_fingerprint(file: Path) -> str:
    """The fingerprint of a (small) file's bytes (16 hex digits)."""
    return bytes_fingerprint(file.read_bytes())


def _self_check(body: dict[str, Any]) -> str:
    return bytes_fingerprint(json.dumps({k: v for k, v in body.items() if k != "check"}, sort_keys=True).encode())


def write_record(file: Path, body: dict[str, Any]) -> None:
    """Write a record atomically (a temporary file in the same directory, then a rename), with its self-check."""
    body = {**body, "check": _self_check(body)}
    tmp = file.with_name(f".{file.name}.tmp")
    tmp.write_text(json.dumps(body, sort_keys=True), encoding="utf-8")
    os.replace(tmp, file)


def read_record(file: Path, what: str, *, strict: bool) -> dict[str, Any] | None:
    """The record in ``file``; None (with a warning) when there is none, an error under ``strict`` or when it is
    unreadable, truncated or foreign."""
    if not file.exists():
        message = f"{what} was written without sdcguard fingerprints (no {file.name})"
        if strict:
            raise CheckpointError(f"{message}: refused (strict=True)")
        warnings.warn(f"sdcguard: {message}; loading it unchecked", RuntimeWarning, stacklevel=3)
        return None
    try:
        body = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{file} is unreadable or truncated ({e}); the checkpoint cannot be trusted") from None
    if not isinstance(body, dict) or body.get("format") != FORMAT or not isinstance(body.get("fingerprints"), dict):
        found = body.get("format") if isinstance(body, dict) else type(body).__name__
        raise CheckpointError(f"{file} is not an sdcguard checkpoint record (format {found!r})")
    if "check" in body and body["check"] != _self_check(body):
        raise CheckpointError(
            f"{file} is damaged: the fingerprint record differs from its own check; the checkpoint cannot be trusted"
        )
    return body


def differences(body: dict[str, Any], mine: dict[str, int]) -> tuple[list[str], list[str]]:
    """(keys whose value differs from every value saved, keys the record does not hold)."""
    saved: dict[str, dict[str, list[int]]] = body["fingerprints"]
    differing = sorted(k for k, v in mine.items() if k in saved and f"{v:016x}" not in saved[k])
    return differing, sorted(k for k in mine if k not in saved)


def corrupted(what: str, bad: dict[str, list[int]]) -> CheckpointCorrupted:
    """The error naming the keys that differ and the ranks that read them."""
    keys = sorted(bad)
    ranks = sorted({r for rs in bad.values() for r in rs})
    listed = ", ".join(f"{k} (rank {', '.join(map(str, bad[k]))})" for k in keys[:8])
    return CheckpointCorrupted(
        f"{what}: {len(keys)} tensor(s) differ from what was saved: {listed}" + (" ..." if len(keys) > 8 else ""),
        keys=tuple(keys),
        ranks=tuple(ranks),
    )
