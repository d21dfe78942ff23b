"""What a training fault drill did, said by the end of its run: an injector that changed nothing says so.

A drill whose settings the training never meets (``mode.step`` never set, a step the loop never reaches, an op
family the model does not run, a pass the fault never sees) changes nothing, and its silence reads like a fault the
guard missed. Each torch injector (:class:`~sdcguard.inject.torch_faults.OpFaultMode`,
:class:`~sdcguard.inject.torch_faults.CorruptingCommHook`) keeps a :class:`DrillLog` as ``.drill``: it gates each
call on the target rank and the drill's steps, counts what reached the injector and what was changed, and
:meth:`DrillLog.finish` (called by the end of the run, or when the injector is garbage collected or the process
exits) logs one warning through ``sdcguard.inject`` when nothing was injected, with the likely reason. The records
(``.records``) stay the exact account of every changed element; :meth:`DrillLog.summary` is the one-line account.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Sequence
from typing import Any

from ..logs import get_logger

__all__ = ["DrillLog"]

_log = get_logger("inject")


class DrillLog:
    """The account of one injector, ``owner`` (its settings ``shown`` in its name, e.g.
    ``OpFaultMode(rank=1, steps=[5], ops=matmul)``); :meth:`finish` runs when the owner is garbage collected or the
    process exits, unless it ran before.

    ``rank``: the rank it injects on (None: every rank); ``steps``: the steps it injects at (None: every step),
    read against the step the training loop sets on the injector (``.step``)."""

    def __init__(self, owner: object, *, rank: int | None, steps: frozenset[int] | None, **shown: object) -> None:
        # This process is a drill now: its records go to a drill store, never the fleet's record
        # (sdcguard.fleet.store.drills reads the variable; its workers and children inherit it).
        os.environ["SDCGUARD_DRILL"] = "1"
        settings = {"rank": rank, "steps": None if steps is None else sorted(steps), **shown}
        self.name = f"{type(owner).__name__}({', '.join(f'{k}={v}' for k, v in settings.items())})"
        weakref.finalize(owner, self.finish)  # the callback holds this log, never the owner
        self.rank = rank
        self.steps = steps
        self.rank_seen: int | None = None
        """The rank of the last call that reached the injector (None: none did in this process)."""
        self.calls = 0
        """Calls on the target rank (matching ops, or buckets)."""
        self.calls_in_steps = 0
        """Of those, calls at one of the drill's steps."""
        self.changed = 0
        """Elements changed (one record each)."""
        self.targets: dict[str, int] = {}
        """What was hit (``aten.mm``, ``comm_hook:bucket0``) -> elements changed."""
        self.steps_hit: set[int] = set()
        self._unset_step_told = False
        self._finished = False

    def gate(self, rank: int, step: int | None, steps: frozenset[int] | None) -> bool:
        """True when a call on ``rank`` at ``step`` is one the drill injects into (before the fault's own timing);
        ``steps``: the owner's steps as they are now (a caller may change them between steps)."""
        self.rank_seen, self.steps = rank, steps
        if self.rank is not None and rank != self.rank:
            return False
        self.calls += 1
        if self.steps is None:
            self.calls_in_steps += 1
            return True
        if step is None and not self._unset_step_told:
            self._unset_step_told = True
            _log.warning(
                "%s: its .step is not set, so it injects nothing: set it to the training step before each step",
                self.name,
            )
        if step is None or step not in self.steps:
            return False
        self.calls_in_steps += 1
        return True

    def add(self, into: list[Any], records: Sequence[Any]) -> None:
        """Append the records of one call (each has ``target`` and ``step``) to the owner's ``into``, counted."""
        into.extend(records)
        for r in records:
            self.changed += 1
            self.targets[r.target] = self.targets.get(r.target, 0) + 1
            if r.step is not None:
                self.steps_hit.add(r.step)

    def summary(self) -> str:
        """One line: what was injected, or why nothing was."""
        if self.changed:
            hits = ", ".join(f"{t} x{n}" for t, n in sorted(self.targets.items()))
            at = f" at step(s) {sorted(self.steps_hit)}" if self.steps_hit else ""
            return f"{self.name} injected {self.changed} corrupted element(s){at}: {hits}"
        return f"{self.name} injected nothing: {self._why_nothing()}"

    def _why_nothing(self) -> str:
        if self.rank_seen is None:
            return "no call it watches ran in this process (another op family or pass? a model without such ops?)"
        if self.rank is not None and self.rank_seen != self.rank:
            return f"this process is rank {self.rank_seen}, the drill injects on rank {self.rank}"
        if self.steps is not None and self.calls_in_steps == 0:
            return (
                f"{self.calls} call(s) on its rank, none at its step(s) {sorted(self.steps)} "
                "(is .step set each step, and does the loop reach those steps?)"
            )
        return (
            f"{self.calls_in_steps} call(s) at its steps, and the fault's timing, rate, value range or occurrence "
            "left every one unchanged"
        )

    def targeted_here(self) -> bool:
        """Whether this process is one the drill was meant to inject on (as far as it has seen)."""
        return self.rank is None or self.rank_seen is None or self.rank_seen == self.rank

    def finish(self) -> str:
        """Say what the drill did, once: a warning through the ``sdcguard.inject`` logger when it injected nothing
        in a process it targets. Returns :meth:`summary`."""
        text = self.summary()
        if not self._finished and not self.changed and self.targeted_here():
            _log.warning("%s", text)
        self._finished = True
        return text
