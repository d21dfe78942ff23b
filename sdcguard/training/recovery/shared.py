"""Snapshots that survive a restart: the keeper's host buffers live in files of a node-local shared-memory
folder (``snapshot_dir``, e.g. ``/dev/shm/<job>``), so the snapshot copy *is* the surviving copy (no second copy),
and the verified one is published by a small record beside them.

Per rank: ``rank<R>.slot0`` to ``rank<R>.slot3`` (the keeper's buffers: each snapshot's tensors, one after another,
64-byte aligned) and ``rank<R>.json`` (the verified snapshot: its step, digest, the fingerprint of every tensor, their
layout, the slot, and the skeleton's plain values), written to a temporary name and renamed, so a reader sees a whole
record or the one before. A copy goes into a slot no kept snapshot uses; the record names a slot only once the copy in
it is complete: a crash mid-copy leaves the last published snapshot intact.

A restarted job (:func:`survivors`) reads the records of the folder newest first (this rank's first among equals; a
rank that moved to another node finds the snapshot a rank of its replica class left there: data-parallel replicas
hold the same state, and a leaver's record is an older verified state of the same run), and keeps the first whose
bits still have their fingerprints and which fits the live state (the same model). What a vote of the replicas then
confirms is :meth:`~.recover.Recovery.restore`'s.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import pickle
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .snapshot import Snapshot, snapshot_fingerprints
from .state import state_digest

__all__ = ["SharedSlots", "survivors", "Survivor"]

_ALIGN = 64
_SLOTS = 3
"""Slots per rank: the keeper's two lanes and the one the record names (a snapshot let go by the keeper stays
published until the next one is)."""

Fits = Callable[[Any, list[torch.Tensor]], "str | None"]
"""Why a kept state (skeleton, tensors) cannot be written into the live one, or None (:meth:`.state.LiveState.fits`)."""


def _layout(tensors: Sequence[torch.Tensor]) -> tuple[list[tuple[list[int], str, int]], int]:
    """Each tensor's (shape, dtype, byte offset) in a slot, and the slot's size."""
    out, offset = [], 0
    for t in tensors:
        out.append((list(t.shape), str(t.dtype).removeprefix("torch."), offset))
        offset += -(-t.numel() * t.element_size() // _ALIGN) * _ALIGN
    return out, max(offset, _ALIGN)


def _views(raw: torch.Tensor, layout: Sequence[tuple[list[int], str, int]]) -> list[torch.Tensor]:
    out = []
    for shape, dtype, offset in layout:
        dt = getattr(torch, dtype)
        n = int(np.prod(shape, dtype=np.int64)) * torch.empty((), dtype=dt).element_size()
        out.append(raw[offset : offset + n].view(dt).view(shape))
    return out


def _map(path: Path, size: int, *, create: bool) -> torch.Tensor:
    """The file at ``path`` mapped as a byte tensor (created or resized to ``size`` when ``create``)."""
    array = np.memmap(path, dtype=np.uint8, mode="w+" if create else "r+", shape=(size,))
    return torch.from_numpy(array)


class SharedSlots:
    """One rank's two slot files and its record (see the module docstring).

    Args:
        folder: the node-local shared-memory folder (created when missing).
        rank: this rank (global), naming its files.
    """

    def __init__(self, folder: str | os.PathLike[str], rank: int) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.rank = rank
        self._slots: dict[int, tuple[list[Any], list[torch.Tensor]]] = {}
        """slot -> (its layout, views of its tensors)."""
        self.published: int | None = None
        """The slot the published record names."""

    def _path(self, what: str) -> Path:
        return self.folder / f"rank{self.rank}.{what}"

    def buffers(self, live: Sequence[torch.Tensor], busy: Sequence[Sequence[torch.Tensor]]) -> list[torch.Tensor]:
        """Host buffers for a copy of ``live``: views into a slot that neither the published snapshot nor one of
        ``busy`` uses."""
        used = {self.published, *(self.slot_of(b) for b in busy)}
        slot = next(i for i in range(_SLOTS) if i not in used)
        layout, size = _layout(live)
        kept = self._slots.get(slot)
        if kept is None or kept[0] != layout:
            kept = (layout, _views(_map(self._path(f"slot{slot}"), size, create=True), layout))
            self._slots[slot] = kept
        return kept[1]

    def slot_of(self, tensors: Sequence[torch.Tensor]) -> int | None:
        """The slot whose buffers ``tensors`` are (None: memory of its own)."""
        for slot, (_, views) in self._slots.items():
            if views is tensors or (views and tensors and views[0] is tensors[0]):
                return slot
        return None

    def keep(self, snap: Snapshot, busy: Sequence[Sequence[torch.Tensor]]) -> Snapshot:
        """``snap`` in a slot (copied there when its tensors are elsewhere: a heal's, a restart's; into none of
        ``busy``), published."""
        if self.slot_of(snap.tensors) is None:
            buffers = self.buffers(snap.tensors, busy)
            for dst, src in zip(buffers, snap.tensors):
                dst.copy_(src)
            snap = Snapshot(
                step=snap.step,
                skeleton=snap.skeleton,
                tensors=buffers,
                fingerprints=list(snap.fingerprints),
                digest=snap.digest,
            )
        self.publish(snap)
        return snap

    def publish(self, snap: Snapshot) -> None:
        """Name ``snap`` (in a slot, its copy complete) as this rank's surviving snapshot."""
        slot = self.slot_of(snap.tensors)
        if slot is None:
            return
        layout, _ = _layout(snap.tensors)
        record = {
            "version": 1,
            "rank": self.rank,
            "step": snap.step,
            "digest": str(snap.digest),
            "slot": slot,
            "fingerprints": [str(f) for f in snap.fingerprints],
            "layout": layout,
            "skeleton": base64.b64encode(pickle.dumps(snap.skeleton, protocol=4)).decode("ascii"),
        }
        tmp = self._path("json.tmp")
        tmp.write_text(json.dumps(record), encoding="utf-8")
        os.replace(tmp, self._path("json"))
        self.published = slot

    def withdraw(self) -> None:
        """No surviving snapshot any more (the one published may hold a fault found since)."""
        self._path("json").unlink(missing_ok=True)
        self.published = None

    def clear(self) -> None:
        """The job ended well: this rank's record and slot files are removed (node memory), the folder too when it is
        left empty."""
        self.withdraw()
        self._slots.clear()
        for slot in range(_SLOTS):
            self._path(f"slot{slot}").unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            self.folder.rmdir()

    def survivor(self, fits: Fits) -> tuple[Snapshot | None, list[str]]:
        """:func:`survivors` of this folder for this rank."""
        found = survivors(self.folder, self.rank, fits)
        return found.snapshot, found.refused


