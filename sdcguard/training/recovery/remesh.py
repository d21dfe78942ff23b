"""An FSDP2/HSDP module moved onto a new device mesh after a recovery (:class:`~.hsdp.HSDPEngine`): the same module,
the same parameters (the optimizer holds them), its gradients reduced over the new mesh's groups from the next
backward on.

torch 2.13 has no public API for it: ``fully_shard`` can be applied to a module once (``torch.distributed.
_composable.contract``: "Each distinct composable distributed API can only be applied to a module once"), FSDP2
modules refuse ``deepcopy``, and nothing undoes ``fully_shard``. A fresh module built over the new mesh would leave
the loop's optimizer, the guard's hooks and the loop's own references on the old parameters. So this module writes
the mesh into FSDP2's own state, and relies on exactly this (checked before anything is written, refused in one
line where it does not hold):

- each FSDP2 module's state (``FSDPModule._get_fsdp_state()``) keeps its parameter groups in ``_fsdp_param_groups``
  (what :mod:`~sdcguard.training.hooks.fsdp` reads too), each with ``mesh_info`` and ``post_forward_mesh_info``
  and its ``fsdp_params``;
- a parameter group reads its process groups from ``mesh_info`` at every collective (``HSDPMeshInfo``'s
  ``shard_process_group`` and ``replicate_process_group``), and the gradient's divide factor from those groups' sizes;
- each ``FSDPParam`` builds its sharded parameter and every sharded gradient as a ``DTensor`` of
  ``_sharding_spec`` (the mesh, the placements, the global shape), and keeps ``mesh_info``,
  ``post_forward_mesh_info`` and ``_spmd_mesh``; its ``sharded_param`` is the ``nn.Parameter`` the module and the
  optimizer hold, whose ``DTensor`` spec (``_spec``) is replaced by the new one (same placements and shape).

Supported: parameters that were plain tensors before ``fully_shard`` (not tensor-parallel ``DTensor``\\ s), one mesh
for every parameter (no ``shard_placement_fn`` mesh of its own), ``reshard_after_forward`` True or False (not an
int: its post-forward mesh is one more). The new mesh has the old one's dimension names and shard size, and this
rank keeps its shard coordinate, so every local shard stays what it was.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ...errors import BadInput
from ..hooks.fsdp import fsdp_param_groups

__all__ = ["remesh", "check_remeshable"]


def _infos(module: nn.Module) -> list[tuple[Any, Any]]:
    """(parameter group, its ``FSDPParam``\\ s) of every FSDP2 module under ``module``."""
    from torch.distributed.fsdp import FSDPModule

    out = []
    for m in module.modules():
        if isinstance(m, FSDPModule):
            for group in fsdp_param_groups(m):
                out.append((group, list(group.fsdp_params)))
    return out


def check_remeshable(module: nn.Module) -> str | None:
    """Why :func:`remesh` cannot move ``module`` (None: it can; see the module docstring)."""
    from torch.distributed.fsdp._fully_shard._fsdp_common import HSDPMeshInfo

    try:
        groups = _infos(module)
    except AttributeError as e:
        return f"this torch's FSDP2 keeps its state elsewhere ({e})"
    if not groups:
        return "not an FSDP2 module"
    for group, params in groups:
        info = group.mesh_info
        if not isinstance(info, HSDPMeshInfo):
            return f"its mesh is {type(info).__name__}, not HSDP (replicate x shard)"
        if group.post_forward_mesh_info not in (None, info):
            return "reshard_after_forward is an int (a post-forward mesh of its own)"
        for p in params:
            if p.mesh_info is not info or getattr(p, "_spmd_mesh", None) is not info.mesh:
                return "a parameter on a mesh of its own (tensor parallel, or shard_placement_fn)"
            if not hasattr(p, "_sharding_spec") or not hasattr(p.sharded_param, "_spec"):
                return "this torch's FSDPParam keeps its sharding spec elsewhere"
    return None


def remesh(module: nn.Module, mesh: Any) -> None:
    """Move ``module`` (FSDP2/HSDP, :func:`check_remeshable`) onto ``mesh``: the same parameter objects and local
    shards, the groups and ``DTensor`` specs of ``mesh`` (this rank's shard coordinate and the shard size must not
    change). Makes no collective."""
    from torch.distributed.fsdp._fully_shard._fsdp_common import HSDPMeshInfo
    from torch.distributed.tensor._dtensor_spec import DTensorSpec

    why = check_remeshable(module)
    if why is not None:
        raise BadInput(f"cannot move this FSDP2 module onto a new mesh: {why}")
    for group, params in _infos(module):
        old = group.mesh_info
        info = HSDPMeshInfo(mesh, shard_mesh_dim=old.shard_mesh_dim, replicate_mesh_dim=old.replicate_mesh_dim)
        if (info.shard_mesh_size, info.shard_mesh_rank) != (old.shard_mesh_size, old.shard_mesh_rank):
            raise BadInput("the new mesh must keep the shard size and this rank's shard coordinate")
        info.reduce_scatter_process_group = old.reduce_scatter_process_group  # the same shard ranks
        post = info if group.post_forward_mesh_info is old else None
        group.mesh_info, group.post_forward_mesh_info = info, post
        for p in params:
            spec = DTensorSpec(mesh, p._sharding_spec.placements, tensor_meta=p._sharding_spec.tensor_meta)
            p.mesh_info, p.post_forward_mesh_info, p._spmd_mesh, p._sharding_spec = info, post, mesh, spec
            with torch.no_grad():
                p.sharded_param._spec = spec
