"""The tools under test, one training step each: no checker, our ``ChecksumMode``, the peer's ``SDCGuard``.

Loaded by path in a worker process (:mod:`benchmarks.peer_checksums.worker`): ours in the project's virtualenv,
the peer's in its own, where ``sdcguard`` is PyPI's. Each tool's ``run(fn, inj, step)`` runs ``fn`` (forward and
backward) under the tool and the injector's two modes in the order the injector needs (``below()`` outermost,
``above()`` innermost), and returns what the tool found on that step.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Null", "Plain", "Ours", "Peer"]


class Null:
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
