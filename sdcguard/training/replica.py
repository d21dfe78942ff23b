"""Cross-replica checks: after the data-parallel reduction every replica must hold bit-identical gradients, and
after the optimizer step bit-identical weights. A replica that differs was corrupted on its own device (memory,
a faulty collective, a bad optimizer kernel). Software nondeterminism cannot cause it: the reduction hands every
replica the same bits whatever the kernels did before it.

Each rank fingerprints its tensors (:func:`fingerprint_column`: one fingerprint per tensor, all in one batch, on the
device), the ranks all-gather those few bytes, and :func:`vote` names, within each group of ranks that hold the
same data (a *replica class*: every rank under DDP, the ranks holding the same shard under HSDP), the minority
rank(s) of every tensor that differs. With two replicas, or without a strict majority, every disagreeing rank is a
suspect and no single device is named.

Never hangs a job: every check issues the same collectives on every rank whatever it found; the vote runs on the
gathered values, so all ranks reach the same verdict.

:class:`ReplicaCheck` is the standalone form (a loop that wants only these checks): plain parameters of the
(DDP-unwrapped) module; sharded parameters (``DTensor`` with a ``Shard`` placement) are compared only when an
explicit ``group`` is given, which must then be the replicate dimension (HSDP), where the local shards are replicas
of each other. Otherwise they are skipped and listed in :attr:`ReplicaCheck.skipped` (with a warning).
"""

from __future__ import annotations

import collections
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from ..devices import hostname
from ..fingerprints import combine_on_device, fingerprints_on_device
from ..records import Incident
from .comm import Comm
from .hooks.ddp import unwrap
from .hooks.taps import local
from .identity import local_device_id
from .step_check import CheckResult, StepState

__all__ = [
    "GradientReplicaCheck",
    "ReplicaCheck",
    "ReplicaPhases",
    "fingerprint_column",
    "odd_ranks",
    "minority",
    "vote",
    "replica_incidents",
]

NO_GRADIENT = 0
"""The value standing for a missing tensor (a parameter without gradient)."""
NOT_DENSE = 1
"""The value standing for a tensor without raw bits to fingerprint (a sparse gradient)."""


def _dense(t: torch.Tensor) -> bool:
    return t.layout == torch.strided and not t.is_quantized and t.device.type != "meta"


def fingerprint_column(tensors: Sequence[torch.Tensor | None], device: torch.device) -> torch.Tensor:
    """One int64 per tensor on ``device`` (no host synchronisation): its fingerprint, :data:`NO_GRADIENT` for None,
    :data:`NOT_DENSE` for a tensor that has no raw bits (raising on one rank would leave the others waiting)."""
    items = [None if t is None else local(t) for t in tensors]
    dense = [t is not None and _dense(t) for t in items]
    out = torch.tensor([NO_GRADIENT if t is None else NOT_DENSE for t in items], dtype=torch.int64, device=device)
    present = [t for t, d in zip(items, dense) if d]
    if present:
        out[torch.tensor(dense, device=device)] = fingerprints_on_device(present).to(device)
    return out


def odd_ranks(values: Sequence[int], keys: Sequence[object]) -> list[int]:
    """Indices of the ranks in replica classes (same ``keys`` entry) whose values are not all equal. A rank alone in
    its class has nothing to compare."""
    groups: dict[object, list[int]] = {}
    for i, k in enumerate(keys):
        groups.setdefault(k, []).append(i)
    out: list[int] = []
    for members in groups.values():
        if len({values[i] for i in members}) > 1:
            out += members
    return sorted(out)


def minority(values: list[int]) -> list[int]:
    """Positions whose value differs from a strict majority; without one, every position (all disagree)."""
    counts = collections.Counter(values)
    if len(counts) == 1:
        return []
    value, n = counts.most_common(1)[0]
    if n * 2 > len(values):
        return [r for r, v in enumerate(values) if v != value]
    return list(range(len(values)))


