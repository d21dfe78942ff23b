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
from ..fingerprints import combine_on_device, fingerprints_on_device, is_dtensor_type, local_tensor
from ..records import Incident
from .comm import Comm
from .hooks.ddp import unwrap
from .identity import local_device_id
from .step_check import CheckResult, StepState

__all__ = [
    "GradientReplicaCheck",
    "WeightCheck",
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
PARTIAL = 2
"""The value standing for a ``DTensor`` still ``Partial`` (a SequenceParallel norm's gradient, whose reduction the
optimizer's own DTensor op makes): a rank's local part is a partial sum, no replica's value. Replay checks it."""


def _partial(t: torch.Tensor) -> bool:
    return is_dtensor_type(type(t)) and any(pl.is_partial() for pl in getattr(t, "placements", ()))


def _dense(t: torch.Tensor) -> bool:
    return t.layout == torch.strided and not t.is_quantized and t.device.type != "meta"


def fingerprint_column(tensors: Sequence[torch.Tensor | None], device: torch.device) -> torch.Tensor:
    """One int64 per tensor on ``device`` (no host synchronisation): its fingerprint, :data:`NO_GRADIENT` for None,
    :data:`NOT_DENSE` for a tensor that has no raw bits (raising on one rank would leave the others waiting),
    :data:`PARTIAL` for a ``DTensor`` not yet reduced."""
    marks = [NO_GRADIENT if t is None else PARTIAL if _partial(t) else NOT_DENSE for t in tensors]
    items = [None if t is None or m == PARTIAL else local_tensor(t) for t, m in zip(tensors, marks)]
    dense = [t is not None and _dense(t) for t in items]
    out = torch.tensor(marks, dtype=torch.int64, device=device)
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
    tensor_keys: Sequence[Sequence[object]] | None = None,
) -> list[Incident]:
    """Incidents for the tensors that differ within replica classes.

    ``rows``: per rank (group order), one fingerprint per tensor (``names``); ``identities``: per rank, its global
    rank, device id and host. Ranks with equal ``keys`` entries are replicas (``tensor_keys[j]``: the keys by rank of
    tensor ``j`` when the tensors' replica classes differ, as under tensor parallelism, where a weight replicated
    across the tensor-parallel group has more replicas than a sharded one). One incident per class in which
    something differs, in the order of the classes' first ranks; with ``tensor_keys``, one incident in all (a
    corrupted weight of one class reaches the others' tensors through the collectives).
    """
    found: dict[tuple[int, ...], tuple[set[int], list[str], list[bool]]] = {}
    for j, name in enumerate(names):
        groups: dict[object, list[int]] = {}
        for i, k in enumerate(tensor_keys[j] if tensor_keys is not None else keys):
            groups.setdefault(k, []).append(i)
        for members in groups.values():
            odd = minority([rows[m][j] for m in members])
            if odd:
                suspects, differing, undecided = found.setdefault(tuple(members), (set(), [], [False]))
                differing.append(name)
                suspects.update(members[x] for x in odd)
                undecided[0] |= len(odd) == len(members)
    if tensor_keys is not None and len(found) > 1:
        # Several classes (tensor parallelism): a corrupted replicated weight reaches the other classes' tensors
        # through the collectives, so what they say of one step is one incident naming every suspect.
        merged = (
            set().union(*(s for s, _, _ in found.values())),
            [n for _, d, _ in found.values() for n in d],
            [any(u[0] for _, _, u in found.values())],
        )
        found = {tuple(sorted({m for cls in found for m in cls})): merged}
    what = "gradients" if kind == "gradient_replica" else "weights"
    out = []
    for cls, (suspects, differing, undecided) in sorted(found.items()):
        ranks = sorted(suspects)
        g = tuple(identities[r][0] for r in ranks)
        more = f" and {len(differing) - 1} more" if len(differing) > 1 else ""
        settled = (
            "no strict majority: every disagreeing rank is a suspect"
            if undecided[0]
            else f"outvoted by a strict majority of the {len(cls)} replicas"
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
    tensor_keys: Sequence[Sequence[object]] | None = None,
) -> list[Incident]:
    """After a mismatch of the combined values: every rank's per-tensor fingerprints (one collective), voted within
    replica classes (collective over ``comm``: every rank calls it; ``tensor_keys`` as :func:`vote` takes them)."""
    device = next((local_tensor(t).device for t in tensors if t is not None), torch.device("cpu"))
    gathered: list[tuple[tuple[str, ...], list[int]]] = comm.gather_objects(
        (tuple(names), fingerprint_column(tensors, device).tolist())
    )
    # Ranks holding other tensors (other pipeline stages) are voted apart, each set with its own names.
    sets: dict[tuple[str, ...], list[int]] = {}
    for i, (their_names, _) in enumerate(gathered):
        sets.setdefault(their_names, []).append(i)
    found: list[Incident] = []
    for their_names, ranks in sets.items():
        rows = [gathered[i][1] for i in ranks]
        ks, ids = [keys[i] for i in ranks], [identities[i] for i in ranks]
        tks = (
            None if tensor_keys is None or their_names != tuple(names) else [[k[i] for i in ranks] for k in tensor_keys]
        )
        found += vote(kind, step, rows, ks, their_names, ids, job, tks)
    if not found:  # the combined values differed but no single tensor does: a tensor changed between the reads
        combined = [[hash(tuple(r))] for _, r in gathered]
        widest = keys if tensor_keys is None else tensor_keys[0]
        found = vote(kind, step, combined, widest, ["<the tensors, read twice>"], identities, job)
    return found


