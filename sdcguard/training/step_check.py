"""One shape for every check the guard makes on a step, the one rule that turns their results into a decision, and
the cadence of the sampled and checksummed steps.

A :class:`StepCheck` (the cross-replica check, the sampled round, the matmul checksums, the timing of slow ranks, and
each mesh check to come) adds its *slice* to the step's one all-gather, by name, and from the gathered slice of
every rank concludes a :class:`CheckResult`: its incidents, whether the step must not be committed, and whether the
check ran. :func:`gather_step` builds the gather from the slices and hands each check back its own
(:class:`StepTable`, by name: no check cuts another's columns by position); :func:`decide` is the rule.

Never hangs a job: a slice's width is the same on every rank (it depends only on values every rank holds alike), so
the gather is one fixed-size collective; a check's conclusion may issue more collectives only on values every rank
gathered alike, so every rank enters them together. Checks conclude in the order the guard lists them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, get_args

import torch

from ..records import Incident
from .comm import Comm
from .replay.observe import Observed
from .verdicts.local import explained

__all__ = [
    "Cadence",
    "Check",
    "StepState",
    "CheckResult",
    "StepCheck",
    "StepTable",
    "gather_step",
    "Decision",
    "decide",
]


Check = Literal["memory", "nonfinite", "reduction", "gradient_replica", "weight_replica", "replay", "checksum"]
"""A check by the name :class:`~sdcguard.training.config.StepReport` and incidents give it."""


@dataclass(frozen=True, kw_only=True)
class StepState:
    """What every check knows about the step being decided."""

    step: int
    sample: int
    """The sample counter (which pairing, which micro-batch): the same on every rank."""
    sampled: bool
    """Whether this step is replayed (the same on every rank)."""
    observed: Observed | None
    """This rank's sampled computation (None where its micro-batch is not the one checked)."""
    nonfinite: torch.Tensor | None = None
    """This rank's ``(losses not finite, backwards seeded above 1)`` (a device tensor; None: no loss observed)."""


@dataclass(frozen=True, kw_only=True)
class CheckResult:
    """What one check concluded about a step (identical on every rank)."""

    incidents: tuple[Incident, ...] = ()
    veto: bool = False
    """The step must not be committed (unless ``on_detect="record"``)."""
    ran: Check | None = None
    """The check, as :class:`~sdcguard.training.config.StepReport` names it, when it looked at this step."""


class StepCheck(Protocol):
    """A check of the step (see the module docstring). Every method is called on every rank, in the same order."""

    @property
    def name(self) -> str:
        """Its slice's name in the step's gather."""

    def columns(self, state: StepState) -> torch.Tensor:
        """This rank's int64 values for the gather (1-D, any device; the same width on every rank)."""

    def conclude(self, state: StepState, rows: Sequence[Sequence[int]]) -> CheckResult:
        """The result, from the gathered slice (one row per member, in group order)."""


class StepTable:
    """The step's gathered table, sliced back by check name."""

    def __init__(self, widths: Sequence[tuple[str, int]], table: Sequence[Sequence[int]]) -> None:
        self._slices: dict[str, slice] = {}
        at = 0
        for name, width in widths:
            if name in self._slices:
                raise ValueError(f"two checks share the slice name {name!r}")
            self._slices[name] = slice(at, at + width)
            at += width
        self._table = [list(row) for row in table]

    def rows(self, name: str) -> list[list[int]]:
        """Every member's values of slice ``name``."""
        s = self._slices[name]
        return [row[s] for row in self._table]


def gather_step(comm: Comm, parts: Sequence[tuple[str, torch.Tensor]], device: torch.device) -> StepTable:
    """The one all-gather of a step: every check's slice, concatenated on ``device`` (no host sync before the
    collective), gathered, and sliced back by name."""
    values = [v.reshape(-1).to(device=device, dtype=torch.int64) for _, v in parts]
    local = torch.cat(values) if values else torch.zeros(0, dtype=torch.int64, device=device)
    table = comm.gather_ints(local).tolist()
    return StepTable([(name, v.numel()) for (name, _), v in zip(parts, values)], table)


@dataclass(frozen=True, kw_only=True)
class Decision:
    """What the guard does with a step."""

    commit: bool
    incidents: tuple[Incident, ...]
    checks: tuple[Check, ...]


def decide(results: Sequence[CheckResult], *, record_only: bool) -> Decision:
    """The one rule: a step is committed unless some check vetoes it (and the guard does more than record:
    ``on_detect="record"`` commits every step); its incidents are every check's, in the checks' order, those a rank's
    own memory corruption explains narrowed to it (:func:`~.verdicts.local.explained`); the checks that ran are named
    in :data:`Check`'s order."""
    veto = any(r.veto for r in results)
    return Decision(
        commit=not (veto and not record_only),
        incidents=tuple(explained([i for r in results for i in r.incidents])),
        checks=tuple(sorted((r.ran for r in results if r.ran is not None), key=get_args(Check).index)),
    )


class Cadence:
    """Which steps a guard samples and checksums, and the counters that decide it.

    A step is sampled (one of its micro-batches replayed on another device) when its number is a multiple of
    ``replay_every`` and replays are still on; its matmuls are checked against their checksums when its number is a
    multiple of ``checksum_every`` (the guard sets 0 for a model with compiled regions: :mod:`.hooks.wrappers`). The
    sample counter drives the rounds' pairings and which micro-batch a sampled step records, so a resumed run carries
    it over (:meth:`state_dict`), and a promoted spare takes the workers' (:meth:`join`).

    Args:
        replay_every: sample one step in N (0: never).
        checksum_every: checksum-check one step in N (0: never).
    """

    def __init__(self, *, replay_every: int, checksum_every: int) -> None:
        self.replay_every = replay_every
        self.checksum_every = checksum_every
        self.steps = 0
        """Steps ended so far."""
        self.samples = 0
        """Sampled steps ended so far: the next sample's number."""
        self.last_step: int | None = None
        """The number of the last step ended."""
        self.sampled = False
        """Whether the step in progress is sampled."""

    def begin(self, step: int, *, replay_on: bool) -> bool:
        """Start step ``step`` (``replay_on``: replays have not proven nondeterministic); whether it is sampled."""
        every = self.replay_every
        self.sampled = every > 0 and step % every == 0 and replay_on
        return self.sampled

    def checksummed(self, step: int) -> bool:
        """Whether step ``step``'s matmuls are checked against their checksums."""
        return bool(self.checksum_every) and step % self.checksum_every == 0

    def end(self, step: int, *, sampled: bool) -> None:
        """Step ``step`` ended (``sampled``: it was a sampled one)."""
        if sampled:
            self.samples += 1
        self.steps += 1
        self.last_step = step

    def join(self, samples: int) -> None:
        """Take the group's sample counter (a promoted spare's counter was its own)."""
        self.samples = samples

    def state_dict(self) -> dict[str, Any]:
        return {"steps": self.steps, "samples": self.samples, "last_step": self.last_step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.steps, self.samples, self.last_step = int(state["steps"]), int(state["samples"]), state["last_step"]
