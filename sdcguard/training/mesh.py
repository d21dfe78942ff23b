"""Where each rank of a job sits in its device mesh, and what the guard compares and replays because of it.

A job's ranks span named mesh dimensions. Along a *data* dimension (``dp``, ``dp_replicate``, ``dp_shard``, ...)
ranks compute different micro-batches; along a *model* dimension (``tp``, ``cp``, expert ``etp``) they compute one
micro-batch together, each its part; along an *expert* dimension (``ep``) they compute different micro-batches for the
dense layers but exchange their tokens (an all-to-all dispatch and combine) with the experts each holds. From every
rank's coordinates the guard derives (:func:`build_layout`):

- the **replica classes** of the parameters (:func:`replica_classes`): parameters sharded over the same dimensions
  (``Shard``, FSDP2's ``_StridedShard``, ``Partial``: read from *every* parameter's placements) form one class, and a
  rank's key in a class is its coordinates on those dimensions. Ranks with equal keys hold the same local data of
  the class, so their reduced gradients and weights must agree bit for bit: along the replicate dimension of HSDP,
  the data-parallel dimension of a tensor-parallel model, every rank under DDP; and a weight replicated across the
  tensor-parallel group (a norm) is compared across that group too. A parameter that is a plain tensor in a
  ``DTensor`` model is taken to be replicated everywhere, as ``parallelize_module`` leaves it;
- the **slices**: ranks with the same coordinates on every model dimension (the same tensor-parallel shard of the
  computation). A slice is a data-parallel group: its ranks replay each other's micro-batches, each rank comparing
  its local gradients with those of the rank holding the same shard;
- the **units**: ranks with the same coordinates on every data dimension (a tensor-, context- or expert-parallel
  group). They compute together, collectives included, so they replay together: position ``i`` of every slice is one
  unit, and a slice's ``i``-th rank replays in lockstep with the ``i``-th rank of every other slice. An EP group's
  ranks each replay their counterpart's micro-batch of another EP group, its all-to-alls among themselves.

Expert parameters are ``DTensor`` parameters sharded over ``ep``, so their replica class holds the ranks with the same
``ep`` coordinate (their expert-data-parallel replicas), while dense parameters are compared over every data rank,
``ep`` included. Dense weights are replicated along ``cp``: its ranks are witnesses of each other's weights.

Without a mesh (DDP, one process) the job is one slice and every rank its own unit; an unnamed mesh (FSDP2's default)
is data-parallel in every dimension. Along a pipeline dimension (``pp``) ranks hold different stages: each stage's
data-parallel replicas are a slice of their own (compared, and replaying each other's stage micro-batches), and a
unit never spans two stages (a stage's replay is fed the stage input and output gradient it captured).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import BadInput
from ..fingerprints import is_dtensor_type
from .comm import Comm

__all__ = [
    "DATA_DIMS",
    "MODEL_DIMS",
    "EXPERT_DIMS",
    "UNIT_DIMS",
    "STAGE_DIMS",
    "Coordinates",
    "Layout",
    "mesh_ranks",
    "mesh_coordinates",
    "replica_classes",
    "build_layout",
    "check_mesh_group",
]

DATA_DIMS = frozenset(
    {
        "dp",
        "dp_replicate",
        "dp_shard",
        "dp_shard_cp",
        "dp_cp",
        "fsdp",
        "hsdp",
        "ddp",
        "replicate",
        "shard",
        "data_parallel",
        "efsdp",
        "edp",
    }
)
"""Dimension names along which ranks compute different micro-batches (torchtitan's, Accelerate's and Lightning's)."""
MODEL_DIMS = frozenset({"tp", "cp", "tensor_parallel", "context_parallel", "etp"})
"""Dimension names along which ranks compute one micro-batch together (tensor, context and expert-tensor
parallelism)."""
STAGE_DIMS = frozenset({"pp", "pipeline_parallel"})
"""Dimension names of pipeline stages: ranks along them hold different layers (each stage's replicas are compared
and replay each other, stage by stage; a stage's replay needs no other stage)."""
EXPERT_DIMS = frozenset({"ep", "expert_parallel"})
"""Dimension names of expert parallelism: different micro-batches, one replay unit (see the module docstring)."""
UNIT_DIMS = MODEL_DIMS | EXPERT_DIMS
_WORDS = {
    "cp": "context-parallel",
    "context_parallel": "context-parallel",
    "ep": "expert-parallel",
    "expert_parallel": "expert-parallel",
}

Coordinates = tuple[tuple[str, int], ...]
"""``(dimension name, coordinate)`` pairs, sorted by name."""


def _named_dims(mesh: Any) -> list[str]:
    """The mesh's dimension names; an unnamed mesh (FSDP2's default one) is data-parallel in every dimension."""
    names = getattr(mesh, "mesh_dim_names", None)
    return list(names) if names else [f"dp{i}" if i else "dp" for i in range(mesh.ndim)]


def _check_dim(name: str) -> None:
    if name not in DATA_DIMS | UNIT_DIMS | STAGE_DIMS and not name.startswith("dp"):
        raise BadInput(
            f"unknown mesh dimension {name!r}: name data-parallel dimensions one of {sorted(DATA_DIMS)}, "
            f"model-parallel ones one of {sorted(MODEL_DIMS)}, expert ones one of {sorted(EXPERT_DIMS)} and pipeline "
            f"ones one of {sorted(STAGE_DIMS)}"
        )


def _meshes(params: Iterable[torch.Tensor]) -> list[Any]:
    out: list[Any] = []
    for p in params:
        mesh = getattr(p, "device_mesh", None)
        if mesh is not None and all(mesh is not m for m in out):
            out.append(mesh)
    return out


def mesh_ranks(params: Sequence[torch.Tensor], mesh: Any = None) -> list[int] | None:
    """The global ranks of the job's whole device mesh: ``mesh``'s, or the root mesh of the parameters' meshes
    (a tensor-parallel parameter lives on the ``tp`` sub-mesh of the job's mesh); None without a mesh."""
    meshes = [mesh] if mesh is not None else _meshes(params)
    if not meshes:
        return None
    root = meshes[0]
    get_root = getattr(root, "_get_root_mesh", None)  # torch keeps the mesh a sub-mesh was sliced from
    if mesh is None and callable(get_root):
        root = get_root() or root
    return sorted(int(r) for r in root.mesh.reshape(-1).tolist())


def mesh_coordinates(params: Sequence[torch.Tensor], mesh: Any = None) -> Coordinates:
    """This rank's coordinate on every named dimension of ``mesh``, or (without one) of the meshes the parameters'
    ``DTensor``\\ s live on; ``()`` when there is no mesh at all."""
    meshes = [mesh] if mesh is not None else _meshes(params)
    coords: dict[str, int] = {}
    for m in meshes:
        names = _named_dims(m)
        for name, c in zip(names, m.get_coordinate() or (), strict=True):
            _check_dim(name)
            if coords.setdefault(name, int(c)) != int(c):
                raise BadInput(f"the meshes of the model's parameters place this rank at two coordinates of {name!r}")
    return tuple(sorted(coords.items()))


def _sharded_on(p: torch.Tensor) -> Coordinates:
    """This rank's coordinates on the dimensions along which ``p`` is not replicated (``()``: a plain tensor)."""
    mesh, placements = getattr(p, "device_mesh", None), getattr(p, "placements", None)
    if mesh is None or placements is None:
        return ()
    coords = mesh.get_coordinate() or ()
    return tuple(
        sorted(
            (n, int(c)) for n, c, pl in zip(_named_dims(mesh), coords, placements, strict=True) if not pl.is_replicate()
        )
    )


def replica_classes(params: Sequence[torch.Tensor]) -> tuple[list[int], tuple[Coordinates, ...]]:
    """The parameters' replica classes: parameters sharded over the same dimensions form one class (in order of
    first appearance), and a rank's key in a class is its coordinates on those dimensions (see the module
    docstring). Returns each parameter's class and this rank's key in each class; one class, key ``()``, for plain
    tensors. Ranks with equal keys in a class hold the same local data of that class's parameters."""
    dims: list[tuple[str, ...]] = []
    keys: list[Coordinates] = []
    classes = []
    for p in params:
        key = _sharded_on(p)
        sig = tuple(n for n, _ in key)
        if sig not in dims:
            dims.append(sig)
            keys.append(key)
        classes.append(dims.index(sig))
    return classes, tuple(keys)


@dataclass(frozen=True)
class Layout:
    """The job's ranks as the guard groups them (see the module docstring); identical on every rank."""

    ranks: tuple[int, ...]
    """The job's global ranks, in the order of the guard's per-step gather."""
    slices: tuple[tuple[int, ...], ...]
    """Data-parallel groups of ranks holding the same model-parallel part (and pipeline stage), each in
    data-coordinate order."""
    meshed: bool = False
    """Whether the job has a model-parallel or pipeline dimension (more than one slice)."""
    units: tuple[tuple[int, ...], ...] = ()
    """Groups of ranks that compute a micro-batch together, collectives included (a tensor-parallel group of one
    pipeline stage); empty: every rank its own unit."""
    stages: bool = False
    """Whether the job has pipeline stages."""
    unit_word: str = "tensor-parallel"
    """What a unit is, as incidents say it: ``tensor-parallel``, ``context-parallel``, ``expert-parallel`` (joined by
    ``x`` when a unit spans several)."""

    def slice_of(self, rank: int) -> tuple[int, ...]:
        """The slice ``rank`` belongs to."""
        return next(s for s in self.slices if rank in s)

    def unit_of(self, rank: int) -> tuple[int, ...]:
        """The ranks that compute ``rank``'s micro-batch with it (itself alone without a model dimension)."""
        return next((u for u in self.units if rank in u), (rank,))

    @property
    def width(self) -> int:
        """Ranks per slice (the data-parallel size)."""
        return len(self.slices[0])


def build_layout(ranks: Sequence[int], coordinates: Mapping[int, Coordinates]) -> Layout:
    """The layout of a job from every rank's :func:`mesh_coordinates` (``ranks``: the job in gather order)."""
    if not any(coordinates.get(g) for g in ranks):
        return Layout(ranks=tuple(ranks), slices=(tuple(ranks),))
    by_slice: dict[Hashable, list[tuple[tuple[int, ...], int]]] = {}
    for g in ranks:
        coords = dict(coordinates.get(g, ()))
        model = tuple(sorted((d, c) for d, c in coords.items() if d in UNIT_DIMS | STAGE_DIMS))
        data = tuple(c for d, c in sorted(coords.items()) if d not in UNIT_DIMS | STAGE_DIMS)
        by_slice.setdefault(model, []).append((data, g))
    slices = tuple(tuple(g for _, g in sorted(members)) for _, members in sorted(by_slice.items()))
    if any(list(s) != sorted(s) for s in slices):
        raise BadInput(
            "the device mesh does not number its ranks in data-parallel order (a row-major mesh, as init_device_mesh "
            "makes, does): sdcguard's data-parallel groups follow the ranks' order"
        )
    datas = {tuple(sorted(d for d, _ in members)) for members in by_slice.values()}
    if len({len(s) for s in slices}) != 1 or len(datas) != 1:
        raise BadInput(
            "the device mesh is not regular: every tensor-parallel position must have the same data-parallel ranks"
        )
    by_unit: dict[Hashable, list[int]] = {}
    for g in ranks:  # a unit: one data coordinate and one pipeline stage
        coords = dict(coordinates.get(g, ()))
        by_unit.setdefault(tuple(sorted((d, c) for d, c in coords.items() if d not in UNIT_DIMS)), []).append(g)
    units = tuple(tuple(sorted(u)) for u in by_unit.values() if len(u) > 1)
    dims = {d for g in ranks for d, _ in coordinates.get(g, ())}
    stages = bool(dims & STAGE_DIMS)
    spans = {_WORDS.get(d, "tensor-parallel") for d in dims & UNIT_DIMS}
    word = " x ".join(sorted(spans)) if spans else "tensor-parallel"
    return Layout(ranks=tuple(ranks), slices=slices, meshed=len(slices) > 1, units=units, stages=stages, unit_word=word)


def check_mesh_group(
    group: Any, members: Sequence[int], params: Sequence[torch.Tensor], width: int, reduced: bool, expert: bool = False
) -> None:
    """With a device mesh: ``group`` (when given) is this rank's data-parallel group (``members``), and a
    tensor-parallel model with data parallelism reduces its gradients with FSDP2 (``reduced``: FSDP2 or the user's
    DDP; DDP cannot wrap DTensor parameters). An expert-parallel job (``expert``) reduces its own: dense gradients
    over every data rank, each expert's over its replicas, as torchtitan's and Megatron's do."""
    if group is not None and sorted(Comm(group).members) != sorted(members):
        raise BadInput(
            f"group holds ranks {sorted(Comm(group).members)}, but this rank's data-parallel replicas in the "
            f"device mesh are {sorted(members)}: pass the mesh's data-parallel group, or none"
        )
    if any(is_dtensor_type(type(p)) for p in params) and width > 1 and not reduced and not expert:
        raise BadInput(
            f"a tensor-parallel model with {width} data-parallel replicas needs FSDP2 over the data-parallel dimension "
            "(fully_shard(model, mesh=mesh['dp'])) to reduce its gradients; the guard does not wrap DTensor "
            "parameters in DDP"
        )
