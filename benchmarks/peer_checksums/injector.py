"""A standalone fault injector for the aten matmuls of a training step: both tools' worker processes load this file
by its path (:mod:`benchmarks.peer_checksums.worker`), so it imports torch and the standard library only (the peer's
virtualenv has PyPI's ``sdcguard``, not this project).

One Injector, two TorchDispatchModes:
  above(): entered innermost, once the checker under test is on. It sees the ops the model's Python code and
    autograd issue. A checker that is itself a dispatch mode issues its check ops from inside its own
    __torch_dispatch__, i.e. below this mode: they never reach it. It numbers the model's matmuls (mm, addmm, bmm,
    baddbmm; overload "default") 0, 1, 2, ... in the order the step issues them, and marks call number `target`
    (the op and the identity of its arguments) before passing it on.
  below(): entered outermost, before the checker. The marked call reaches it through any checker mode in between;
    it runs the op and changes the result in place before handing it back up, so the checker gets the faulty
    result, as it would from a faulty device. One fault per step: the mark is cleared on the hit, so a
    recomputation by the checker is clean.
A checker that runs its check ops at the model's level (not from a dispatch mode) would be numbered by above()
too: name its files in `skip_files`; a matmul whose Python stack passes through one of them is not numbered
(counted in `foreign`). `ops` is the census of numbered matmuls (op, operand shapes, output shape, pass, kind,
layer): compare a clean step's census under each checker with one without a checker to prove that number k is the
same op everywhere.
"""

from __future__ import annotations

import math
import struct
import sys
from collections.abc import Iterable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["Injector", "MATMULS", "TILE"]

MATMULS = ("mm", "addmm", "bmm", "baddbmm")
COPIES = ("_to_copy", "clone")  # casts of a weight (autocast's, a checker's): still that weight
TILE = 16


def _storage(t: torch.Tensor) -> int | None:
    try:
        return t.untyped_storage().data_ptr()
    except Exception:  # noqa: BLE001
        return None


def _bits(value: float, dtype: torch.dtype) -> int:
    b = struct.unpack("<I", struct.pack("<f", value))[0]
    return b >> 16 if dtype == torch.bfloat16 else b


def _value(bits: int, dtype: torch.dtype) -> float:
    return struct.unpack("<f", struct.pack("<I", bits << 16 if dtype == torch.bfloat16 else bits))[0]


def _same(x: float, y: float) -> bool:
    return x == y or (math.isnan(x) and math.isnan(y))


