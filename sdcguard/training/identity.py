"""Which device this rank computes on, as a fleet device id (the spelling lives in :mod:`sdcguard.devices`), what it
runs (the setup that decides which kernels compute a result: devices of different setups may compute the same
micro-batch differently without any fault), and which job it belongs to: the one rule for a job's id, read by the
guard and by the checkpoints it records (:func:`launcher_job_id`)."""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..devices import cpu_id, gpu_id, hostname
from .comm import Comm

__all__ = [
    "local_device_id",
    "setup_key",
    "launcher_job_id",
    "new_job_id",
    "RankIdentity",
    "JobView",
    "introduce",
    "parameter_signature",
]


def local_device_id(device: torch.device | None = None) -> str:
    """Device id of the device this rank computes on.

    CUDA: ``GPU-<uuid>`` from the device properties. CPU: ``cpu:<host>:<core>`` where core is the lowest core of
    this process's affinity mask when the process is pinned to a subset of the cores; an unpinned process has no
    core of its own, so its local rank (``LOCAL_RANK``, else the global rank, else 0) stands in for it.
    """
    if device is not None and device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return gpu_id(str(torch.cuda.get_device_properties(index).uuid))
    affinity = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set()
    if affinity and len(affinity) < (os.cpu_count() or len(affinity) + 1):
        return cpu_id(min(affinity))
    local = os.environ.get("LOCAL_RANK")
    if local is None:
        local = str(dist.get_rank()) if dist.is_available() and dist.is_initialized() else "0"
    return cpu_id(int(local))


def setup_key(device: torch.device | None = None) -> tuple[str, ...]:
    """What decides the kernels this rank runs: torch's version, the device model with its compute capability, CUDA
    and cuDNN versions on a GPU, the CPU's vector instruction set on a CPU (torch picks kernels by it)."""
    if device is not None and device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
        cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
        return (torch.__version__, props.name, f"sm_{props.major}{props.minor}", str(torch.version.cuda), str(cudnn))
    return (torch.__version__, "cpu", torch.backends.cpu.get_cpu_capability())


def launcher_job_id() -> str | None:
    """The launcher's job id when it is a real one: torchelastic's run id (torchrun sets the placeholder ``"none"``
    on a multi-node launch without ``--rdzv-id``, which is no id), else Slurm's job id. None when neither is set."""
    run = os.environ.get("TORCHELASTIC_RUN_ID")
    if run and run.strip().lower() not in ("none", ""):
        return run
    return os.environ.get("SLURM_JOB_ID") or None


def new_job_id() -> str:
    """An id for a job whose launcher gave none (made on one rank and shared in the guard's first gather)."""
    return f"sdcguard-{uuid.uuid4().hex[:16]}"


@dataclass(frozen=True, kw_only=True)
class RankIdentity:
    """What a rank tells the others when the guard starts (its part of the guard's first gather)."""

    device: str | None
    """Its device id (:func:`local_device_id`)."""
    host: str
    replica_key: Hashable
    """Its key in each replica class of the parameters (:func:`~.mesh.replica_classes`): ranks with equal keys in a
    class hold the same data of that class."""
    setup: tuple[str, ...]
    """What decides its kernels (:func:`setup_key`)."""
    coords: tuple[tuple[str, int], ...] = ()
    """Its coordinate on each named dimension of the job's device mesh (:mod:`.mesh`); empty without one."""
    params: str = ""
    """What parameters it holds (their names, local shapes and dtypes, hashed): replicas hold the same."""
    job: str
    """The job id it would give the job (the first rank's is the job's)."""


@dataclass(frozen=True)
class JobView:
    """Every rank's identity, by global rank, as every rank holds it after :func:`introduce`."""

    ranks: dict[int, RankIdentity]
    order: tuple[int, ...]
    """The global ranks in the order of the gather's group."""

    @property
    def job(self) -> str:
        """The job's id: the one the group's first rank gave."""
        return self.ranks[self.order[0]].job

    @property
    def identities(self) -> dict[int, tuple[str | None, str]]:
        """Global rank -> (device id, host)."""
        return {g: (r.device, r.host) for g, r in self.ranks.items()}

    @property
    def coordinates(self) -> dict[int, tuple[tuple[str, int], ...]]:
        """Global rank -> its mesh coordinates."""
        return {g: r.coords for g, r in self.ranks.items()}

    @property
    def setups(self) -> dict[int, tuple[str, ...]]:
        """Global rank -> what its device runs."""
        return {g: r.setup for g, r in self.ranks.items()}

    def keys(self, members: Sequence[int]) -> list[tuple[Hashable, ...]]:
        """The replica keys (one per class) of ``members`` (global ranks), in their order; a rank without any (a
        dedicated shadow) has none."""
        out: list[tuple[Hashable, ...]] = []
        for g in members:
            key = self.ranks[g].replica_key
            out.append(tuple(key) if isinstance(key, tuple) else (key,))
        return out


def parameter_signature(named: Sequence[tuple[str, torch.Tensor]]) -> str:
    """The names, local shapes and dtypes of a rank's parameters, hashed."""
    text = ";".join(f"{n}:{tuple(p.shape)}:{p.dtype}" for n, p in named)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def introduce(
    comm: Comm,
    device: torch.device,
    replica_key: Hashable,
    job: str,
    coords: tuple[tuple[str, int], ...] = (),
    params: str = "",
) -> JobView:
    """Every member's identity (collective over ``comm``: one gather, when the guard starts)."""
    me = RankIdentity(
        device=local_device_id(device),
        host=hostname(),
        replica_key=replica_key,
        setup=setup_key(device),
        job=job,
        coords=coords,
        params=params,
    )
    everyone: list[RankIdentity] = comm.gather_objects(me)
    return JobView(ranks=dict(zip(comm.members, everyone)), order=tuple(comm.members))
