"""Exact fingerprints of the raw bits of a tensor, computed on the tensor's own device.

``fingerprint(x)`` is a 64-bit value of the raw bytes of a torch tensor, numpy or cupy array (any device, dtype,
stride): any single changed bit always changes it, and so does a swap of two unequal elements inside one 64 KiB
chunk; the same bits give the same value on every device and backend. The definition and what is proven about it:
:mod:`.definition`.

Implementation: :mod:`.cpu` (numpy arrays and torch CPU tensors, read in place by a C engine or numpy's loops),
:mod:`.tensors` (torch tensors on any device, left on the device), :mod:`.cuda` (one fused pass of
``kernels/fingerprint/chunk_sums.cu`` for torch CUDA tensors and cupy arrays), :mod:`.blocks` (the bytes of a
strided input, staged block by block on its own device, never on the host).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import Unfingerprintable
from .cpu import StreamingFingerprint, cpu_copy_fingerprints, cpu_fingerprints
from .cuda import cupy_fingerprint_device
from .definition import CHUNK_WORDS, combine, signed64, unsigned64
from .tensors import (
    check_torch,
    combine_on_device,
    fingerprint_on_device,
    fingerprints_on_device,
    is_dtensor_type,
    is_torch_tensor,
    is_wrapper_type,
    local_tensor,
)

__all__ = [
    "fingerprint",
    "fingerprint_many",
    "copy_and_fingerprint",
    "fingerprints_on_device",
    "local_tensor",
    "is_wrapper_type",
    "is_dtensor_type",
    "combine",
    "combine_on_device",
    "signed64",
    "unsigned64",
    "CHUNK_WORDS",
    "StreamingFingerprint",
]


def fingerprint(x: Any) -> int:
    """Exact fingerprint (an int in ``[0, 2**64)``) of the raw bits of a torch tensor, numpy or cupy array.

    Computed on the data's own device; the same bits give the same value on every backend. See the module
    definition (:mod:`sdcguard.fingerprints.definition`) and what is guaranteed. A ``DTensor`` is fingerprinted by
    its local shard (what this rank holds: two ranks holding the same shard give the same value); a value whose bits
    cannot be read in place (a sparse, quantized or meta tensor, another tensor subclass) raises
    :class:`~sdcguard.errors.Unfingerprintable`, a ``BadInput``.
    """
    return fingerprint_many([x])[0]


def fingerprint_many(xs: Sequence[Any]) -> list[int]:
    """Fingerprints of many tensors/arrays with one host synchronisation per device (not one per tensor)."""
    results = [0] * len(xs)  # every index is filled below, from exactly one of cpu and pending
    cpu: list[tuple[int, Any]] = []  # numpy arrays and CPU torch tensors: one batched call of the CPU engine
    pending: dict[Any, list[tuple[int, Any]]] = {}  # GPU: fingerprints left on their device until one sync
    for i, x in enumerate(xs):
        if isinstance(x, np.generic):  # a numpy scalar: its bytes, as a 0-d array
            x = np.asarray(x)
        if isinstance(x, np.ndarray):
            _check_np(x)
            cpu.append((i, x))
        elif is_torch_tensor(x):
            x = local_tensor(x)
            check_torch(x)
            if x.device.type == "cpu":
                cpu.append((i, x))
            else:
                pending.setdefault(("torch", x.device), []).append((i, fingerprint_on_device(x)))
        elif type(x).__module__.startswith("cupy"):
            _check_np(x)
            pending.setdefault(("cupy", int(x.device.id)), []).append((i, cupy_fingerprint_device(x)))
        else:
            raise Unfingerprintable(
                f"fingerprint: expected a torch tensor, numpy or cupy array, got {type(x).__name__}"
            )
    for (i, _), v in zip(cpu, cpu_fingerprints([x for _, x in cpu])):
        results[i] = v
    for (kind, _), items in pending.items():
        if kind == "torch":
            import torch

            values = torch.stack([v for _, v in items]).tolist()  # the one host sync for this device
            for (i, _), v in zip(items, values):
                results[i] = unsigned64(v)
        else:
            import cupy

            values = cupy.concatenate([v for _, v in items]).get().tolist()
            for (i, _), v in zip(items, values):
                results[i] = int(v)
    return [int(r) for r in results]


def copy_and_fingerprint(sources: Sequence[Any], destinations: Sequence[Any]) -> list[int]:
    """Copy each source (a numpy array or CPU torch tensor) into its destination (C-contiguous, the same number of
    bytes, in host memory) and return the sources' fingerprints, as :func:`fingerprint_many` would; where a source
    lies in order in memory, the copy and the fingerprint are one pass over it (a staging copy that costs about a
    copy). Device tensors are refused: on a device the fingerprint runs there and the copy is a transfer."""
    for x in (*sources, *destinations):
        if isinstance(x, np.ndarray):
            _check_np(x)
        elif is_torch_tensor(x):
            check_torch(x)
            if x.device.type != "cpu":
                raise Unfingerprintable(f"copy_and_fingerprint: host memory only, got a tensor on {x.device}")
        else:
            raise Unfingerprintable(
                f"copy_and_fingerprint: expected numpy arrays or CPU torch tensors, got {type(x).__name__}"
            )
    return cpu_copy_fingerprints(sources, destinations)


def _check_np(a: Any) -> None:
    if a.dtype.hasobject:
        raise Unfingerprintable("fingerprint: object arrays hold pointers, not data; convert to a numeric dtype first")