def vote(
    kind: str,
    step: int,
    rows: Sequence[Sequence[int]],
    keys: Sequence[object],
    names: Sequence[str],
    identities: Sequence[tuple[int, str | None, str]],
    job: str | None = None,
) -> list[Incident]:
    """Incidents for the tensors that differ within replica classes.

    ``rows``: per rank (group order), one fingerprint per tensor (``names``); ``identities``: per rank, its global
    rank, device id and host. One incident per class in which something differs.
    """
    groups: dict[object, list[int]] = {}
    for i, k in enumerate(keys):
        groups.setdefault(k, []).append(i)
    what = "gradients" if kind == "gradient_replica" else "weights"
    out = []
    for members in groups.values():
        suspects: set[int] = set()
        differing: list[str] = []
        undecided = False
        for j, name in enumerate(names):
            odd = minority([rows[m][j] for m in members])
            if odd:
                differing.append(name)
                suspects.update(members[x] for x in odd)
                undecided |= len(odd) == len(members)
        if not differing:
            continue
        ranks = sorted(suspects)
        g = tuple(identities[r][0] for r in ranks)
        more = f" and {len(differing) - 1} more" if len(differing) > 1 else ""
        settled = (
            "no strict majority: every disagreeing rank is a suspect"
            if undecided
            else f"outvoted by a strict majority of the {len(members)} replicas"
        )
        devices = tuple(identities[r][1] or "" for r in ranks)
        out.append(
            Incident(
                kind=kind,
                step=step,
                suspect_ranks=g,
                device=(devices[0] or None) if len(ranks) == 1 else None,
                detail=(
                    f"{what} of {differing[0]}{more} differ bitwise across replicas at step {step}; suspect rank(s) "
                    f"{', '.join(map(str, g))} ({settled})"
                ),
                devices=devices,
                hosts=tuple(identities[r][2] for r in ranks),
                parameter=differing[0],
                job=job,
            )
        )
    return out


def replica_incidents(
    comm: Comm,
    kind: str,
    step: int,
    tensors: Sequence[torch.Tensor | None],
    keys: Sequence[object],
    names: Sequence[str],
    identities: Sequence[tuple[int, str | None, str]],
    job: str | None,
) -> list[Incident]:
    """After a mismatch of the combined values: every rank's per-tensor fingerprints (one collective), voted within
    replica classes (collective over ``comm``: every rank calls it)."""
    device = next((local(t).device for t in tensors if t is not None), torch.device("cpu"))
    rows = comm.gather_objects(fingerprint_column(tensors, device).tolist())
    found = vote(kind, step, rows, keys, names, identities, job)
    if not found:  # the combined values differed but no single tensor does: a tensor changed between the reads
        combined = [[hash(tuple(r))] for r in rows]
        found = vote(kind, step, combined, keys, ["<the tensors, read twice>"], identities, job)
    return found


class ReplicaPhases:
    """The guard's cross-replica check, in its two phases: :meth:`column` (every step: one combined fingerprint that
    rides in the gather the guard issues anyway) and :meth:`incidents` (only when the gathered values differ within
    a replica class: one more gather of every tensor's fingerprint, and the vote). Every rank calls both alike."""

    def __init__(
        self,
        comm: Comm,
        keys: Sequence[object],
        names: Sequence[str],
        identities: Sequence[tuple[int, str | None, str]],
        job: str | None,
    ) -> None:
        self.comm = comm
        self.keys = list(keys)
        self.names = list(names)
        self.identities = list(identities)
        self.job = job

    @property
    def active(self) -> bool:
        """Whether any two ranks hold the same data (plain FSDP shards every tensor once: nothing to compare)."""
        return any(self.keys.count(k) > 1 for k in self.keys)

    def column(self, tensors: Sequence[torch.Tensor | None], device: torch.device) -> torch.Tensor:
        """Phase 1: this rank's combined fingerprint of ``tensors``, shape ``(1,)`` int64 on ``device``, no sync."""
        return combine_on_device(fingerprint_column(tensors, device)).reshape(1)

    def incidents(
        self, kind: str, step: int, tensors: Sequence[torch.Tensor | None], gathered: Sequence[int]
    ) -> list[Incident]:
        """Phase 2, from every rank's phase-1 value (``gathered``, group order): nothing when the replicas agree,
        else the per-tensor vote (collective, entered by every rank alike since all hold the same values)."""
        if not odd_ranks(list(gathered), self.keys):
            return []
        return replica_incidents(self.comm, kind, step, tensors, self.keys, self.names, self.identities, self.job)


class GradientReplicaCheck:
    """The cross-replica check of the reduced gradients as a step check (:mod:`sdcguard.training.step_check`, slice
    ``"gradient_replica"``): phase 1 rides in the step's gather; whoever is wrong, a step whose replicas differ is
    not sound, so any difference vetoes it."""

    name = "gradient_replica"

    def __init__(self, phases: ReplicaPhases, reduced: Callable[[], list[torch.Tensor | None]], device: torch.device):
        self.phases = phases
        self.reduced = reduced
        """The gradients the optimizer will read, on this rank (the parallelism's taps say which)."""
        self.device = device
        self._tensors: list[torch.Tensor | None] = []

    def columns(self, state: StepState) -> torch.Tensor:
        self._tensors = self.reduced()
        return self.phases.column(self._tensors, self.device)  # on the device, no sync

    def conclude(self, state: StepState, rows: Sequence[Sequence[int]]) -> CheckResult:
        found = self.phases.incidents(self.name, state.step, self._tensors, [row[0] for row in rows])
        self._tensors = []
        return CheckResult(
            incidents=tuple(found), veto=bool(found), ran="gradient_replica" if self.phases.active else None
        )


