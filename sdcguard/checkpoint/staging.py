"""The host copy of an asynchronous save, and its fingerprints, in one pass over a state that lives in host memory.

An asynchronous save must fingerprint the state before it is copied (the reference the staged copy is checked
against) and then copy it; on a state in host memory those are two passes over every byte on the training
thread, and the first costs about as much as the second. :class:`HostStager` makes them one: each tensor is copied
into a host buffer kept across saves by the C engine, which sums each word into the tensor's fingerprint as it
copies it (:func:`sdcguard.fingerprints.copy_and_fingerprint`). The fingerprint is of the source's bytes as they
were read, and the staged copy is fingerprinted again, separately, in the background: a store that went wrong
still differs there.

It takes a state only when every tensor in it is a plain dense tensor in host memory (:meth:`HostStager.takes`);
anything else (device tensors, ``DTensor`` shards, other tensor subclasses) goes through DCP's own stager after a
fingerprint on the device, where the fingerprint runs at the device's memory speed and the copy is a transfer.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import torch

from ..fingerprints import copy_and_fingerprint
from .record import child_key

__all__ = ["HostStager"]

_PLAIN = (torch.Tensor, torch.nn.Parameter)


def _plain_host(t: torch.Tensor) -> bool:
    return type(t) in _PLAIN and t.device.type == "cpu" and t.layout == torch.strided and not t.is_quantized


class HostStager:
    """Stages a host-memory state into host buffers of its own, fingerprinting every tensor in the same pass.

    ``shared``: the buffers live in shared memory (DCP's checkpoint process reads them); ``cache``: the buffers are
    kept and reused by the next save of a tensor of the same key, shape and dtype (one host copy of the state is
    held between saves), else fresh ones each time.
    """

    def __init__(self, *, shared: bool = False, cache: bool = True) -> None:
        self.shared = shared
        self.cache = cache
        self._buffers: dict[str, torch.Tensor] = {}

    @staticmethod
    def takes(state: Any) -> bool:
        """Whether every tensor of ``state`` (nested mappings, lists and tuples) is a plain dense host tensor."""
        if isinstance(state, torch.Tensor):
            return _plain_host(state)
        if isinstance(state, Mapping):
            return all(HostStager.takes(v) for v in state.values())
        if isinstance(state, (list, tuple)):
            return all(HostStager.takes(v) for v in state)
        return True

    def stage(self, state: Any) -> tuple[Any, dict[str, int]]:
        """The staged copy of ``state`` (the same nesting; every tensor a contiguous host buffer holding its
        values; other leaves deep-copied) and the fingerprint of every source tensor by its record key."""
        pairs: list[tuple[str, torch.Tensor, torch.Tensor]] = []
        staged = self._mirror(state, "", pairs)
        values = copy_and_fingerprint([s.detach() for _, s, _ in pairs], [d for _, _, d in pairs])
        return staged, {k: v for (k, _, _), v in zip(pairs, values)}

    def _mirror(self, obj: Any, prefix: str, pairs: list[tuple[str, torch.Tensor, torch.Tensor]]) -> Any:
        if isinstance(obj, torch.Tensor):
            dst = self._buffer(prefix, obj)
            pairs.append((prefix, obj, dst))
            return dst
        if isinstance(obj, Mapping):
            out: dict[Any, Any] = OrderedDict() if isinstance(obj, OrderedDict) else {}
            for k, v in obj.items():
                out[k] = self._mirror(v, child_key(prefix, k), pairs)
            return out
        if isinstance(obj, (list, tuple)):
            items = [self._mirror(v, child_key(prefix, i), pairs) for i, v in enumerate(obj)]
            return items if isinstance(obj, list) else tuple(items)
        return copy.deepcopy(obj)

    def _buffer(self, key: str, src: torch.Tensor) -> torch.Tensor:
        held = self._buffers.get(key) if self.cache else None
        if held is None or held.shape != src.shape or held.dtype != src.dtype:
            held = torch.empty(src.shape, dtype=src.dtype)
            if self.shared:
                held.share_memory_()
            if self.cache:
                self._buffers[key] = held
        return held

    def close(self) -> None:
        """Release the buffers."""
        self._buffers.clear()
