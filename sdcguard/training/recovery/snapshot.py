"""Verified snapshots in host memory: the state a recovery rolls back to, kept off the critical path.

A :class:`Snapshot` is a host copy of the live training state (:class:`~.state.LiveState`) after some step, with
the fingerprint of every tensor and one digest of the whole (:func:`~.state.state_digest`), taken on the device
before the copy (so the copy is checked against what was live). :class:`SnapshotKeeper` double-buffers them: the
newest *verified* snapshot is never overwritten; a new copy goes into the other buffer, a *candidate*, and becomes
the verified one only when the guard's checks vouch for its step. The candidate is taken at the start of a step
whose predecessor a check looked at (see :meth:`SnapshotKeeper.take`), so it is the state that step starts from.

The copy: on a CPU, into host buffers kept across snapshots, the fingerprint in the same pass; on a GPU, into
pinned host buffers on a side stream that waits for the current one, so it overlaps the step's forward and
backward; :meth:`SnapshotKeeper.fence` makes the current stream wait for it before the optimizer changes the
tensors (no host synchronisation).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from ...fingerprints import copy_and_fingerprint, fingerprints_on_device, unsigned64
from .state import LiveState, state_digest

__all__ = ["Snapshot", "SnapshotKeeper", "HostSlots"]


@dataclass(eq=False)
class Snapshot:
    """The state from which step ``step`` starts (what the optimizer had applied through step ``step - 1``)."""

    step: int
    skeleton: Any
    tensors: list[torch.Tensor]
    """Host copies, in the skeleton's slot order."""
    fingerprints: list[int] = field(default_factory=list)
    """Of each tensor as it was live (filled when the copy is known to be done: :meth:`finish`)."""
    digest: int = 0
    _pending: tuple[torch.Tensor, list[int]] | None = None
    """A device copy's fingerprints still on the device, and the slots they belong to."""
    _event: Any = None

    def finish(self) -> Snapshot:
        """Wait for a device copy and read its fingerprints (one host read); a no-op once done."""
        if self._pending is not None:
            if self._event is not None:
                self._event.synchronize()
            values, slots = self._pending
            for i, v in zip(slots, values.tolist()):
                self.fingerprints[i] = unsigned64(v)
            self.digest = state_digest(self.fingerprints, self.skeleton)
            self._pending, self._event = None, None
        return self

    def intact(self) -> bool:
        """Whether the host copies still hold the bits they were taken with (a fingerprint pass over them)."""
        self.finish()
        return snapshot_fingerprints(self.tensors) == self.fingerprints

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors)


def snapshot_fingerprints(tensors: Sequence[torch.Tensor]) -> list[int]:
    """The fingerprints of ``tensors`` (on their devices, one host read)."""
    if not tensors:
        return []
    by_device: dict[torch.device, list[int]] = {}
    for i, t in enumerate(tensors):
        by_device.setdefault(t.device, []).append(i)
    out = [0] * len(tensors)
    for indices in by_device.values():
        values = fingerprints_on_device([tensors[i] for i in indices]).tolist()
        for i, v in zip(indices, values):
            out[i] = unsigned64(v)
    return out


