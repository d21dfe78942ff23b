"""A tensor written by ``torch.save`` (DCP stores each tensor so), viewed in place in a byte buffer.

``torch.load`` copies the tensor's data out of the buffer; a scrub only needs to read it once. ``view_tensor``
parses the zip container (stored entries, no compression: what ``torch.save`` writes), reads the small pickle that
describes the tensor with an unpickler that accepts only the few names ``torch.save`` uses for one plain tensor, and
returns a tensor over the buffer's own bytes (its dtype, size, stride and offset). Anything else (zip64, another
layout, a big-endian file, an empty tensor) returns None and the caller falls back to ``torch.load``.
"""

from __future__ import annotations

import io
import pickle
import struct
from collections import OrderedDict
from typing import Any

import torch

__all__ = ["view_tensor"]

_EOCD = b"PK\x05\x06"
_CENTRAL = 0x02014B50
_LOCAL = 0x04034B50


def _entries(buf: memoryview) -> dict[str, tuple[int, int]] | None:
    """name -> (data start, size) of every stored entry; None for what this reader does not handle."""
    tail = bytes(buf[max(0, len(buf) - 65557):])
    at = tail.rfind(_EOCD)
    if at < 0:
        return None
    count, size, start = struct.unpack_from("<HII", tail, at + 10)
    if start == 0xFFFFFFFF or count == 0xFFFF:
        return None  # zip64
    out: dict[str, tuple[int, int]] = {}
    pos = start
    for _ in range(count):
        if pos + 46 > len(buf) or struct.unpack_from("<I", buf, pos)[0] != _CENTRAL:
            return None
        method, = struct.unpack_from("<H", buf, pos + 10)
        csize, usize, nlen, xlen, clen = struct.unpack_from("<IIHHH", buf, pos + 20)
        local, = struct.unpack_from("<I", buf, pos + 42)
        name = bytes(buf[pos + 46:pos + 46 + nlen]).decode("utf-8", "replace")
        if method != 0 or csize != usize or local == 0xFFFFFFFF or csize == 0xFFFFFFFF:
            return None
        if local + 30 > len(buf) or struct.unpack_from("<I", buf, local)[0] != _LOCAL:
            return None
        lnlen, lxlen = struct.unpack_from("<HH", buf, local + 26)
        data = local + 30 + lnlen + lxlen
        if data + usize > len(buf):
            return None
        out[name.split("/", 1)[-1]] = (data, usize)
        pos += 46 + nlen + xlen + clen
    return out


class _Spec:
    def __init__(self, key: str, dtype: torch.dtype) -> None:
        self.key, self.dtype = key, dtype


def _rebuild(storage: _Spec, offset: int, size: tuple[int, ...], stride: tuple[int, ...], *rest: Any) -> Any:
    return storage, offset, tuple(size), tuple(stride)


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return _rebuild
        if (module, name) == ("collections", "OrderedDict"):
            return OrderedDict
        if module == "torch" and name.endswith("Storage") and name != "UntypedStorage":
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"{module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise pickle.UnpicklingError("not a storage")
        return _Spec(str(pid[2]), pid[1].dtype)


def view_tensor(buf: memoryview) -> torch.Tensor | None:
    """The tensor ``torch.save`` wrote into ``buf``, sharing ``buf``'s memory; None when not handled here."""
    entries = _entries(buf)
    if entries is None or "data.pkl" not in entries:
        return None
    if "byteorder" in entries:
        start, n = entries["byteorder"]
        if bytes(buf[start:start + n]) != b"little":
            return None
    start, n = entries["data.pkl"]
    try:
        spec, offset, size, stride = _Unpickler(io.BytesIO(bytes(buf[start:start + n]))).load()
    except Exception:
        return None
    if not isinstance(spec, _Spec) or f"data/{spec.key}" not in entries:
        return None
    start, n = entries[f"data/{spec.key}"]
    itemsize = torch.empty((), dtype=spec.dtype).element_size()
    if n == 0 or n % itemsize:
        return None
    flat = torch.frombuffer(buf[start:start + n], dtype=torch.uint8).view(spec.dtype)
    needed = offset + sum((s - 1) * st for s, st in zip(size, stride)) + 1 if all(size) else 0
    if needed > flat.numel():
        return None
    return flat.as_strided(size, stride, offset)