class Injector:
    """target: the number of the model matmul to corrupt (None: count only). fault: {"kind": "bit" | "zero" | "nan"
    | "tile-scale" | "tile-sign", "element": [...], "bit": int, "factor": float}. weights: {storage address:
    parameter name} (names the layer; an operand that is a weight, or a cast of one, makes a backward matmul dX)."""

    def __init__(
        self,
        target: int | None = None,
        fault: dict[str, Any] | None = None,
        weights: dict[int, str] | None = None,
        skip_files: Iterable[str] = (),
    ) -> None:
        self.target = target
        self.fault = dict(fault or {})
        self.weights = dict(weights or {})
        self.skip_files = frozenset(skip_files)
        self.ops: list[dict[str, Any]] = []
        self.held: list[torch.Tensor] = []
        self.foreign = 0
        self.record: dict[str, Any] | None = None
        self._marked: tuple[Any, tuple[int, ...]] | None = None

    def above(self) -> _Above:
        return _Above(self)

    def below(self) -> _Below:
        return _Below(self)

    def _issued_by_checker(self) -> bool:
        if not self.skip_files:
            return False
        f: Any = sys._getframe(2)
        while f is not None:
            if f.f_code.co_filename in self.skip_files:
                return True
            f = f.f_back
        return False

    def _describe(self, name: str, args: tuple[Any, ...]) -> dict[str, Any]:
        a, b = (args[0], args[1]) if name in ("mm", "bmm") else (args[1], args[2])
        where = next((self.weights[s] for s in (_storage(a), _storage(b)) if s in self.weights), None)
        kind = "linear" if name in ("mm", "addmm") else "bmm"
        if torch._C._current_graph_task_id() == -1:
            phase = "forward"
        elif where is not None or kind == "bmm":
            phase = "dX"
        else:
            phase = "dW"
        return {"op": name, "a": list(a.shape), "b": list(b.shape), "pass": phase, "kind": kind, "where": where}

    def _apply(self, out: torch.Tensor) -> dict[str, Any]:
        f = self.fault
        kind = f["kind"]
        el = tuple(f["element"])
        if len(el) != out.dim():
            raise ValueError(f"element {list(el)} does not index the {list(out.shape)} result of matmul {self.target}")
        rec = dict(
            self.ops[self.target],
            index=self.target,
            out=list(out.shape),
            dtype=str(out.dtype).replace("torch.", ""),
            fault=f,
        )
        if kind in ("tile-scale", "tile-sign"):
            *lead, r, c = el
            r0 = max(0, min(r, out.shape[-2] - TILE))
            c0 = max(0, min(c, out.shape[-1] - TILE))
            tile = out[(*lead, slice(r0, r0 + TILE), slice(c0, c0 + TILE))]
            before = tile.clone()
            if kind == "tile-scale":
                tile.mul_(f["factor"])
            else:
                tile.neg_()
            rec.update(
                tile=[*lead, r0, c0],
                changed=int((tile != before).sum()),
                max_abs_change=float((tile.float() - before.float()).abs().max()),
                tile_abs_sum=float(before.float().abs().sum()),
            )
            return rec
        old = float(out[el])
        ob = _bits(old, out.dtype)
        if kind == "bit":
            new = _value(ob ^ (1 << f["bit"]), out.dtype)
        elif kind == "zero":
            new = 0.0
        elif kind == "nan":
            new = float("nan")
        else:
            raise ValueError(f"unknown fault kind {kind!r}")
        out[el] = new
        new = float(out[el])
        rec.update(
            old=old, new=new, old_bits=hex(ob), new_bits=hex(_bits(new, out.dtype)), changed=int(not _same(old, new))
        )
        return rec


class _Above(TorchDispatchMode):
    def __init__(self, inj: Injector) -> None:
        super().__init__()
        self.inj = inj

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        kwargs = kwargs or {}
        inj = self.inj
        name = func.overloadpacket.__name__ if func.namespace == "aten" else ""
        if name in COPIES:
            out = func(*args, **kwargs)
            src = _storage(args[0]) if args and isinstance(args[0], torch.Tensor) else None
            if src in inj.weights and isinstance(out, torch.Tensor):
                inj.weights.setdefault(_storage(out), inj.weights[src])
                inj.held.append(out)  # alive until the step ends: its address is never reused by another tensor
            return out
        if name not in MATMULS or func._overloadname != "default":
            return func(*args, **kwargs)
        if inj._issued_by_checker():
            inj.foreign += 1
            return func(*args, **kwargs)
        index = len(inj.ops)
        desc = inj._describe(name, args)
        inj.ops.append(desc)
        if index == inj.target:
            inj._marked = (func, tuple(id(x) for x in args))
        out = func(*args, **kwargs)
        desc["out"] = list(out.shape)
        if index == inj.target and inj._marked is not None:
            inj._marked = None
            inj.record = {"error": "the marked matmul never reached below(): enter below() before the checker"}
        return out


class _Below(TorchDispatchMode):
    def __init__(self, inj: Injector) -> None:
        super().__init__()
        self.inj = inj

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        m = self.inj._marked
        if m is not None and func is m[0] and tuple(id(x) for x in args) == m[1]:
            self.inj._marked = None
            with torch.no_grad():
                self.inj.record = self.inj._apply(out)
        return out
