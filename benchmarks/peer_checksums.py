"""Our matmul checksum checks beside the PyPI peer's, on the same injected faults, in one run (issue 23).

The PyPI package ``sdcguard`` 0.4.0 is a different project with our import name: it checks ``nn.Linear`` matmuls
(forward, dX, dW) with block column checksums (``SDCGuard(every=N).protect(model)``, then ``with
guard.on_step(step):`` around forward and backward; a detection is an ``SDCEvent`` in ``guard.log.events`` and a
count in ``guard.stats["alerts"]``). Without ``protect()`` the same guard is a ``TorchDispatchMode`` that checks
every aten matmul it sees (``bmm`` in attention too). Since both packages are imported as ``sdcguard`` they never
share a process: ours runs from the project's ``.venv``, the peer from its own virtualenv (``--venv``, created or
reused here: CPU ``torch==2.13.0``, ``sdcguard==0.4.0``, numpy), each as a worker subprocess of this script (the same
file with ``--worker``), driven over a pipe one JSON line per command.

**The fault.** One injector module, :data:`INJECTOR_SOURCE`, written into the work directory and loaded by both
workers (its sha256 is compared): it imports torch and the standard library only. It changes one element (or one
16x16 tile) of the result of the model's k-th aten matmul (``mm``/``addmm``/``bmm``/``baddbmm``, numbered in the
order a forward+backward issues them) with two ``TorchDispatchMode`` s: ``above()``, entered innermost (after the
checker), numbers the matmuls the *model* issues and marks the k-th call; ``below()``, entered outermost (before the
checker), corrupts the marked call's result in place when that call reaches it, so the checker sees the faulty
result as it would see a faulty GPU's. A checker that is a dispatch mode (ours; the peer's default mode) issues its
own check ops from inside its ``__torch_dispatch__``, below ``above()``, so they are never numbered; a checker that
runs its checks at the model's level (the peer's ``protect()``) is kept out by its files (``skip_files``: a matmul
whose Python stack passes through the peer's ``checksum.py``/``_group.py``/``fused.py``/``screen.py``/
``attention.py`` is not numbered). Proof that number k is the same op everywhere: each worker runs a clean step under
every checker with a counting-only injector and compares the list of numbered matmuls (op, operand shapes, pass)
with a step without a checker, and the parent compares the two workers' lists; every fault's record (op, element,
old and new bits) is compared between the workers too.

Fault classes (fp32; bf16 under ``--dtypes ...,bf16``, autocast on the CPU, with the bits in brackets): ``sign`` bit
31 [15]; ``exp-high`` bit 30 [14]; ``exp-low`` bit 23 [7]; ``mant-high`` one of bits 16..22 [4..6]; ``mant-low``
one of bits 0..7 [0..2]; ``zero``; ``nan``; the controls over a whole 16x16 tile of the output: ``tile-scale``
(every entry times ``1 + 2**-10`` [``1 + 2**-7``: ``2**-10`` is below bf16's resolution]) and ``tile-sign`` (every
entry negated). Each class gets the same ``--faults`` seeded targets (op and element), spread evenly over the
forward, dX and dW matmuls; attention's ``bmm`` s are among the forward and dX targets (its backward ``bmm`` s are
labelled dX: both operands are activations), which the peer's ``protect()`` does not see. Each fault is one step of
the benchmark transformer (``sdcguard/testing/models.py``: d=256, 4 heads, 4 layers, 128 tokens, batch 8; the same
batch and dropout seed for every tool) at fixed weights.

Also: false alarms over ``--clean`` training steps (SGD) checked on every step, and the cost: the median step time
(forward + backward + SGD, one thread) of plain steps against each tool checking every step, in ``--rounds``
interleaved rounds (the workers take turns, and each rotates its configurations), printed as ratios to the same
worker's plain steps. The cost at a tool's default sampling (ours: ``checksum_every=4``; the peer: ``every=10``) is
``(checked + (N - 1) x unchecked) / N`` from those medians, where ``unchecked`` is a plain step for ours and the
peer's dispatch mode, and a ``protect()`` ed model's step outside a checked step for the peer. Run::

    .venv/bin/python benchmarks/peer_checksums.py [--faults 20] [--clean 200] [--dtypes fp32,bf16] [--rounds 6]
        [--json FILE] [--venv .venv-peer] [--no-peer]

Prints a markdown table to stdout (progress to stderr); ``--json`` writes every figure and every fault's record.
Nothing is asserted: the figures are printed as measured.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "sdcguard" / "testing" / "models.py"
"""The benchmark transformer, loaded by path: the peer's virtualenv has PyPI's ``sdcguard``, not this one."""

PEER_SPEC = "sdcguard==0.4.0"
TORCH_SPEC = "torch==2.13.0"
SIZE = {"d": 256, "heads": 4, "layers": 4, "seq": 128, "batch": 8}
CLASSES = ("sign", "exp-high", "exp-low", "mant-high", "mant-low", "zero", "nan", "tile-scale", "tile-sign")
PASSES = ("forward", "dX", "dW")
LABELS = {
    "ours": "ours: ChecksumMode, every matmul",
    "peer-linear": "peer: SDCGuard(every=1).protect(model), nn.Linear",
    "peer-all": "peer: SDCGuard(every=1), dispatch mode, every matmul",
}
WORKER_CONFIGS = {"ours": ("ours",), "peer": ("peer-linear", "peer-all")}
# bit positions: (fp32, bf16)
BITS = {
    "sign": (31, 15),
    "exp-high": (30, 14),
    "exp-low": (23, 7),
    "mant-high": ((16, 22), (4, 6)),
    "mant-low": ((0, 7), (0, 2)),
}
TILE_FACTOR = {"fp32": 1.0 + 2.0**-10, "bf16": 1.0 + 2.0**-7}

INJECTOR_SOURCE = '''"""A standalone fault injector for the aten matmuls of a training step (written out by
benchmarks/peer_checksums.py for both tools' processes; it imports torch and the standard library only).

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

import torch
from torch.utils._python_dispatch import TorchDispatchMode

MATMULS = ("mm", "addmm", "bmm", "baddbmm")
COPIES = ("_to_copy", "clone")          # casts of a weight (autocast's, a checker's): still that weight
TILE = 16


def _storage(t):
    try:
        return t.untyped_storage().data_ptr()
    except Exception:  # noqa: BLE001
        return None


def _bits(value, dtype):
    b = struct.unpack("<I", struct.pack("<f", value))[0]
    return b >> 16 if dtype == torch.bfloat16 else b


def _value(bits, dtype):
    return struct.unpack("<f", struct.pack("<I", bits << 16 if dtype == torch.bfloat16 else bits))[0]


def _same(x, y):
    return x == y or (math.isnan(x) and math.isnan(y))


class Injector:
    """target: the number of the model matmul to corrupt (None: count only). fault: {"kind": "bit" | "zero" | "nan"
    | "tile-scale" | "tile-sign", "element": [...], "bit": int, "factor": float}. weights: {storage address:
    parameter name} (names the layer; an operand that is a weight, or a cast of one, makes a backward matmul dX)."""

    def __init__(self, target=None, fault=None, weights=None, skip_files=()):
        self.target = target
        self.fault = dict(fault or {})
        self.weights = dict(weights or {})
        self.skip_files = frozenset(skip_files)
        self.ops = []
        self.held = []
        self.foreign = 0
        self.record = None
        self._marked = None

    def above(self):
        return _Above(self)

    def below(self):
        return _Below(self)

    def _issued_by_checker(self):
        if not self.skip_files:
            return False
        f = sys._getframe(2)
        while f is not None:
            if f.f_code.co_filename in self.skip_files:
                return True
            f = f.f_back
        return False

    def _describe(self, name, args):
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

    def _apply(self, out):
        f = self.fault
        kind = f["kind"]
        el = tuple(f["element"])
        if len(el) != out.dim():
            raise ValueError(f"element {list(el)} does not index the {list(out.shape)} result of matmul {self.target}")
        rec = dict(self.ops[self.target], index=self.target, out=list(out.shape),
                   dtype=str(out.dtype).replace("torch.", ""), fault=f)
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
            rec.update(tile=[*lead, r0, c0], changed=int((tile != before).sum()),
                       max_abs_change=float((tile.float() - before.float()).abs().max()),
                       tile_abs_sum=float(before.float().abs().sum()))
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
        rec.update(old=old, new=new, old_bits=hex(ob), new_bits=hex(_bits(new, out.dtype)),
                   changed=int(not _same(old, new)))
        return rec


class _Above(TorchDispatchMode):
    def __init__(self, inj):
        super().__init__()
        self.inj = inj

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
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
    def __init__(self, inj):
        super().__init__()
        self.inj = inj

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        m = self.inj._marked
        if m is not None and func is m[0] and tuple(id(x) for x in args) == m[1]:
            self.inj._marked = None
            with torch.no_grad():
                self.inj.record = self.inj._apply(out)
        return out
'''


# ============================================================================================== the workers


def _load_injector(path: str) -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location("sdc_fault_injector", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class _Null:
    """A stand-in for the injector when nothing is injected (timing)."""

    def above(self) -> Any:
        import contextlib

        return contextlib.nullcontext()

    below = above


class Plain:
    """No checker."""

    def __init__(self, model: Any) -> None:
        self.model = model

    def run(self, fn: Any, inj: Any, step: int) -> dict[str, Any]:
        with inj.below(), inj.above():
            fn()
        return {"alarms": 0}


class Ours:
    """Our ``ChecksumMode`` on the module, pushed for the step: ``begin()``; forward + backward; ``end()``."""

    def __init__(self, model: Any, rows: int) -> None:
        from sdcguard.training.checksums.mode import ChecksumMode

        self.mode = ChecksumMode(model, rows=rows)

    def run(self, fn: Any, inj: Any, step: int) -> dict[str, Any]:
        with inj.below():
            self.mode.begin()
            try:
                with inj.above():
                    fn()
            finally:
                failures = self.mode.end()
        out: dict[str, Any] = {"alarms": len(failures), "checked": self.mode.checked, "run": self.mode.run}
        if failures:
            f = failures[0]
            out["first"] = f"{f.op} {f.phase} at {f.where}: {f.blocks} block column(s) over the bound"
            out["sticky"] = [f.sticky for f in failures]
        return out


class Peer:
    """The peer's ``SDCGuard``: ``protect(model)`` (nn.Linear, its training API) or its dispatch mode (no protect)."""

    def __init__(self, model: Any, linear: bool, every: int = 1) -> None:
        import warnings

        from sdcguard import SDCGuard

        self.guard = SDCGuard(every=every)
        if linear:
            self.guard.protect(model)
        self.warnings: dict[str, int] = {}
        self._warnings = warnings

    def run(self, fn: Any, inj: Any, step: int) -> dict[str, Any]:
        g = self.guard
        before = dict(g.stats)
        n_events = len(g.log.events)
        with self._warnings.catch_warnings(record=True) as caught:
            self._warnings.simplefilter("always")
            with inj.below(), g.on_step(step) as checked, inj.above():
                fn()
        for w in caught:
            msg = str(w.message).split(". ")[0][:200]
            self.warnings[msg] = self.warnings.get(msg, 0) + 1
        delta = {k: v - before.get(k, 0) for k, v in g.stats.items() if isinstance(v, (int, float))}
        out: dict[str, Any] = {
            "alarms": delta.get("alerts", 0),
            "checked": delta.get("checked", 0),
            "run": delta.get("matmuls_seen", 0),
            "skipped_dtype": delta.get("skipped_dtype", 0),
            "unjudged": delta.get("unjudged", 0),
            "step_checked": bool(checked),
        }
        events = g.log.events[n_events:]
        if events:
            d = events[0].detail
            out["first"] = (
                f"{d.get('op')} {d.get('pass')} at {d.get('where')} A{list(d.get('shape_A', ()))} "
                f"B{list(d.get('shape_B', ()))}: max_z {d.get('max_z')}, nonfinite {d.get('nonfinite')}"
            )
        return out


class WorkerState:
    def __init__(self, kind: str, injector_path: str, seed: int) -> None:
        import torch

        torch.set_num_threads(1)
        if kind == "ours":
            sys.path.insert(0, str(ROOT))
        spec = importlib.util.spec_from_file_location("_benchmark_models", MODELS)
        assert spec is not None and spec.loader is not None
        models = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(models)
        TinyTransformer, lm_loss, make_batch = models.TinyTransformer, models.lm_loss, models.make_batch

        self.torch, self.lm_loss, self.make_batch = torch, lm_loss, make_batch
        self.kind, self.seed = kind, seed
        self.inj_mod = _load_injector(injector_path)
        self.injector_sha256 = hashlib.sha256(Path(injector_path).read_bytes()).hexdigest()
        torch.manual_seed(seed)
        self.base = TinyTransformer(d=SIZE["d"], heads=SIZE["heads"], layers=SIZE["layers"], seq=SIZE["seq"])
        self.sessions: dict[tuple[str, str, str], tuple[Any, Any, Any]] = {}
        self.step_no: dict[tuple[str, str, str], int] = {}
        self.skip_files: tuple[str, ...] = ()
        if kind == "peer":
            import sdcguard

            files = ("checksum.py", "_group.py", "fused.py", "screen.py", "attention.py")
            pkgs = {Path(sdcguard.__file__).parent, Path(sdcguard.__file__).resolve().parent}
            self.skip_files = tuple(sorted(str(pkg / f) for pkg in pkgs for f in files))
        else:
            import sdcguard.training.checksums.bound as cb
            import sdcguard.training.checksums.mode as cs
            import sdcguard.training.checksums.precision as cp

            self.skip_files = tuple(
                sorted({str(p) for m in (cb, cs, cp) for p in (Path(m.__file__), Path(m.__file__).resolve())})
            )

    # -------------------------------------------------------------------------------------------- pieces

    def configs(self) -> tuple[str, ...]:
        return WORKER_CONFIGS[self.kind]

    def info(self) -> dict[str, Any]:
        import platform

        import sdcguard

        out: dict[str, Any] = {
            "python": platform.python_version(),
            "torch": self.torch.__version__,
            "threads": self.torch.get_num_threads(),
            "sdcguard_file": sdcguard.__file__,
            "sdcguard_version": getattr(sdcguard, "__version__", None),
            "injector_sha256": self.injector_sha256,
            "skip_files": list(self.skip_files),
        }
        if self.kind == "peer":
            import inspect

            from sdcguard.checksum import UNIT_ROUNDOFF

            from sdcguard import SDCGuard

            params = inspect.signature(SDCGuard.__init__).parameters
            out["defaults"] = {k: params[k].default for k in ("every", "sample_rate", "block", "z", "precise")}
            out["checked_dtypes"] = sorted(str(d).replace("torch.", "") for d in UNIT_ROUNDOFF)
        else:
            from sdcguard.training.checksums.bound import DEFAULT_ROWS
            from sdcguard.training.config import DEFAULT_CHECKSUM_EVERY

            out["defaults"] = {"checksum_every": DEFAULT_CHECKSUM_EVERY, "rows": DEFAULT_ROWS}
        return out

    def default_every(self) -> int:
        d = self.info()["defaults"]
        return int(d["every"] if self.kind == "peer" else d["checksum_every"])

    def new_session(self, config: str, dtype: str, lr: float = 0.01) -> tuple[Any, Any, Any]:
        import copy

        model = copy.deepcopy(self.base)
        if config == "plain":
            sess: Any = Plain(model)
        elif config == "ours":
            from sdcguard.training.checksums.bound import DEFAULT_ROWS

            sess = Ours(model, DEFAULT_ROWS)
        elif config in ("peer-linear", "peer-all"):
            sess = Peer(model, linear=config == "peer-linear")
        elif config == "peer-linear-idle":
            sess = Peer(model, linear=True, every=self.default_every())
        else:
            raise ValueError(config)
        return model, sess, self.torch.optim.SGD(model.parameters(), lr=lr)

    def session(self, purpose: str, config: str, dtype: str) -> tuple[Any, Any, Any]:
        key = (purpose, config, dtype)
        if key not in self.sessions:
            self.sessions[key] = self.new_session(config, dtype)
            self.step_no[key] = 0
        return self.sessions[key]

    def fwd_bwd(self, model: Any, batch: Any, dtype: str) -> None:
        torch = self.torch
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bf16"):
            loss = self.lm_loss(model, batch)
        loss.backward()

    def batch(self, step: int) -> Any:
        return self.make_batch(step, 0, batch=SIZE["batch"], seq=SIZE["seq"])

    def weights(self, model: Any) -> dict[int, str]:
        return {p.untyped_storage().data_ptr(): n for n, p in model.named_parameters()}

    def one_step(self, model: Any, sess: Any, dtype: str, step: int, batch_no: int, inj: Any) -> dict[str, Any]:
        self.torch.manual_seed(self.seed * 1_000_003 + batch_no)  # dropout: the same masks for every tool
        batch = self.batch(batch_no)
        out = sess.run(lambda: self.fwd_bwd(model, batch, dtype), inj, step)
        model.zero_grad(set_to_none=True)
        return out

    # ------------------------------------------------------------------------------------------ commands

    def cmd_setup(self, dtypes: list[str]) -> dict[str, Any]:
        out: dict[str, Any] = {"info": self.info(), "census": {}, "census_check": {}}
        for dtype in dtypes:
            per: dict[str, Any] = {}
            for config in ("plain", *self.configs()):
                model, sess, _ = self.session("faults", config, dtype)
                inj = self.inj_mod.Injector(weights=self.weights(model), skip_files=self.skip_files)
                res = self.one_step(model, sess, dtype, 0, 0, inj)
                per[config] = {"ops": inj.ops, "foreign": inj.foreign, "checks": res}
            plain = [_sig(o) for o in per["plain"]["ops"]]
            out["census"][dtype] = per["plain"]["ops"]
            out["census_check"][dtype] = {
                c: {
                    "same_as_plain": [_sig(o) for o in v["ops"]] == plain,
                    "matmuls": len(v["ops"]),
                    "foreign": v["foreign"],
                    "checks": v["checks"],
                    "first_difference": _first_diff(plain, [_sig(o) for o in v["ops"]]),
                }
                for c, v in per.items()
            }
        return out

    def cmd_faults(self, dtype: str, config: str, faults: list[dict[str, Any]]) -> list[dict[str, Any]]:
        model, sess, _ = self.session("faults", config, dtype)
        results = []
        for f in faults:
            inj = self.inj_mod.Injector(
                target=f["target"], fault=f["fault"], weights=self.weights(model), skip_files=self.skip_files
            )
            t0 = time.perf_counter()
            res = self.one_step(model, sess, dtype, f["i"], f["i"], inj)
            res.update(
                i=f["i"],
                cls=f["cls"],
                seconds=round(time.perf_counter() - t0, 3),
                record=inj.record or {"error": "not injected: the target matmul never came"},
                matmuls=len(inj.ops),
                foreign=inj.foreign,
            )
            results.append(res)
        return results

    def cmd_clean(self, dtype: str, config: str, steps: int) -> dict[str, Any]:
        key = ("clean", config, dtype)
        model, sess, opt = self.session(*key)
        tally: dict[str, Any] = {
            "steps": 0,
            "alarm_steps": 0,
            "alarms": 0,
            "checked": 0,
            "run": 0,
            "skipped_dtype": 0,
            "unjudged": 0,
            "first_alarms": [],
        }
        for _ in range(steps):
            n = self.step_no[key]
            self.step_no[key] = n + 1
            self.torch.manual_seed(self.seed * 1_000_003 + 500_000 + n)
            batch = self.batch(500_000 + n)
            res = sess.run(lambda b=batch: self.fwd_bwd(model, b, dtype), _Null(), n)
            opt.step()
            opt.zero_grad(set_to_none=True)
            tally["steps"] += 1
            for k in ("alarms", "checked", "run", "skipped_dtype", "unjudged"):
                tally[k] += int(res.get(k, 0) or 0)
            if res["alarms"]:
                tally["alarm_steps"] += 1
                if len(tally["first_alarms"]) < 5:
                    tally["first_alarms"].append({"step": n, "first": res.get("first")})
        if isinstance(sess, Peer):
            tally["max_z_seen"] = sess.guard.max_z_seen
            tally["alarm_line_z"] = sess.guard.z
            tally["warnings"] = sess.warnings
        return tally

    def cmd_time(self, dtype: str, steps: int, rotate: int) -> dict[str, list[float]]:
        configs = ["plain", *self.configs()]
        if self.kind == "peer":
            configs.append("peer-linear-idle")
        k = rotate % len(configs)
        configs = configs[k:] + configs[:k]
        times: dict[str, list[float]] = {}
        for config in configs:
            key = ("time", config, dtype)
            model, sess, opt = self.session(*key)
            every = self.default_every()
            ts = []
            for _ in range(steps + (1 if self.step_no[key] == 0 else 0)):  # the first step of each: warm-up
                n = self.step_no[key]
                self.step_no[key] = n + 1
                batch = self.batch(900_000 + n)
                step = n * every + 1 if config == "peer-linear-idle" else n  # idle: never a multiple of `every`
                t0 = time.perf_counter()
                sess.run(lambda m=model, b=batch: self.fwd_bwd(m, b, dtype), _Null(), step)
                opt.step()
                opt.zero_grad(set_to_none=True)
                ts.append(time.perf_counter() - t0)
            times[config] = ts[-steps:]
        return times


def _sig(o: dict[str, Any]) -> tuple[Any, ...]:
    return (o["op"], tuple(o["a"]), tuple(o["b"]), tuple(o.get("out", ())), o["pass"], o["kind"], o["where"])


def _first_diff(a: list[Any], b: list[Any]) -> Any:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return {"index": i, "plain": list(x), "this": list(y)}
    return None if len(a) == len(b) else {"index": min(len(a), len(b)), "lengths": [len(a), len(b)]}


def worker_main(kind: str, injector: str, seed: int) -> int:
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # anything else printed goes to stderr: stdout carries the protocol only
    sys.stdout = sys.stderr
    try:
        state = WorkerState(kind, injector, seed)
    except BaseException:  # noqa: BLE001  (the parent prints it)
        proto.write(json.dumps({"error": traceback.format_exc()}) + "\n")
        return 1
    proto.write(json.dumps({"ready": True}) + "\n")
    for line in sys.stdin:
        msg = json.loads(line)
        cmd = msg.pop("cmd")
        if cmd == "quit":
            break
        try:
            reply = {"ok": getattr(state, f"cmd_{cmd}")(**msg)}
        except BaseException:  # noqa: BLE001
            reply = {"error": traceback.format_exc()}
        proto.write(json.dumps(reply, default=str) + "\n")
    return 0


# ============================================================================================== the parent


def log(msg: str) -> None:
    print(f"[peer_checksums {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class Worker:
    def __init__(self, kind: str, python: str, script: Path, injector: Path, seed: int, workdir: Path) -> None:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
        env.update(
            OMP_NUM_THREADS="1",
            MKL_NUM_THREADS="1",
            SDCGUARD_SIGN_SEED=str(seed),
            PYTHONNOUSERSITE="1",
            PYTHONWARNINGS="ignore",
        )
        self.kind = kind
        self.log_path = workdir / f"worker-{kind}.log"
        self._log = open(self.log_path, "w")  # noqa: SIM115  (open for the worker's life)
        # cwd=/ : the repository is on neither worker's path unless the worker puts it there (ours only)
        self.proc = subprocess.Popen(
            [python, "-u", str(script), "--worker", kind, "--injector", str(injector), "--seed", str(seed)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            env=env,
            cwd="/",
        )
        first = self._read()
        if "error" in first:
            raise RuntimeError(f"{kind} worker could not start:\n{first['error']}")

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            tail = self.log_path.read_text()[-3000:]
            raise RuntimeError(f"{self.kind} worker exited (rc {self.proc.wait()}); its log ends:\n{tail}")
        return json.loads(line)

    def call(self, cmd: str, **kw: Any) -> Any:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"cmd": cmd, **kw}) + "\n")
        self.proc.stdin.flush()
        reply = self._read()
        if "error" in reply:
            raise RuntimeError(f"{self.kind} worker failed on {cmd}:\n{reply['error']}")
        return reply["ok"]

    def close(self) -> None:
        try:
            if self.proc.poll() is None and self.proc.stdin is not None:
                self.proc.stdin.write(json.dumps({"cmd": "quit"}) + "\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
        self._log.close()


_PROBE = (
    "import json, sdcguard, torch; print(json.dumps({'version': getattr(sdcguard, '__version__', None), "
    "'file': sdcguard.__file__, 'torch': torch.__version__}))"
)


def ensure_peer_venv(venv: Path, torch_spec: str, peer_spec: str, workdir: Path) -> tuple[str | None, str]:
    """The peer's virtualenv (created, or reused when it already has the peer): (its python, what happened)."""
    python = venv / "bin" / "python"
    want = peer_spec.split("==")[1] if "==" in peer_spec else None

    def probe() -> dict[str, Any] | None:
        if not python.exists():
            return None
        r = subprocess.run(
            [str(python), "-c", _PROBE],
            check=False,
            capture_output=True,
            text=True,
            cwd="/",
            env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
        )
        if r.returncode:
            return None
        got = json.loads(r.stdout.strip().splitlines()[-1])
        ok = (want is None or got["version"] == want) and str(venv.resolve()) in str(Path(got["file"]).resolve())
        return got if ok else None

    got = probe()
    if got is not None:
        return str(python), f"reused {venv} (sdcguard {got['version']}, torch {got['torch']})"
    pip_log = workdir / "peer-venv-pip.log"
    with open(pip_log, "w") as fh:
        if not python.exists():
            log(f"creating the peer's virtualenv {venv}")
            base = os.environ.get("PYTHON", "python3")
            r = subprocess.run([base, "-m", "venv", str(venv)], check=False, stdout=fh, stderr=subprocess.STDOUT)
            if r.returncode:
                return None, f"`{base} -m venv {venv}` failed (rc {r.returncode}); see {pip_log}"
        log(f"installing {torch_spec} {peer_spec} numpy into {venv} (pip's output: {pip_log})")
        r = subprocess.run(
            [str(python), "-m", "pip", "install", "--disable-pip-version-check", torch_spec, peer_spec, "numpy"],
            check=False,
            stdout=fh,
            stderr=subprocess.STDOUT,
            cwd="/",
        )
    if r.returncode:
        tail = pip_log.read_text()[-1500:]
        return None, f"pip install {torch_spec} {peer_spec} failed (rc {r.returncode}):\n{tail}"
    got = probe()
    if got is None:
        return None, f"installed, but `import sdcguard` in {venv} is not the peer {peer_spec} (see {pip_log})"
    return str(python), f"created {venv} (sdcguard {got['version']}, torch {got['torch']})"


def plan_faults(census: list[dict[str, Any]], n: int, seed: int, dtype: str) -> dict[str, list[dict[str, Any]]]:
    """The same n targets (op and element) for every class, spread evenly over forward, dX and dW."""
    rng = random.Random(f"{seed}-{dtype}")
    by_pass = {p: [i for i, o in enumerate(census) if o["pass"] == p] for p in PASSES}
    targets = []
    for i in range(n):
        k = rng.choice(by_pass[PASSES[i % 3]])
        targets.append((k, [rng.randrange(s) for s in census[k]["out"]], rng.random()))
    bf = dtype == "bf16"
    out: dict[str, list[dict[str, Any]]] = {}
    for cls in CLASSES:
        rows = []
        crng = random.Random(f"{seed}-{dtype}-{cls}")
        for i, (k, element, _) in enumerate(targets):
            fault: dict[str, Any] = {"element": element}
            if cls in BITS:
                spec = BITS[cls][1 if bf else 0]
                fault.update(kind="bit", bit=crng.randint(*spec) if isinstance(spec, tuple) else spec)
            elif cls in ("zero", "nan", "tile-sign"):
                fault["kind"] = cls
            else:
                fault.update(kind="tile-scale", factor=TILE_FACTOR[dtype])
            rows.append({"i": i, "cls": cls, "target": k, "fault": fault})
        out[cls] = rows
    return out


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def summarize(res: dict[str, Any]) -> None:
    """Per dtype and config: detected / injected per class and per site (pass, kind)."""
    for d in res["dtypes"].values():
        d["summary"] = {}
        for config, faults in d["faults"].items():
            per: dict[str, Any] = {}
            for cls in CLASSES:
                rows = [f for f in faults if f["cls"] == cls]
                eff = [f for f in rows if f["record"].get("changed")]
                per[cls] = {
                    "injected": len(eff),
                    "detected": sum(1 for f in eff if f["alarms"]),
                    "no_op": len(rows) - len(eff),
                    "not_injected": sum(1 for f in rows if "error" in f["record"]),
                }
            sites: dict[str, list[int]] = {}
            for f in faults:
                r = f["record"]
                if r.get("changed"):
                    s = sites.setdefault(f"{r['pass']} {r['kind']}", [0, 0])
                    s[0] += bool(f["alarms"])
                    s[1] += 1
            d["summary"][config] = {"classes": per, "sites": sites}


def _ratio(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{x:.2f}x"


def markdown(res: dict[str, Any]) -> str:
    lines: list[str] = []
    configs = [c for c in ("ours", "peer-linear", "peer-all") if any(c in d["faults"] for d in res["dtypes"].values())]
    peer_missing = res.get("peer_error")
    for dtype, d in res["dtypes"].items():
        n = res["settings"]["faults"]
        title = f"### {dtype}{' (CPU autocast)' if dtype == 'bf16' else ''}: {n} faults per class, detected / injected"
        lines += [title, ""]
        head = ["class", "fault"] + [LABELS[c] for c in configs] + (["peer"] if peer_missing else [])
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for cls in CLASSES if n else ():
            row = [cls, _describe_class(cls, dtype)]
            for c in configs:
                s = d["summary"].get(c, {}).get("classes", {}).get(cls)
                if s is None:
                    row.append("not run")
                    continue
                cell = f"{s['detected']}/{s['injected']}"
                if s["no_op"]:
                    cell += f" ({s['no_op']} no-op)"
                row.append(cell)
            if peer_missing:
                row.append("not run")
            lines.append("| " + " | ".join(row) + " |")
        # clean steps, checks per step, costs
        row = ["clean steps", "false alarms"]
        for c in configs:
            t = d["clean"].get(c)
            row.append(
                "not run"
                if t is None
                else f"{t['alarm_steps']} in {t['steps']} steps ({t['checked']:,} matmul checks"
                + (
                    f"; largest clean z {t['max_z_seen']:.2f}, alarm at {t['alarm_line_z']:g})"
                    if t.get("max_z_seen")
                    else ")"
                )
            )
        lines.append("| " + " | ".join(row + (["not run"] if peer_missing else [])) + " |")
        row = ["matmuls", "checked / run per step"]
        for c in configs:
            cc = d["census_check"].get(c)
            if cc is None:
                row.append("not run")
                continue
            ch = cc["checks"]
            row.append(
                f"{ch.get('checked', 0)} of {len(d['census'])}"
                + (f" ({ch['skipped_dtype']} skipped: dtype)" if ch.get("skipped_dtype") else "")
            )
        lines.append("| " + " | ".join(row + (["not run"] if peer_missing else [])) + " |")
        cost = d.get("cost", {})
        for label, key in (("cost", "every_step"), ("cost", "default")):
            row = [label, "checked every step" if key == "every_step" else "at its default sampling"]
            for c in configs:
                cc = cost.get(c)
                if cc is None:
                    row.append("not run")
                elif key == "every_step":
                    row.append(
                        f"{_ratio(cc['ratio'])} ({len(cc['rounds'])} paired rounds: "
                        f"{_ratio(cc['round_min'])}-{_ratio(cc['round_max'])}; median step {cc['ms']:.0f} vs "
                        f"{cc['plain_ms']:.0f} ms plain)"
                    )
                else:
                    row.append(f"{_ratio(cc['default_ratio'])} ({cc['default_label']})")
            lines.append("| " + " | ".join(row + (["not run"] if peer_missing else [])) + " |")
        sites = sorted({s for c in configs for s in d["summary"].get(c, {}).get("sites", {})})
        if sites:
            lines += ["", f"By site ({dtype}, all classes together, detected / injected):", ""]
            lines += ["| site | " + " | ".join(LABELS[c] for c in configs) + " |", "|" + "---|" * (len(configs) + 1)]
        for s in sites:
            cells = []
            for c in configs:
                v = d["summary"].get(c, {}).get("sites", {}).get(s)
                cells.append(f"{v[0]}/{v[1]}" if v else "-")
            lines.append(f"| {s} | " + " | ".join(cells) + " |")
        lines.append("")
        for note in d.get("notes", []):
            lines.append(f"- {note}")
        lines.append("")
    if peer_missing:
        lines.append(f"The peer did not run: {peer_missing}")
    return "\n".join(lines)


def _describe_class(cls: str, dtype: str) -> str:
    bf = dtype == "bf16"
    if cls in BITS:
        spec = BITS[cls][1 if bf else 0]
        return f"bit {spec}" if not isinstance(spec, tuple) else f"one of bits {spec[0]}..{spec[1]}"
    return {
        "zero": "set to 0",
        "nan": "set to NaN",
        "tile-sign": "16x16 tile negated",
        "tile-scale": f"16x16 tile x (1 + 2^-{10 if not bf else 7})",
    }[cls]


def run(args: argparse.Namespace) -> dict[str, Any]:
    t_start = time.perf_counter()
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="peer_checksums_"))
    workdir.mkdir(parents=True, exist_ok=True)
    injector = workdir / "sdc_fault_injector.py"
    injector.write_text(INJECTOR_SOURCE)
    sha = hashlib.sha256(INJECTOR_SOURCE.encode()).hexdigest()
    log(f"work directory {workdir} (the injector module: {injector}, sha256 {sha[:16]})")
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    res: dict[str, Any] = {
        "settings": {
            "faults": args.faults,
            "clean": args.clean,
            "rounds": args.rounds,
            "round_steps": args.round_steps,
            "dtypes": dtypes,
            "seed": args.seed,
            "size": SIZE,
            "threads": 1,
            "venv": str(args.venv),
            "injector_sha256": sha,
            "workdir": str(workdir),
            "tile_factor": TILE_FACTOR,
            "bits": BITS,
        },
        "dtypes": {d: {"faults": {}, "clean": {}, "census_check": {}, "notes": []} for d in dtypes},
    }
    workers: dict[str, Worker] = {}
    try:
        ours_python = args.ours_python or str(ROOT / ".venv" / "bin" / "python")
        workers["ours"] = Worker("ours", ours_python, Path(__file__).resolve(), injector, args.seed, workdir)
        if not args.no_peer:
            t0 = time.perf_counter()
            peer_python, why = ensure_peer_venv(Path(args.venv), args.torch_spec, args.peer_spec, workdir)
            res["peer_venv"] = {"result": why, "seconds": round(time.perf_counter() - t0, 1)}
            log(f"peer virtualenv: {why}")
            if peer_python is None:
                res["peer_error"] = why
            else:
                try:
                    workers["peer"] = Worker(
                        "peer", peer_python, Path(__file__).resolve(), injector, args.seed, workdir
                    )
                except RuntimeError as e:
                    res["peer_error"] = str(e)
                    log(str(e))
        else:
            res["peer_error"] = "--no-peer"
        setups = {}
        for k, w in workers.items():
            log(f"{k}: setup and census (one clean step under each checker, counting the model's matmuls)")
            setups[k] = w.call("setup", dtypes=dtypes)
            res[f"{k}_info"] = setups[k]["info"]
            if setups[k]["info"]["injector_sha256"] != sha:
                raise RuntimeError(f"{k} loaded a different injector")
        for dtype in dtypes:
            d = res["dtypes"][dtype]
            census = setups["ours"]["census"][dtype]
            d["census"] = census
            for k, s in setups.items():
                d["census_check"].update({c: v for c, v in s["census_check"][dtype].items() if c != "plain"})
                d["census_check"][f"plain ({k})"] = s["census_check"][dtype]["plain"]
            if "peer" in setups:
                same = [_sig(o) for o in setups["peer"]["census"][dtype]] == [_sig(o) for o in census]
                d["census_same_across_workers"] = same
                if not same:
                    d["notes"].append(
                        "the two workers' plain steps numbered different matmuls: the faults are "
                        "NOT the same ops (see census_check in the JSON)"
                    )
            d["notes"].append(
                "the model's matmuls numbered alike (op, operand shapes, pass, layer) under "
                + ", ".join(f"{c}: {'yes' if v['same_as_plain'] else 'NO'}" for c, v in d["census_check"].items())
                + (
                    f"; both workers' plain steps alike: {'yes' if d['census_same_across_workers'] else 'NO'}"
                    if "peer" in setups
                    else ""
                )
            )
            for c, v in d["census_check"].items():
                if not v["same_as_plain"]:
                    d["notes"].append(
                        f"{c}: its step's model matmuls differ from a plain step's: {v['first_difference']}"
                    )
            counts: dict[str, int] = {}
            for o in census:
                key = f"{o['pass']} {o['kind']}"
                counts[key] = counts.get(key, 0) + 1
            d["matmuls_per_step"] = counts
            plan = plan_faults(census, args.faults, args.seed, dtype)
            for k, w in workers.items():
                for config in WORKER_CONFIGS[k]:
                    rows: list[dict[str, Any]] = []
                    t0 = time.perf_counter()
                    for cls in CLASSES:
                        rows += w.call("faults", dtype=dtype, config=config, faults=plan[cls])
                        s = [r for r in rows if r["cls"] == cls]
                        log(f"{dtype} {config} {cls}: {sum(1 for r in s if r['alarms'])}/{len(s)} detected")
                    d["faults"][config] = rows
                    d.setdefault("seconds", {})[f"faults {config}"] = round(time.perf_counter() - t0, 1)
            # the same faults on both sides: op, element and bits of every record
            if "peer" in workers and args.faults:
                mism = 0
                ref = {(r["cls"], r["i"]): r["record"] for r in d["faults"]["ours"]}
                keys = ("index", "op", "out", "element", "old_bits", "new_bits", "tile", "changed")
                for config in WORKER_CONFIGS["peer"]:
                    for r in d["faults"][config]:
                        a, b = ref[(r["cls"], r["i"])], r["record"]
                        if any(a.get(x) != b.get(x) for x in keys) or (a.get("fault") != b.get("fault")):
                            mism += 1
                d["records_differing_between_workers"] = mism
                d["notes"].append(
                    f"identical faults on both sides: {len(d['faults']['ours']) * 2 - mism} of "
                    f"{len(d['faults']['ours']) * 2} peer fault records equal ours (op, element, "
                    "old and new bits)"
                    if mism
                    else f"identical faults on both sides: all {len(d['faults']['ours']) * 2} peer fault "
                    "records equal ours (op number, element, old and new bits)"
                )
            for k, w in workers.items():
                for config in WORKER_CONFIGS[k]:
                    t0 = time.perf_counter()
                    total: dict[str, Any] | None = None
                    left = args.clean
                    while left > 0:
                        chunk = min(50, left)
                        part = w.call("clean", dtype=dtype, config=config, steps=chunk)
                        left -= chunk
                        if total is None:
                            total = part
                        else:
                            for x in ("steps", "alarm_steps", "alarms", "checked", "run", "skipped_dtype", "unjudged"):
                                total[x] += part[x]
                            total["first_alarms"] = (total["first_alarms"] + part["first_alarms"])[:5]
                            for x in ("max_z_seen", "warnings"):
                                if x in part:
                                    total[x] = part[x]
                        log(f"{dtype} {config} clean: {total['steps']} steps, {total['alarm_steps']} with alarms")
                    d["clean"][config] = total
                    d.setdefault("seconds", {})[f"clean {config}"] = round(time.perf_counter() - t0, 1)
            # cost: interleaved rounds
            times: dict[str, dict[str, list[float]]] = {k: {} for k in workers}
            per_round: dict[str, list[dict[str, float]]] = {k: [] for k in workers}
            t0 = time.perf_counter()
            for r in range(args.rounds):
                order = list(workers)
                if r % 2:
                    order.reverse()
                for k in order:
                    got = workers[k].call("time", dtype=dtype, steps=args.round_steps, rotate=r)
                    per_round[k].append({c: _median(v) for c, v in got.items()})
                    for c, v in got.items():
                        times[k].setdefault(c, []).extend(v)
                log(
                    f"{dtype} timing round {r + 1}/{args.rounds}: "
                    + "; ".join(f"{c} {1000 * m:.0f} ms" for k in order for c, m in per_round[k][-1].items())
                )
            d.setdefault("seconds", {})["timing"] = round(time.perf_counter() - t0, 1)
            d["step_times_s"] = times
            cost: dict[str, Any] = {}
            for k in workers:
                plain = _median(times[k]["plain"])
                every = res[f"{k}_info"]["defaults"]["every" if k == "peer" else "checksum_every"]
                for config in WORKER_CONFIGS[k]:
                    checked = _median(times[k][config])
                    idle_of = "peer-linear-idle" if config == "peer-linear" else "plain"
                    idle = _median(times[k][idle_of])
                    # paired: each round's checked steps against the same round's plain steps (the load on a shared
                    # machine moves between rounds more than within one)
                    rounds = [pr[config] / pr["plain"] for pr in per_round[k]]
                    cost_idle = _median([pr[idle_of] / pr["plain"] for pr in per_round[k]])
                    defaults = [(pr[config] + (every - 1) * pr[idle_of]) / every / pr["plain"] for pr in per_round[k]]
                    cost[config] = {
                        "ms": 1000 * checked,
                        "plain_ms": 1000 * plain,
                        "ratio": _median(rounds),
                        "rounds": rounds,
                        "round_min": min(rounds),
                        "round_max": max(rounds),
                        "idle_ms": 1000 * idle,
                        "idle_ratio": cost_idle,
                        "default_every": every,
                        "default_ratio": _median(defaults),
                        "default_label": f"{'checksum_every' if k == 'ours' else 'every'}={every}"
                        + (f"; an unchecked protected step {cost_idle:.2f}x" if config == "peer-linear" else ""),
                    }
            d["cost"] = cost
            if "peer" in workers:
                cc = d["census_check"]
                for c in WORKER_CONFIGS["peer"]:
                    ch = cc[c]["checks"]
                    if not ch.get("checked"):
                        what = (
                            f"its dispatch mode saw {ch.get('run')} matmuls and skipped {ch.get('skipped_dtype')} "
                            "for their dtype"
                            if c == "peer-all"
                            else "protect() ran every layer's plain forward (its fast mode takes over bf16/fp16 "
                            "layers only: `dt not in UNIT_ROUNDOFF`, 'fp32/TF32: not checked')"
                        )
                        d["notes"].append(
                            f"{c} in {dtype}: checked 0 matmuls per step: the peer checks bf16/fp16 outputs only "
                            f"(checksum.UNIT_ROUNDOFF = {res['peer_info'].get('checked_dtypes')}); {what}. It runs "
                            "on the CPU without error (no Triton: its torch fallback), it just has nothing to check."
                        )
                if cc.get("peer-linear", {}).get("foreign"):
                    d["notes"].append(
                        f"peer-linear: {cc['peer-linear']['foreign']} matmuls per step issued by the "
                        "peer's own checks at the model's level were left unnumbered (skip_files); "
                        "the numbered list equals a plain step's: "
                        f"{cc['peer-linear']['same_as_plain']}"
                    )
            d["notes"].append(
                "matmuls per step (plain census): "
                + ", ".join(f"{k} {v}" for k, v in sorted(d["matmuls_per_step"].items()))
                + "; bmm = attention (q k^T, att v and their gradients), which protect() does not see"
            )
    finally:
        for w in workers.values():
            w.close()
    summarize(res)
    res["seconds"] = round(time.perf_counter() - t_start, 1)
    return res


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--faults", type=int, default=20, help="faults per class (default 20)")
    p.add_argument("--clean", type=int, default=200, help="clean checked training steps per tool (default 200)")
    p.add_argument("--dtypes", default="fp32,bf16", help="comma list of fp32, bf16 (bf16: CPU autocast)")
    p.add_argument("--rounds", type=int, default=6, help="interleaved timing rounds (default 6)")
    p.add_argument("--round-steps", type=int, default=3, help="steps per configuration per round (default 3)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="write every figure and fault record here")
    p.add_argument("--venv", default=str(ROOT / ".venv-peer"), help="the peer's virtualenv (created if missing)")
    p.add_argument("--torch-spec", default=os.environ.get("SDCGUARD_TORCH_SPEC", TORCH_SPEC))
    p.add_argument("--peer-spec", default=PEER_SPEC)
    p.add_argument("--ours-python", help="python of the project's virtualenv (default .venv/bin/python)")
    p.add_argument("--no-peer", action="store_true", help="ours only")
    p.add_argument("--workdir", help="where the injector module and the workers' logs go (default: a temp dir)")
    p.add_argument("--render", metavar="JSON", help="print the table of an earlier run's --json file, and exit")
    p.add_argument("--worker", choices=("ours", "peer"), help=argparse.SUPPRESS)
    p.add_argument("--injector", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker_main(args.worker, args.injector, args.seed)
    if args.render:
        print(markdown(json.loads(Path(args.render).read_text())))
        return 0
    res = run(args)
    table = markdown(res)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1, default=str))
        log(f"wrote {args.json}")
    print(table)
    log(f"done in {res['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
