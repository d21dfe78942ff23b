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

A state is *verified* when ``guard.last_verified_step`` covers it (see :mod:`..training.verdicts.verification`); with
``only_verified=True`` an unverified state is not saved. Each checkpoint saved with a guard is remembered by it (a
later incident names the newest verified one to restart from) and, when the guard has a fleet store, recorded there.

Shards are matched by key and by the rank's coordinates in the device mesh, so a load with the same sharding is
checked tensor by tensor; a shard saved under another sharding is reported as not checked (a warning).

``load(..., fallback=True)`` loads the newest checkpoint that is verified and still verifies: from a directory of
checkpoints, or the siblings of the one named, or (``store=``) the checkpoints the fleet store recorded as verified.
The asynchronous save is :mod:`.asynchronous`; re-reading checkpoints at rest is :mod:`.scrub`.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch.distributed as dist

from ..errors import BadInput, CheckpointCorrupted, CheckpointError
from ..logs import get_logger
from ..training.comm import Comm
from .layout import METADATA, SIDECAR, Candidate, candidates, describe_failure, is_checkpoint, metadata_damage
from .record import corrupted, differences, file_fingerprint, fingerprints, make_record, read_record, write_record

if TYPE_CHECKING:
    from ..training.guard import SDCGuard

__all__ = ["save", "load", "CheckpointInfo", "SIDECAR", "store_candidates"]

_log = get_logger("checkpoint")


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
    error: str | None = None
    """Why the checkpoint was not written (an asynchronous save whose background write failed); None otherwise."""
    skipped: tuple[str, ...] = ()
    """On ``load(..., fallback=True)``: the newer checkpoints passed over, each with why."""


def _distributed(kwargs: dict[str, Any]) -> bool:
    return not kwargs.get("no_dist", False) and dist.is_available() and dist.is_initialized()


def _gather(obj: Any, kwargs: dict[str, Any]) -> list[Any]:
    return Comm(kwargs.get("process_group")).gather_objects(obj) if _distributed(kwargs) else [obj]


def _rank(kwargs: dict[str, Any]) -> int:
    return dist.get_rank(kwargs.get("process_group")) if _distributed(kwargs) else 0


def _path(checkpoint_id: str | os.PathLike[str] | None) -> Path:
    if checkpoint_id is None or not str(checkpoint_id).strip():
        raise BadInput("checkpoint_id is required: the directory the checkpoint lives in")
    return Path(checkpoint_id)


def save(
    state_dict: dict[str, Any],
    *,
    checkpoint_id: str | os.PathLike[str],
    guard: SDCGuard | None = None,
    step: int | None = None,
    only_verified: bool = False,
    overwrite: bool = False,
    **kwargs: Any,
) -> CheckpointInfo:
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
        return CheckpointInfo(
            checkpoint_id=str(path), step=step, verified=verified, digest="", tensors=len(fps), saved=False
        )
    import torch.distributed.checkpoint as dcp

    dcp.save(state_dict, checkpoint_id=str(path), **kwargs)
    body = make_record(_gather(fps, kwargs), step=step, verified=verified)
    if _rank(kwargs) == 0:
        body["metadata"] = file_fingerprint(path / METADATA)
        write_record(path / SIDECAR, body)  # last and atomic: a record means the checkpoint is complete
    if _distributed(kwargs):
        Comm(kwargs.get("process_group")).barrier()
    if guard is not None and step is not None:
        guard.record_checkpoint(str(path), step, body["digest"])
    return CheckpointInfo(
        checkpoint_id=str(path), step=step, verified=verified, digest=body["digest"], tensors=len(fps)
    )


def load(
    state_dict: dict[str, Any],
    *,
    checkpoint_id: str | os.PathLike[str],
    strict: bool = False,
    fallback: bool = False,
    store: str | os.PathLike[str] | None = None,
    **kwargs: Any,
) -> CheckpointInfo:
    """Load ``state_dict`` in place with DCP, then check every tensor against its saved fingerprint (collective).

    Raises :class:`~sdcguard.errors.CheckpointCorrupted` on every rank when a tensor (or DCP's index file) differs
    from what was saved (its values are then what was read: load another checkpoint),
    :class:`~sdcguard.errors.CheckpointError` for a missing, truncated or foreign checkpoint, or one without
    fingerprints under ``strict=True`` (a warning otherwise).

    ``fallback=True``: ``checkpoint_id`` names a directory of checkpoints, or one checkpoint (then its siblings are
    candidates too); the newest whose record says *verified* and which loads without a difference is loaded, and
    ``skipped`` says why each newer one was passed over (also a warning). ``store``: the candidates are the
    checkpoints the fleet store recorded as verified (after a merge: on any node) at or under ``checkpoint_id``.
    Raises ``CheckpointError`` when none is left. Every rank must see the same files (shared storage).
    """
    if fallback or store is not None:
        return _load_fallback(state_dict, Path(_path(checkpoint_id)), strict=strict, store=store, **kwargs)
    return _load_one(state_dict, _path(checkpoint_id), strict=strict, **kwargs)


