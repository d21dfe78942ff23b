"""Verified snapshots in host memory: the state a recovery rolls back to, kept off the critical path.

A :class:`Snapshot` is a host copy of the live training state (:class:`~.state.LiveState`) after some step, with the
fingerprint of every tensor and one digest of the whole (:func:`~.state.state_digest`), taken on the device before the
copy (so the copy is checked against what was live). :class:`SnapshotKeeper` keeps two: the *verified* one (the newest
the samples vouch for) and a *pending* one, taken at the start of the step after a sampled step (so it is the state
that step starts from) into other buffers, which becomes the verified one once the samples vouch for it (at once in
peer mode; steps later with dedicated shadows, whose verdicts lag). A verified snapshot is never overwritten by a copy
in flight.

The copy: on a CPU, into host buffers kept across snapshots, the fingerprint in the same pass; on a GPU, into
pinned host buffers on a side stream that waits for the current one, so it overlaps the step's forward and
backward; :meth:`SnapshotKeeper.fence` makes the current stream wait for it before the optimizer changes the
tensors (no host synchronisation).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import torch

from ...fingerprints import copy_and_fingerprint, fingerprints_on_device, unsigned64
from .state import LiveState, state_digest

__all__ = ["Snapshot", "SnapshotKeeper", "HostSlots", "Lane"]


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

    def buffers(self, live: Sequence[torch.Tensor], busy: Sequence[Sequence[torch.Tensor]]) -> list[torch.Tensor]:
        """Buffers for a copy of ``live``, none of those ``busy`` (the snapshots kept)."""

    def publish(self, snap: Snapshot) -> None:
        """``snap`` (in buffers from :meth:`buffers`, complete) is the verified one now."""

    def keep(self, snap: Snapshot, busy: Sequence[Sequence[torch.Tensor]]) -> Snapshot:
        """``snap`` copied into buffers of its own when it is elsewhere (none of ``busy``), and published."""

    def withdraw(self) -> None:
        """No verified snapshot any more."""

    def clear(self) -> None:
        """The job is over: remove what this rank keeps (its record and slots)."""

    def survivor(self, fits: Callable[[Any, list[torch.Tensor]], str | None]) -> tuple[Snapshot | None, list[str]]:
        """At a restart: the newest intact snapshot that outlived the last process and ``fits`` the live state
        (None: it does, else why not), and why others were refused."""


Lane = Literal["anchored", "pending"]
"""Where a keeper holds a snapshot (see :class:`SnapshotKeeper`)."""


class SnapshotKeeper:
    """Snapshots in two lanes (see the module docstring), each at most one:

    - ``anchored``: the verified snapshot, the newest the samples vouch for (``guard.last_verified_step``);
    - ``pending``: taken after a sampled step, waiting for the samples to vouch for it (with dedicated shadows their
      verdicts come steps later): it becomes the anchored one.

    Args:
        live: the state snapshots copy and restores write.
        shared: where the buffers live when the snapshots must survive a restart (:mod:`.shared`); None: process
            memory.
    """

    def __init__(self, live: LiveState, shared: HostSlots | None = None) -> None:
        self.live = live
        self.shared = shared
        self.lanes: dict[Lane, Snapshot] = {}
        self._spares: list[list[torch.Tensor]] = []
        """Host buffers of dropped or superseded snapshots, reused by the next copies of the same layout."""
        self._stream: Any = None
        self._in_flight: Snapshot | None = None

    @property
    def verified(self) -> Snapshot | None:
        """The verified snapshot (the anchored one)."""
        return self.lanes.get("anchored")

    def take(self, step: int, lane: Lane) -> Snapshot:
        """Copy the live state into ``lane`` as the state step ``step`` starts from (what it held is let go)."""
        skeleton, live = self.live.read()
        buffers = self._buffers(live)
        if any(t.device.type == "cuda" for t in live):
            snap = self._take_cuda(step, skeleton, live, buffers)
        else:
            fps = [unsigned64(v) for v in copy_and_fingerprint([t.contiguous() for t in live], buffers)]
            snap = Snapshot(
                step=step, skeleton=skeleton, tensors=buffers, fingerprints=fps, digest=state_digest(fps, skeleton)
            )
        self._in_flight = snap
        self.put(lane, snap)
        return snap

    def put(self, lane: Lane, snap: Snapshot | None) -> None:
        """``snap`` into ``lane`` (None: empty it); what the lane held is let go, and the newest verified snapshot
        published where it must survive a restart."""
        old = self.lanes.pop(lane, None)
        if snap is not None:
            self.lanes[lane] = snap
        if old is not None and all(old is not s for s in self.lanes.values()) and len(self._spares) < 2:
            self._spares.append(old.tensors)
        if self.shared is not None and lane != "pending":
            verified = self.verified
            if verified is None:
                self.shared.withdraw()
            else:
                self.shared.publish(verified.finish())

    def _buffers(self, live: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        if self.shared is not None:
            return self.shared.buffers(live, [s.tensors for s in self.lanes.values()])
        layout = [(t.shape, t.dtype) for t in live]
        for i, spare in enumerate(self._spares):
            if [(t.shape, t.dtype) for t in spare] == layout:
                return self._spares.pop(i)
        self._spares.clear()
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
        return Snapshot(
            step=step,
            skeleton=skeleton,
            tensors=buffers,
            fingerprints=fps,
            _pending=(device_fps, on_device),
            _event=event,
        )

    def fence(self) -> None:
        """Make the current CUDA stream wait for a copy in flight before the optimizer changes what it reads."""
        snap = self._in_flight
        if self._stream is not None and snap is not None and snap._event is not None:
            torch.cuda.current_stream().wait_event(snap._event)

    def adopt(self, snap: Snapshot) -> None:
        """Keep ``snap`` (received in a heal, or loaded at a restart) as the anchored snapshot, the only one."""
        busy = [s.tensors for s in self.lanes.values()]
        kept = snap if self.shared is None else self.shared.keep(snap, busy)
        self.put("pending", None)
        self.put("anchored", kept)

    def restore(self, snap: Snapshot) -> None:
        """Write ``snap`` back into the live state (the module's tensors in place; the rest loaded from clones)."""
        self.live.write(snap.finish().skeleton, snap.tensors, torch.Tensor.clone)

    def live_digest(self) -> int:
        """The digest of the live state now (what a post-heal vote compares)."""
        skeleton, live = self.live.read()
        return state_digest(snapshot_fingerprints(live), skeleton)