class ReplicaPhases:
    """The guard's cross-replica check, in its two phases: :meth:`column` (every step: one combined fingerprint per
    replica class of tensors, riding in the gather the guard issues anyway) and :meth:`incidents` (only when the
    gathered values differ within a replica class: one more gather of every tensor's fingerprint, and the vote).
    Every rank calls both alike.

    ``keys``: per rank (group order), its key in each class; ``classes``: per tensor, its class. Under DDP and FSDP2
    there is one class (every tensor sharded alike); under tensor parallelism a tensor sharded over ``tp`` and one
    replicated across it are in different classes (:func:`sdcguard.training.mesh.replica_classes`)."""

    def __init__(
        self,
        comm: Comm,
        keys: Sequence[Sequence[object]],
        names: Sequence[str],
        identities: Sequence[tuple[int, str | None, str]],
        job: str | None,
        classes: Sequence[int] | None = None,
    ) -> None:
        self.comm = comm
        self.keys = [tuple(k) for k in keys]
        self.names = list(names)
        self.identities = list(identities)
        self.job = job
        self.classes = list(classes) if classes is not None else [0] * len(self.names)
        self.width = max(self.classes, default=-1) + 1
        """Values this check adds to a gather: one per class."""
        self._members = [[j for j, c in enumerate(self.classes) if c == k] for k in range(self.width)]

    def _class_keys(self, c: int) -> list[object]:
        return [k[c] for k in self.keys]

    @property
    def active(self) -> bool:
        """Whether any two ranks hold the same data (plain FSDP shards every tensor once: nothing to compare)."""
        return any(len(set(ks := self._class_keys(c))) < len(ks) for c in range(self.width))

    def column(self, tensors: Sequence[torch.Tensor | None], device: torch.device) -> torch.Tensor:
        """Phase 1: this rank's combined fingerprint of each class of ``tensors``, int64 on ``device``, no sync."""
        fps = fingerprint_column(tensors, device)
        return torch.stack([combine_on_device(fps[m]) for m in self._members]).reshape(-1)

    def incidents(
        self, kind: str, step: int, tensors: Sequence[torch.Tensor | None], gathered: Sequence[Sequence[int]]
    ) -> list[Incident]:
        """Phase 2, from every rank's phase-1 values (``gathered``, group order): nothing when the replicas agree,
        else the per-tensor vote (collective, entered by every rank alike since all hold the same values)."""
        if not any(odd_ranks([row[c] for row in gathered], self._class_keys(c)) for c in range(self.width)):
            return []
        tensor_keys = [self._class_keys(c) for c in self.classes] if self.width > 1 else None
        return replica_incidents(
            self.comm, kind, step, tensors, self._class_keys(0), self.names, self.identities, self.job, tensor_keys
        )


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
        found = self.phases.incidents(self.name, state.step, self._tensors, rows)
        self._tensors = []
        return CheckResult(
            incidents=tuple(found), veto=bool(found), ran="gradient_replica" if self.phases.active else None
        )


class WeightCheck:
    """The weights after the optimizer step, on the guard's schedule, compared across replicas: every parameter,
    frozen ones included (a LoRA or adapter job's frozen base is most of its memory, and a corrupted frozen weight
    is otherwise seen only by replay, on sampled steps). A frozen weight is not compared with its own earlier bits:
    a checkpoint loaded into it changes it legitimately, alike on every replica, which only replicas can tell from
    corruption. Collective over the job: every rank calls :meth:`check` alike."""

    def __init__(
        self, phases: ReplicaPhases, weights: Callable[[], list[torch.Tensor]], frozen: Sequence[torch.Tensor]
    ):
        self.phases = phases
        self.weights = weights
        self.frozen = [t.detach() for t in frozen]

    @property
    def active(self) -> bool:
        """Whether any two ranks hold the same weights."""
        return self.phases.active

    def check(self, step: int) -> list[Incident]:
        """The ``weight_replica`` incidents of this weight check."""
        tensors = [*self.weights(), *self.frozen]
        device = next((local_tensor(t).device for t in tensors), torch.device("cpu"))
        table = self.phases.comm.gather_ints(self.phases.column(tensors, device)).tolist()
        return self.phases.incidents("weight_replica", step, tensors, table)


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
        me = (local_device_id(self._device), hostname(), [(n, local_tensor(p).numel(), str(p.dtype)) for n, p in named])
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
        odd = [n for n, t in zip(self.names, items) if t is not None and not _dense(local_tensor(t))]
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
