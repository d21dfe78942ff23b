"""A worker process of the comparison: one tool's side (ours, or the PyPI peer's), driven over a pipe.

The parent (:mod:`benchmarks.peer_checksums.processes`) runs this file by its path, ``python -P worker.py --kind
ours|peer --seed N``, with the project's virtualenv for ours and the peer's for the peer (``-P``: this folder is not
put on ``sys.path``; the peer's process never has this repository on it either, so ``import sdcguard`` there is
PyPI's). Everything it needs of this benchmark it loads by file path (:func:`load_by_path`): the injector
(:mod:`benchmarks.peer_checksums.injector`), the tools (:mod:`benchmarks.peer_checksums.checkers`) and the benchmark
transformer (``sdcguard/testing/models.py``). It imports the standard library only at the top, so the parent can
import its constants and :func:`signature`.

The protocol: after ``{"ready": true}``, each line on stdin is ``{"cmd": NAME, ...keywords}``, answered by one line
``{"ok": result}`` or ``{"error": traceback}``; ``{"cmd": "quit"}`` ends it. The commands are
:class:`WorkerState`'s ``cmd_*`` methods.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import sys
import time
import traceback
from pathlib import Path
from types import ModuleType
from typing import Any

__all__ = ["SIZE", "WORKER_CONFIGS", "WORKER", "WorkerState", "signature", "load_by_path", "worker_main"]

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
WORKER = HERE / "worker.py"
INJECTOR = HERE / "injector.py"
CHECKERS = HERE / "checkers.py"
MODELS = ROOT / "sdcguard" / "testing" / "models.py"
"""The benchmark transformer, loaded by path: the peer's virtualenv has PyPI's ``sdcguard``, not this one."""

SIZE = {"d": 256, "heads": 4, "layers": 4, "seq": 128, "batch": 8}
WORKER_CONFIGS = {"ours": ("ours",), "peer": ("peer-linear", "peer-all")}
"""The configurations each worker runs (besides ``plain``, no checker)."""


def load_by_path(path: Path, name: str) -> ModuleType:
    """The module in the file ``path``, imported under ``name`` (never through ``sys.path``)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class WorkerState:
    """One worker's models, tools and sessions; each ``cmd_*`` method is a command of the protocol."""

    def __init__(self, kind: str, seed: int) -> None:
        import torch

        torch.set_num_threads(1)
        if kind == "ours":
            sys.path.insert(0, str(ROOT))
        models = load_by_path(MODELS, "_benchmark_models")
        TinyTransformer, lm_loss, make_batch = models.TinyTransformer, models.lm_loss, models.make_batch

        self.torch, self.lm_loss, self.make_batch = torch, lm_loss, make_batch
        self.kind, self.seed = kind, seed
        self.inj_mod = load_by_path(INJECTOR, "sdc_fault_injector")
        self.checkers = load_by_path(CHECKERS, "_peer_checksums_checkers")
        self.injector_sha256 = hashlib.sha256(INJECTOR.read_bytes()).hexdigest()
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

            self.skip_files = tuple(
                sorted({str(p) for m in (cb, cs) for p in (Path(m.__file__), Path(m.__file__).resolve())})
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
        tools = self.checkers
        if config == "plain":
            sess: Any = tools.Plain(model)
        elif config == "ours":
            from sdcguard.training.checksums.bound import DEFAULT_ROWS

            sess = tools.Ours(model, DEFAULT_ROWS)
        elif config in ("peer-linear", "peer-all"):
            sess = tools.Peer(model, linear=config == "peer-linear")
        elif config == "peer-linear-idle":
            sess = tools.Peer(model, linear=True, every=self.default_every())
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
            plain = [signature(o) for o in per["plain"]["ops"]]
            out["census"][dtype] = per["plain"]["ops"]
            out["census_check"][dtype] = {
                c: {
                    "same_as_plain": [signature(o) for o in v["ops"]] == plain,
                    "matmuls": len(v["ops"]),
                    "foreign": v["foreign"],
                    "checks": v["checks"],
                    "first_difference": _first_diff(plain, [signature(o) for o in v["ops"]]),
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
            res = sess.run(lambda b=batch: self.fwd_bwd(model, b, dtype), self.checkers.Null(), n)
            opt.step()
            opt.zero_grad(set_to_none=True)
            tally["steps"] += 1
            for k in ("alarms", "checked", "run", "skipped_dtype", "unjudged"):
                tally[k] += int(res.get(k, 0) or 0)
            if res["alarms"]:
                tally["alarm_steps"] += 1
                if len(tally["first_alarms"]) < 5:
                    tally["first_alarms"].append({"step": n, "first": res.get("first")})
        if isinstance(sess, self.checkers.Peer):
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
                sess.run(lambda m=model, b=batch: self.fwd_bwd(m, b, dtype), self.checkers.Null(), step)
                opt.step()
                opt.zero_grad(set_to_none=True)
                ts.append(time.perf_counter() - t0)
            times[config] = ts[-steps:]
        return times


def signature(o: dict[str, Any]) -> tuple[Any, ...]:
    """What makes a numbered matmul the same op in two steps: op, operand and output shapes, pass, kind, layer."""
    return (o["op"], tuple(o["a"]), tuple(o["b"]), tuple(o.get("out", ())), o["pass"], o["kind"], o["where"])


def _first_diff(a: list[Any], b: list[Any]) -> Any:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return {"index": i, "plain": list(x), "this": list(y)}
    return None if len(a) == len(b) else {"index": min(len(a), len(b)), "lengths": [len(a), len(b)]}


def worker_main(kind: str, seed: int) -> int:
    """Serve the parent's commands (one JSON line each on stdin, one reply each on stdout) until ``quit``."""
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # anything else printed goes to stderr: stdout carries the protocol only
    sys.stdout = sys.stderr
    try:
        state = WorkerState(kind, seed)
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


def main() -> int:
    p = argparse.ArgumentParser(description="a worker of benchmarks/peer_checksums (started by its parent)")
    p.add_argument("--kind", choices=tuple(WORKER_CONFIGS), required=True)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    return worker_main(args.kind, args.seed)


if __name__ == "__main__":
    sys.exit(main())
