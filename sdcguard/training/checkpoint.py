"""Verified checkpoints: ``torch.distributed.checkpoint`` (DCP) with the fingerprint of every saved tensor, checked
when it is read back, and a record of whether the guard's checks vouched for the saved state.

``save(state_dict, checkpoint_id=..., guard=None, ...)`` and ``load(state_dict, checkpoint_id=..., ...)`` have DCP's
shape and write DCP's layout (each rank its own shards, under DDP and FSDP2 alike, or one process); extra keyword
arguments go to DCP. Before DCP copies anything, every tensor of the state dict (each rank's local shard of a
sharded one) is fingerprinted on its own device (:func:`sdcguard.fingerprint`); after DCP has written the
checkpoint the fingerprints of every rank go into one more file of the checkpoint, ``sdcguard.json``, written last
and atomically (with the step, whether it is verified, and a digest of all fingerprints). ``load`` fingerprints what
it read and raises :class:`~sdcguard.errors.CheckpointCorrupted`, on every rank alike, naming the keys and the ranks
that read them differently. DCP itself keeps no checksum of the data: a flipped byte in a file on disk or on
shared storage loads silently without this.

A state is *verified* when ``guard.last_verified_step`` covers it (see :mod:`.verification`); with
``only_verified=True`` an unverified state is not saved. Each checkpoint saved with a guard is remembered by it (a
later incident names the newest verified one to restart from) and, when the guard has a fleet store, recorded there.

Shards are matched by key and by the rank's coordinates in the device mesh, so a load with the same sharding is
checked tensor by tensor; a shard saved under another sharding is reported as not checked (a warning).
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch.distributed as dist

from ..errors import BadInput, CheckpointError
from .record import corrupted, differences, fingerprints, make_record, read_record, write_record

if TYPE_CHECKING:
    from .guard import SDCGuard

__all__ = ["save", "load", "CheckpointInfo", "SIDECAR"]

SIDECAR = "sdcguard.json"
"""The file, inside a DCP checkpoint, that holds the fingerprints of every saved tensor."""


@dataclass(frozen=True, kw_only=True)
class CheckpointInfo:
    """What ``save`` wrote or ``load`` read."""

    checkpoint_id: str
    step: int | None
    """The training step whose state it holds (None: not known)."""
    verified: bool | None
    """Whether the guard's checks vouched for that state (None: saved without a guard)."""
    digest: str
    """A digest of every tensor's fingerprint (16 hex digits): equal digests, equal checkpoints."""
    tensors: int
    """Tensors (local shards) fingerprinted on this rank."""
    saved: bool = True
    """False when ``only_verified=True`` kept an unverified state from being saved."""
    checked: bool = True
    """On load: every tensor was compared with its saved fingerprint."""


def _distributed(kwargs: dict[str, Any]) -> bool:
    return not kwargs.get("no_dist", False) and dist.is_available() and dist.is_initialized()


def _gather(obj: Any, kwargs: dict[str, Any]) -> list[Any]:
    if not _distributed(kwargs):
        return [obj]
    group = kwargs.get("process_group")
    out: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, obj, group=group)
    return out


def _rank(kwargs: dict[str, Any]) -> int:
    return dist.get_rank(kwargs.get("process_group")) if _distributed(kwargs) else 0


def _path(checkpoint_id: str | os.PathLike[str] | None) -> Path:
    if checkpoint_id is None or not str(checkpoint_id).strip():
        raise BadInput("checkpoint_id is required: the directory the checkpoint lives in")
    return Path(checkpoint_id)


