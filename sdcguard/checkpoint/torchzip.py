"""A tensor written by ``torch.save`` (DCP stores each tensor so), read without ``torch.load``'s copy.

``torch.save`` writes a zip of stored (uncompressed) entries: ``data.pkl``, a small pickle saying which storage
holds the tensor and its dtype, size, stride and offset, then a few small entries, then ``data/<key>``, the raw
bytes. ``head`` reads the local headers at the start of the item (the first piece read of it is enough) and says
where the raw bytes lie and whether they are the tensor's bytes in logical order (contiguous, offset 0): then a
scrub fingerprints them as they stream past. ``view_tensor`` parses a whole item (its central directory) and
returns a tensor over the buffer's own bytes, for the other layouts. The pickle is read by an unpickler that
accepts only the few names ``torch.save`` uses for one plain tensor. Anything else (zip64, data descriptors, a
big-endian file, an empty tensor) returns None and the caller falls back to ``torch.load``.
"""

from __future__ import annotations

import io
import pickle
import struct
import warnings
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["view_tensor", "head", "Head"]

_EOCD = b"PK\x05\x06"
_CENTRAL = 0x02014B50
_LOCAL = 0x04034B50


def _entries(buf: memoryview) -> dict[str, tuple[int, int]] | None:
    """name -> (data start, size) of every stored entry; None for what this reader does not handle."""
    tail = bytes(buf[max(0, len(buf) - 65557) :])
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
        (method,) = struct.unpack_from("<H", buf, pos + 10)
        csize, usize, nlen, xlen, clen = struct.unpack_from("<IIHHH", buf, pos + 20)
        (local,) = struct.unpack_from("<I", buf, pos + 42)
        name = bytes(buf[pos + 46 : pos + 46 + nlen]).decode("utf-8", "replace")
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


class _StorageKind:
    """What the scrub needs of a pickled typed storage class: its dtype."""

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype


class _Spec:
    def __init__(self, key: str, dtype: torch.dtype, count: int) -> None:
        self.key, self.dtype, self.count = key, dtype, count


def _rebuild(storage: _Spec, offset: int, size: tuple[int, ...], stride: tuple[int, ...], *rest: Any) -> Any:
    return storage, offset, tuple(size), tuple(stride)


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return _rebuild
        if (module, name) == ("collections", "OrderedDict"):
            return OrderedDict
        if module == "torch" and name.endswith("Storage") and name != "UntypedStorage":
            # A typed storage class (torch.FloatStorage) stands for its dtype here; reading the class's dtype
            # raises TypedStorage's deprecation warning, which is torch's business, not the scrub's output.
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                return _StorageKind(getattr(torch, name).dtype)
        raise pickle.UnpicklingError(f"{module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise pickle.UnpicklingError("not a storage")
        return _Spec(str(pid[2]), pid[1].dtype, int(pid[4]))


@dataclass(frozen=True)
class Head:
    """Where a saved tensor's raw bytes lie in its item, and whether they are its bytes in logical order."""

    start: int
    nbytes: int
    in_order: bool


def head(first: memoryview) -> Head | None:
    """The raw bytes' place, from the first bytes of an item; None when they do not say (read the whole item).

    ``torch.save`` streams its entries (sizes in data descriptors after each entry, not in the local headers), so
    the walk goes: ``data.pkl`` ends where its pickle stops; a small entry (a version, the byte order) ends at the
    next ``PK`` signature; the raw bytes' size is the storage's element count times its element size. A caller
    must treat a mismatch found through this walk as a reason to re-read the item the slow way, never as proof.
    """
    pos, described, little = 0, None, False
    while pos + 30 <= len(first):
        sig, _, flags, method = struct.unpack_from("<IHHH", first, pos)
        nlen, xlen = struct.unpack_from("<HH", first, pos + 26)
        if sig != _LOCAL or method != 0:
            return None
        name = bytes(first[pos + 30 : pos + 30 + nlen]).decode("utf-8", "replace").split("/", 1)[-1]
        data = pos + 30 + nlen + xlen
        if described is not None and name == f"data/{described[0].key}":
            spec, offset, size, stride, count = described
            itemsize = torch.empty((), dtype=spec.dtype).element_size()
            numel, expected, step = 1, [], 1
            for n in reversed(size):
                expected.append(step)
                step *= n
                numel *= n
            in_order = (
                little
                and offset == 0
                and numel == count
                and numel > 0
                and all(n == 1 or st == e for n, st, e in zip(size, stride, reversed(expected)))
            )
            return Head(start=data, nbytes=count * itemsize, in_order=in_order)
        if name == "data.pkl":
            stream = io.BytesIO(bytes(first[data:]))
            try:
                spec, offset, size, stride = _Unpickler(stream).load()
            except Exception:
                return None
            if not isinstance(spec, _Spec):
                return None
            described = (spec, offset, size, stride, spec.count)
            end = data + stream.tell()
        else:
            end = bytes(first[data : data + 4096]).find(b"PK")
            if end < 0:
                return None
            if name == "byteorder":
                little = bytes(first[data : data + end]) == b"little"
            end += data
        nxt = bytes(first[end : end + 4096]).find(b"PK\x03\x04")
        if nxt < 0:
            return None
        pos = end + nxt
    return None


def view_tensor(buf: memoryview) -> torch.Tensor | None:
    """The tensor ``torch.save`` wrote into ``buf``, sharing ``buf``'s memory; None when not handled here."""
    entries = _entries(buf)
    if entries is None or "data.pkl" not in entries:
        return None
    if "byteorder" in entries:
        start, n = entries["byteorder"]
        if bytes(buf[start : start + n]) != b"little":
            return None
    start, n = entries["data.pkl"]
    try:
        spec, offset, size, stride = _Unpickler(io.BytesIO(bytes(buf[start : start + n]))).load()
    except Exception:
        return None
    if not isinstance(spec, _Spec):
        return None
    if f"data/{spec.key}" not in entries:
        return None
    start, n = entries[f"data/{spec.key}"]
    itemsize = torch.empty((), dtype=spec.dtype).element_size()
    if n == 0 or n % itemsize:
        return None
    flat = torch.frombuffer(buf[start : start + n], dtype=torch.uint8).view(spec.dtype)
    needed = offset + sum((s - 1) * st for s, st in zip(size, stride)) + 1 if all(size) else 0
    if needed > flat.numel():
        return None
    return flat.as_strided(size, stride, offset)