def _is_sharded(p: torch.Tensor) -> bool:
    try:
        from torch.distributed.tensor import DTensor, Replicate
    except ImportError:  # pragma: no cover - old torch
        return False
    if isinstance(p, DTensor):
        return not all(isinstance(pl, Replicate) for pl in p.placements)
    return type(p).__name__ == "FlatParameter" or bool(getattr(p, "_is_flat_param", False))


class ReplicaCheck:
    """Exact cross-replica comparison of gradients and weights, attributing a mismatch to rank(s) and a parameter.

    ``check_gradients(step)`` after the gradient reduction (before clipping and the optimizer step);
    ``check_weights(step)`` after the optimizer step, as often as the caller likes. Both are collectives: every
    rank of ``group`` must call them in the same order. Constructing one is a collective too.

    Ranks in incidents are global ranks.
    """

    def __init__(self, model: torch.nn.Module, *, group: Any = None, job: str | None = None) -> None:
        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError("ReplicaCheck needs torch.distributed initialised (init_process_group) first")
        self.module = unwrap(model)
        self.group = group
        self.job = job
        self._comm = Comm(group)
        self.rank = self._comm.index
        self.world_size = self._comm.size
        named: list[tuple[str, torch.nn.Parameter]] = []
        skipped: list[str] = []
        for name, p in self.module.named_parameters():
            if _is_sharded(p) and group is None:
                skipped.append(name)
            else:
                named.append((name, p))
        self.names: tuple[str, ...] = tuple(n for n, _ in named)
        """Parameters compared, in module order."""
        self.skipped: tuple[str, ...] = tuple(skipped)
        """Sharded parameters left out (no explicit replicate group was given)."""
        self._params = [p for _, p in named]
        self._warned_odd = False
        self._device = self._params[0].device if self._params else torch.device("cpu")
        me = (local_device_id(self._device), hostname(), [(n, local(p).numel(), str(p.dtype)) for n, p in named])
        everyone: list[Any] = self._comm.gather_objects(me)
        self.devices: tuple[str, ...] = tuple(e[0] for e in everyone)
        """Device id of every rank of the group, by group rank."""
        self.hosts: tuple[str, ...] = tuple(e[1] for e in everyone)
        # Every rank sees the same gathered list, so a mismatch raises on all ranks alike (no rank left waiting).
        if len({repr(e[2]) for e in everyone}) != 1:
            raise RuntimeError(
                "ReplicaCheck: the ranks hold different parameter sets (names, sizes or dtypes "
                "differ); they are not replicas of each other"
            )
        if skipped:
            warnings.warn(
                f"ReplicaCheck: {len(skipped)} sharded parameter(s) not compared across replicas (pass the "
                f"replicate-dimension group to compare local shards): {', '.join(skipped[:5])}"
                + (" ..." if len(skipped) > 5 else ""),
                stacklevel=2,
            )

    def check_gradients(self, step: int) -> list[Incident]:
        """Compare the reduced gradients across replicas; a missing gradient counts as its own value."""
        return self._check("gradient_replica", step, [p.grad for p in self._params])

    def check_weights(self, step: int) -> list[Incident]:
        """Compare the parameters themselves across replicas (after the optimizer step)."""
        return self._check("weight_replica", step, [p.detach() for p in self._params])

    def gather(self, tensors: Iterable[torch.Tensor | None], extra: Sequence[int] = ()) -> torch.Tensor:
        """All-gathered fingerprints, shape ``(world_size, len(tensors) + len(extra))`` int64, on the host (one
        collective). ``extra``: int64 values each rank contributes alongside (the last columns)."""
        items = list(tensors)
        odd = [n for n, t in zip(self.names, items) if t is not None and not _dense(local(t))]
        if odd and not self._warned_odd:
            warnings.warn(f"ReplicaCheck: not comparing non-dense tensors of {', '.join(odd[:5])}", stacklevel=3)
            self._warned_odd = True
        column = fingerprint_column(items, self._comm.device)
        values = torch.cat([column, torch.tensor(list(extra), dtype=torch.int64, device=self._comm.device)])
        return self._comm.gather_ints(values)

    def _check(self, kind: str, step: int, tensors: list[torch.Tensor | None]) -> list[Incident]:
        rows = self.gather(tensors).tolist()  # the one host sync
        identities = [(g, d, h) for g, d, h in zip(self._comm.members, self.devices, self.hosts)]
        return vote(kind, step, rows, [0] * self.world_size, self.names, identities, self.job)