class HostSlots(Protocol):
    """Where a keeper's host buffers live when they must outlive the process (:class:`~.shared.SharedSlots`)."""

    def buffers(self, live: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Buffers for a copy of ``live`` that do not hold the published snapshot."""

    def publish(self, snap: Snapshot) -> None:
        """``snap`` (in buffers from :meth:`buffers`, complete) is the verified one now."""

    def keep(self, snap: Snapshot) -> Snapshot:
        """``snap`` copied into buffers of its own when it is elsewhere, and published."""

    def withdraw(self) -> None:
        """No verified snapshot any more."""

    def survivor(self, fits: Callable[[Any, list[torch.Tensor]], str | None]) -> tuple[Snapshot | None, list[str]]:
        """At a restart: the newest intact snapshot that outlived the last process and ``fits`` the live state
        (None: it does, else why not), and why others were refused."""


class SnapshotKeeper:
    """The verified snapshot and at most one candidate (see the module docstring)."""

    def __init__(self, live: LiveState, shared: HostSlots | None = None) -> None:
        self.live = live
        self.shared = shared
        """The slots in node-local shared memory the buffers live in, so the verified snapshot survives a restart
        (:mod:`.shared`); None: process memory."""
        self.verified: Snapshot | None = None
        self.candidate: Snapshot | None = None
        self._spare: list[torch.Tensor] = []
        """Host buffers of a dropped or superseded snapshot, reused by the next copy of the same layout."""
        self._stream: Any = None

    def take(self, step: int) -> Snapshot:
        """Copy the live state as the candidate for the state step ``step`` starts from (replacing an unverified
        candidate; the verified snapshot is left alone)."""
        skeleton, live = self.live.read()
        buffers = self._buffers(live)
        if any(t.device.type == "cuda" for t in live):
            snap = self._take_cuda(step, skeleton, live, buffers)
        else:
            fps = [unsigned64(v) for v in copy_and_fingerprint([t.contiguous() for t in live], buffers)]
            snap = Snapshot(step=step, skeleton=skeleton, tensors=buffers, fingerprints=fps,
                            digest=state_digest(fps, skeleton))  # fmt: skip
        if self.candidate is not None:
            self._spare = self.candidate.tensors
        self.candidate = snap
        return snap

    def _buffers(self, live: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        if self.shared is not None:
            return self.shared.buffers(live)
        spare, self._spare = self._spare, []
        if [(t.shape, t.dtype) for t in spare] == [(t.shape, t.dtype) for t in live]:
            return spare
        pin = torch.cuda.is_available() and any(t.device.type == "cuda" for t in live)
        return [torch.empty(t.shape, dtype=t.dtype, pin_memory=pin) for t in live]

    def _take_cuda(self, step: int, skeleton: Any, live: list[torch.Tensor], buffers: list[torch.Tensor]) -> Snapshot:
        if self._stream is None:
            self._stream = torch.cuda.Stream()
        on_device = [i for i, t in enumerate(live) if t.device.type == "cuda"]
        fps = [0] * len(live)
        on_host = [i for i in range(len(live)) if i not in set(on_device)]
        for i, v in zip(on_host, snapshot_fingerprints([live[i] for i in on_host])):
            fps[i] = v
        self._stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self._stream):
            device_fps = fingerprints_on_device([live[i].contiguous() for i in on_device])
            for src, dst in zip(live, buffers):
                dst.copy_(src, non_blocking=True)
            event = torch.cuda.Event()
            event.record(self._stream)
        return Snapshot(step=step, skeleton=skeleton, tensors=buffers, fingerprints=fps,
                        _pending=(device_fps, on_device), _event=event)  # fmt: skip

    def fence(self) -> None:
        """Make the current CUDA stream wait for a copy in flight before the optimizer changes what it reads."""
        if self._stream is not None and self.candidate is not None and self.candidate._event is not None:
            torch.cuda.current_stream().wait_event(self.candidate._event)

    def promote(self) -> Snapshot | None:
        """The candidate becomes the verified snapshot (the old verified one's buffers are reused later)."""
        if self.candidate is None:
            return self.verified
        if self.verified is not None:
            self._spare = self.verified.tensors
        self.verified, self.candidate = self.candidate.finish(), None
        if self.shared is not None:
            self.shared.publish(self.verified)
        return self.verified

    def drop_candidate(self) -> None:
        """Forget the candidate (a check found its state may be corrupt)."""
        if self.candidate is not None:
            self._spare, self.candidate = self.candidate.tensors, None

    def forget(self) -> None:
        """Forget the verified snapshot (it may hold a fault found since)."""
        if self.verified is not None:
            self._spare, self.verified = self.verified.tensors, None
        if self.shared is not None:
            self.shared.withdraw()

    def adopt(self, snap: Snapshot) -> None:
        """Keep ``snap`` (received in a heal, or loaded at a restart) as the verified snapshot."""
        self.candidate = None
        self.verified = snap if self.shared is None else self.shared.keep(snap)

    def restore(self, snap: Snapshot) -> None:
        """Write ``snap`` back into the live state (the module's tensors in place; the rest loaded from clones)."""
        self.live.write(snap.finish().skeleton, snap.tensors, torch.Tensor.clone)

    def live_digest(self) -> int:
        """The digest of the live state now (what a post-heal vote compares)."""
        skeleton, live = self.live.read()
        return state_digest(snapshot_fingerprints(live), skeleton)