def save(state_dict: dict[str, Any], *, checkpoint_id: str | os.PathLike[str], guard: SDCGuard | None = None,
         step: int | None = None, only_verified: bool = False, overwrite: bool = False,
         **kwargs: Any) -> CheckpointInfo:
    """Save ``state_dict`` with DCP and the fingerprint of every tensor (collective: every rank calls it).

    ``step`` defaults to the last step the guard saw. With ``only_verified=True`` and a state the guard's checks do
    not vouch for, nothing is written and ``saved`` is False. An existing checkpoint is not overwritten unless
    ``overwrite=True``.
    """
    path = _path(checkpoint_id)
    if (path / ".metadata").exists() and not overwrite:
        raise BadInput(f"{path} already holds a checkpoint; pass overwrite=True to replace it")
    if guard is not None and step is None:
        step = guard.state_dict()["last_step"]
    verified: bool | None = None
    if guard is not None:
        last = guard.last_verified_step
        verified = last is not None and step is not None and step <= last
    fps = fingerprints(state_dict)  # on each tensor's device, before DCP copies anything
    if only_verified and not verified:
        return CheckpointInfo(checkpoint_id=str(path), step=step, verified=verified, digest="", tensors=len(fps),
                              saved=False)
    import torch.distributed.checkpoint as dcp

    dcp.save(state_dict, checkpoint_id=str(path), **kwargs)
    body = make_record(_gather(fps, kwargs), step=step, verified=verified)
    if _rank(kwargs) == 0:
        write_record(path / SIDECAR, body)  # last and atomic: a record means the checkpoint is complete
    if _distributed(kwargs):
        dist.barrier(group=kwargs.get("process_group"))
    if guard is not None and step is not None:
        guard.record_checkpoint(str(path), step, body["digest"])
    return CheckpointInfo(checkpoint_id=str(path), step=step, verified=verified, digest=body["digest"],
                          tensors=len(fps))


def load(state_dict: dict[str, Any], *, checkpoint_id: str | os.PathLike[str], strict: bool = False,
         **kwargs: Any) -> CheckpointInfo:
    """Load ``state_dict`` in place with DCP, then check every tensor against its saved fingerprint (collective).

    Raises :class:`~sdcguard.errors.CheckpointCorrupted` on every rank when a tensor differs (its values are then
    what was read: load another checkpoint), :class:`~sdcguard.errors.CheckpointError` for a missing, truncated or
    foreign checkpoint, or one without fingerprints under ``strict=True`` (a warning otherwise).
    """
    path = _path(checkpoint_id)
    if not (path / ".metadata").exists():
        raise CheckpointError(f"no checkpoint at {path} (no DCP .metadata file)")
    body = read_record(path / SIDECAR, str(path), strict=strict)
    import torch.distributed.checkpoint as dcp

    try:
        dcp.load(state_dict, checkpoint_id=str(path), **kwargs)
    except (Exception, dcp.CheckpointException) as e:  # a truncated or foreign file (DCP's is a BaseException)
        failures = getattr(e, "failures", None) or {}
        inner = next(iter(failures.values()), e)
        cause = inner[0] if isinstance(inner, tuple) and inner else inner  # DCP keeps (exception, traceback)
        what = f"{type(cause).__name__}: {str(cause).strip().splitlines()[0][:200]}" if str(cause).strip() else type(
            cause).__name__
        raise CheckpointError(f"{path} could not be read ({what}): a data file is truncated, foreign or "
                              "missing") from None
    if body is None:
        return CheckpointInfo(checkpoint_id=str(path), step=None, verified=None, digest="", tensors=0, checked=False)
    mine = fingerprints(state_dict)
    everyone = _gather(differences(body, mine), kwargs)
    bad: dict[str, list[int]] = {}
    for rank, (keys, _) in enumerate(everyone):
        for k in keys:
            bad.setdefault(k, []).append(rank)
    if bad:
        raise corrupted(f"checkpoint {path}", bad)
    missed = sorted({k for _, u in everyone for k in u})
    if missed:
        warnings.warn(f"sdcguard: {len(missed)} tensor(s) of {path} not checked (saved under another sharding, "
                      f"or not saved): {', '.join(missed[:5])}", RuntimeWarning, stacklevel=2)
    return CheckpointInfo(checkpoint_id=str(path), step=body.get("step"), verified=body.get("verified"),
                          digest=str(body.get("digest", "")), tensors=len(mine), checked=not missed)