class Survivor:
    """A snapshot found in the folder at a restart: from which file, and why others were refused."""

    def __init__(self, snapshot: Snapshot | None, source: str, refused: list[str]) -> None:
        self.snapshot, self.source, self.refused = snapshot, source, refused


def survivors(
    folder: str | os.PathLike[str], rank: int, fits: Callable[[Any, list[torch.Tensor]], str | None]
) -> Survivor:
    """The newest intact snapshot in ``folder`` that ``fits`` the live state (None: it does, else why not; this
    rank's record first among records of one step: see the module docstring). Its tensors are copies in this process's
    memory."""
    root = Path(folder)
    if not root.is_dir():
        return Survivor(None, "", [])
    records = []
    for path in sorted(root.glob("rank*.json")):
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
            records.append((-int(record["step"]), path.name != f"rank{rank}.json", path, record))
        except (OSError, ValueError, KeyError):
            continue
    refused: list[str] = []
    for _, _, path, record in sorted(records, key=lambda r: r[:2]):
        why = _check(root, record, fits)
        if isinstance(why, Snapshot):
            return Survivor(why, str(path), refused)
        refused.append(f"{path.name} (step {record.get('step')}): {why}")
    return Survivor(None, "", refused)


def _check(root: Path, record: dict[str, Any], fits: Fits) -> Snapshot | str:
    layout = [(list(s), d, int(o)) for s, d, o in record["layout"]]
    path = root / f"rank{record['rank']}.slot{record['slot']}"
    try:
        size = path.stat().st_size
        tensors = [t.clone() for t in _views(_map(path, size, create=False), layout)]
    except (OSError, ValueError, RuntimeError) as e:
        return f"its slot cannot be read ({e})"
    fps = snapshot_fingerprints(tensors)
    if fps != [int(f) for f in record["fingerprints"]]:
        return "its bits differ from their fingerprints (corrupted in memory)"
    skeleton = pickle.loads(base64.b64decode(record["skeleton"]))
    unfit = fits(skeleton, tensors)
    if unfit is not None:
        return unfit
    digest = state_digest(fps, skeleton)
    if digest != int(record["digest"]):
        return "its digest differs from the record's"
    return Snapshot(step=int(record["step"]), skeleton=skeleton, tensors=tensors, fingerprints=fps, digest=digest)