def _load_one(state_dict: dict[str, Any], path: Path, *, strict: bool, **kwargs: Any) -> CheckpointInfo:
    if not is_checkpoint(path):
        raise CheckpointError(f"no checkpoint at {path} (no DCP .metadata file)")
    body = read_record(path / SIDECAR, str(path), strict=strict)
    damage = metadata_damage(path, body) if body is not None else None
    if damage:
        raise CheckpointCorrupted(f"checkpoint {path}: {damage}")
    import torch.distributed.checkpoint as dcp

    try:
        dcp.load(state_dict, checkpoint_id=str(path), **kwargs)
    except (Exception, dcp.CheckpointException) as e:  # a truncated or foreign file (DCP's is a BaseException)
        raise CheckpointError(
            f"{path} could not be read ({describe_failure(e)}): a data file is truncated, foreign or missing"
        ) from None
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
        warnings.warn(
            f"sdcguard: {len(missed)} tensor(s) of {path} not checked (saved under another sharding, "
            f"or not saved): {', '.join(missed[:5])}",
            RuntimeWarning,
            stacklevel=2,
        )
    return CheckpointInfo(
        checkpoint_id=str(path),
        step=body.get("step"),
        verified=body.get("verified"),
        digest=str(body.get("digest", "")),
        tensors=len(mine),
        checked=not missed,
    )


def store_candidates(store: str | os.PathLike[str], root: Path) -> list[Candidate]:
    """The checkpoints the fleet store recorded as verified and saved, at or under ``root``, newest step first (in a
    drill, those its drill store recorded: :func:`~sdcguard.fleet.store.spool.open_reader`)."""
    from ..fleet.store.spool import open_reader

    with open_reader(store) as db:
        rows = [c for c in db.training.checkpoints() if c.verified and c.status == "saved"]
    inside = [c for c in rows if Path(c.checkpoint_id) == root or root in Path(c.checkpoint_id).parents]
    newest = sorted(inside, key=lambda c: (c.step, c.time), reverse=True)
    seen: set[str] = set()
    out: list[Candidate] = []
    for c in newest:  # the newest record of each checkpoint
        if c.checkpoint_id not in seen:
            seen.add(c.checkpoint_id)
            out.append(Candidate(path=Path(c.checkpoint_id), step=c.step, verified=True))
    return out


def _load_fallback(
    state_dict: dict[str, Any], path: Path, *, strict: bool, store: str | os.PathLike[str] | None, **kwargs: Any
) -> CheckpointInfo:
    if store is not None:
        found = store_candidates(store, path)
    else:
        if not path.is_dir():
            raise CheckpointError(f"no checkpoint or directory of checkpoints at {path}")
        named = is_checkpoint(path)
        found = candidates(path.parent if named else path)
        if named:  # the one named first, then its siblings that are not newer
            first = next(c for c in found if c.path == path)
            found = [first] + [
                c for c in found if c.path != path and (first.step is None or c.step is None or c.step <= first.step)
            ]
    skipped: list[str] = []
    for c in found:
        if c.problem:
            skipped.append(f"{c.path}: {c.problem}")
            continue
        if c.verified is not True:
            skipped.append(f"{c.path}: not verified (step {c.step})")
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # a partial check is reported through `checked`
                info = _load_one(state_dict, c.path, strict=True, **kwargs)
        except (CheckpointCorrupted, CheckpointError) as e:
            skipped.append(f"{c.path}: {e}")
            continue
        if skipped:
            _log.warning(
                "loaded %s, passing over %d newer checkpoint(s): %s", c.path, len(skipped), "; ".join(skipped[:4])
            )
        return CheckpointInfo(**{**info.__dict__, "skipped": tuple(skipped)})
    where = f"the fleet store {store}" if store is not None else str(path)
    raise CheckpointError(
        f"no verified checkpoint that still verifies in {where}"
        + (f" ({'; '.join(skipped[:4])})" if skipped else " (none found)")
    )
