"""What a step's checksum checks conclude, on every rank alike: which ranks' matmuls failed, and the incidents.

:class:`ChecksumCheck` is one of the guard's step checks (:mod:`sdcguard.training.step_check`, slice ``"checksum"``):
every rank puts two int64 values into the step's one all-gather (:func:`columns`: how many of its matmuls failed after
the same-device recompute, how many of those failed again); from the gathered table every rank knows whether the step is
corrupt, with no collective of its own. Only when some rank failed are the failures' descriptions (:class:`FailureNote`:
layer, op, pass) gathered, so every rank builds the same incidents. The check is local: the rank that computed the
matmul is the suspect, alone, with no vote; *sticky* when the recompute failed again (escalates, like a sticky replay
verdict: :mod:`..verdicts.outcomes`), *transient* when it passed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ...records import Incident
from ..comm import Comm
from ..step_check import CheckResult, StepState
from ..verdicts.attribution import Attributor
from .mode import ChecksumFailure, ChecksumMode

__all__ = ["columns", "WIDTH", "checksum_incidents", "FailureNote", "ChecksumCheck"]

WIDTH = 2
"""The columns :func:`columns` adds to the step's gather."""


def columns(failures: Sequence[ChecksumFailure]) -> list[int]:
    """This rank's values for the gather: failed matmuls, and those that failed again on the recompute."""
    return [len(failures), sum(1 for f in failures if f.sticky)]


def _describe(f: ChecksumFailure) -> str:
    verdict = {
        True: "the same-device recompute failed again (sticky)",
        False: "the same-device recompute passed (transient: the first result or its check was wrong once)",
        None: "its operands changed in place since, so it could not be recomputed",
    }[f.sticky]
    return f"{f.op} ({f.phase}) in {f.where}: {f.blocks} checksum block column(s) over the rounding bound; {verdict}"


@dataclass(frozen=True, kw_only=True)
class FailureNote:
    """What a rank says of one failed matmul when the failures are gathered."""

    op: str
    where: str
    phase: str
    description: str
    sticky: bool | None

    @classmethod
    def of(cls, f: ChecksumFailure) -> FailureNote:
        return cls(op=f.op, where=f.where, phase=f.phase, description=_describe(f), sticky=f.sticky)


def checksum_incidents(
    comm: Comm, attr: Attributor, step: int, table: Sequence[Sequence[int]], failures: Sequence[ChecksumFailure]
) -> list[Incident]:
    """The incidents of a step whose gathered checksum ``table`` (one row of :data:`WIDTH` per member) shows a
    failure; [] otherwise. Collective (every rank calls it with the same table)."""
    if not any(row[0] for row in table):
        return []
    described: list[list[FailureNote]] = comm.gather_objects([FailureNote.of(f) for f in failures])
    out = []
    for rank, notes in zip(comm.members, described):
        if not notes:
            continue
        identity = attr.identities.get(rank, (None, ""))
        where = f"rank {rank} ({identity[0] or 'device unknown'}, host {identity[1] or 'unknown'})"
        detail = (
            f"step {step}: a matmul result failed its checksum on {where}: "
            + "; ".join(n.description for n in notes)
            + ". The check is local: the rank that computed is the suspect."
        )
        sticky = True if any(n.sticky for n in notes) else (None if any(n.sticky is None for n in notes) else False)
        first = notes[0]
        out.append(
            attr.incident(
                "checksum", step, (rank,), detail, parameter=f"{first.where} [{first.op}, {first.phase}]", sticky=sticky
            )
        )
    return out


class ChecksumCheck:
    """The matmul checksums as a step check (see the module docstring): the step's failures are read (and
    recomputed) when its columns are asked for."""

    name = "checksum"

    def __init__(self, mode: ChecksumMode, comm: Comm, attr: Attributor, device: torch.device) -> None:
        self.mode = mode
        self.comm = comm
        self.attr = attr
        self.device = device
        self._failures: list[ChecksumFailure] = []
        self._checked = False
        self.run = self.checked = self.unverifiable = 0
        """The matmuls this rank ran, checked and found unverifiable on the last checked step (0 on other steps)."""
        self.named: tuple[str, ...] = ()
        """Why those were unverifiable, one line per setting (:meth:`ChecksumMode.named`)."""

    def columns(self, state: StepState) -> torch.Tensor:
        self._checked = self.mode.active
        self._failures = self.mode.end()  # recomputes a failed matmul on this device before anyone is blamed
        self.run, self.checked = (self.mode.run, self.mode.checked) if self._checked else (0, 0)
        self.unverifiable, self.named = (self.mode.unverifiable, self.mode.named()) if self._checked else (0, ())
        return torch.tensor(columns(self._failures), dtype=torch.int64, device=self.device)

    def conclude(self, state: StepState, rows: Sequence[Sequence[int]]) -> CheckResult:
        found = checksum_incidents(self.comm, self.attr, state.step, rows, self._failures)
        return CheckResult(
            incidents=tuple(found), veto=any(row[0] for row in rows), ran="checksum" if self._checked else None
        )
