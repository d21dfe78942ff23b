"""Who is wrong when computations of one micro-batch disagree: blame needs a majority of independent devices.

A sampled micro-batch is computed at least twice: the original on its owner's device and a replay on another
device. When they differ, every device recomputes it once more (the owner's recomputation is a *rerun*), and
:func:`judge` settles the disagreement from those opinions:

- a value is *agreed* when a strict majority of the voters, and at least two of them, computed it; voters are the
  devices' reruns (in a single process, where there is one device, the reruns themselves);
- with an agreed value, every device that computed anything else is at fault: the owner when its original differs
  (the step itself is corrupt and is vetoed), sticky when its rerun reproduces the wrong result, transient when
  not; a replaying device whose replay differs (the step is fine); any device whose rerun differs;
- without one (no two voters agree, or two devices each reproduce their own result with nobody to decide), the
  cause cannot be hardware on one device: it is software nondeterminism (or, with two devices, undecidable), no
  device is named and the step is not vetoed.

So a sticky fault (the owner reproduces its wrong result) is outvoted by the other devices, a one-off fault by the
owner's own rerun agreeing with the replay, and randomness the guard cannot capture or order-dependent sums (no two
computations agree) never name a device. It is pure bookkeeping, no collectives: every rank holds the same
gathered opinions and reaches the same verdict.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..records import Incident
from .taps import Digest

__all__ = ["Opinion", "Judgement", "judge", "Attributor", "job_id"]


def job_id() -> str | None:
    """The launcher's job id (torchelastic or Slurm), recorded with every incident."""
    return os.environ.get("TORCHELASTIC_RUN_ID") or os.environ.get("SLURM_JOB_ID")


@dataclass(frozen=True)
class Opinion:
    """One computation of the micro-batch: who computed it (a global rank) and what came out."""

    rank: int
    digest: Digest


@dataclass(frozen=True)
class Judgement:
    """The verdict on one disagreement."""

    agreed: Digest | None
    """The value a strict majority of independent voters computed; None when there is none."""
    blamed: dict[int, bool] = field(default_factory=dict)
    """Global rank -> sticky (True: its rerun reproduced its wrong result)."""
    original_corrupt: bool = False
    """The owner's original computation differs from the agreed value: the step is corrupt."""
    how: str = ""
    """One sentence: how it was decided."""
    first_unit: int | None = None
    """Index of the first unit whose gradient differs from the agreed value (None: only the loss, or unknown)."""


def _majority(voters: Sequence[Opinion]) -> Digest | None:
    values: list[tuple[Digest, int]] = []
    for v in voters:
        for i, (d, n) in enumerate(values):
            if d == v.digest:
                values[i] = (d, n + 1)
                break
        else:
            values.append((v.digest, 1))
    best = max(values, key=lambda dn: dn[1], default=None)
    if best is None or best[1] < 2 or best[1] * 2 <= len(voters):
        return None
    return best[0]


def judge(original: Opinion, replay: Opinion | None, reruns: Sequence[Opinion]) -> Judgement:
    """Settle a disagreement between ``original`` (the owner's computation) and ``replay`` (another device's; None
    in a single process) from ``reruns``: one more computation per device. See the module docstring for the rule.

    In a single process there is one device: ``reruns`` are two recomputations on it and the original votes too
    (three opinions; the one the other two contradict is wrong; a sticky fault cannot be told from the truth)."""
    single = replay is None
    voters = [original, *reruns] if single else list(reruns)
    agreed = _majority(voters)
    if agreed is None:
        values = len({r.digest.units for r in voters})
        how = (f"no two of the {len(voters)} computations agree: software nondeterminism, not hardware"
               if values == len(voters) else
               "the devices each reproduce their own result and no majority decides between them")
        return Judgement(agreed=None, how=how)
    owner = original.rank
    blamed: dict[int, bool] = {}
    wrong_rerun = {r.rank for r in reruns if r.digest != agreed}
    first: int | None = None
    parts = []
    corrupt = original.digest != agreed
    if corrupt:
        blamed[owner] = owner in wrong_rerun
        first = agreed.first_difference(original.digest)
        parts.append(f"rank {owner}'s original differs from what the majority computed, "
                     + ("and its rerun reproduced it (sticky)" if blamed[owner] else "and its rerun agrees with the majority (transient)"))
    if replay is not None and replay.digest != agreed:
        blamed[replay.rank] = replay.rank in wrong_rerun
        first = first if first is not None else agreed.first_difference(replay.digest)
        parts.append(f"rank {replay.rank}'s replay differs from the majority"
                     + (" and so does its rerun (sticky)" if blamed[replay.rank] else ""))
    for r in reruns:
        if r.digest != agreed and r.rank not in blamed:
            blamed[r.rank] = False
            first = first if first is not None else agreed.first_difference(r.digest)
            parts.append(f"rank {r.rank}'s recomputation differs from the majority")
    devices = len({r.rank for r in voters})
    how = "; ".join(parts) + (f" ({sum(1 for r in voters if r.digest == agreed)} of {len(voters)} computations on "
                              f"{devices} device(s) agree)")
    return Judgement(agreed=agreed, blamed=blamed, original_corrupt=corrupt, how=how, first_unit=first)


class Attributor:
    """Turns judgements into incidents that name the suspects' devices and hosts."""

    def __init__(self, unit_names: Sequence[str], identities: dict[int, tuple[str | None, str]]) -> None:
        self.unit_names = list(unit_names)
        self.identities = identities
        """Global rank -> (device id, hostname)."""

    def replay_incidents(self, step: int, settled: Sequence[tuple[int, Judgement]]) -> list[Incident]:
        """One incident per blamed rank (a device named alone, by majority), from the ``(owner's global rank,
        judgement)`` of every disagreement settled at ``step`` (a sticky device spoils its own micro-batch and the
        one it replays: one incident says both)."""
        by_rank: dict[int, list[tuple[int, Judgement, bool]]] = {}
        for owner, j in settled:
            for rank, sticky in j.blamed.items():
                by_rank.setdefault(rank, []).append((owner, j, sticky))
        out = []
        for rank, items in sorted(by_rank.items()):
            first = next((j.first_unit for _, j, _ in items if j.first_unit is not None), None)
            parts = []
            for owner, j, _ in items:
                where = f"first at {self.unit_names[j.first_unit]!r}" if j.first_unit is not None else "in the loss"
                parts.append(f"rank {owner}'s micro-batch computed differently {where}: {j.how}")
            param = self.unit_names[first] if first is not None else None
            detail = f"step {step}: " + ". ".join(parts)
            out.append(self.incident("replay", step, (rank,), detail, parameter=param,
                                     sticky=any(s for _, _, s in items)))
        return out

    def nondeterministic(self, step: int, what: str, causes: Sequence[str]) -> Incident:
        """The setup was found not to replay bit for bit: reported once, blamed on no device."""
        detail = (f"step {step}: {what}; replay checks are off for this run (cross-replica checks stay on). "
                  f"Likely causes: {'; '.join(causes)}")
        return self.incident("nondeterministic", step, (), detail)

    def incident(self, kind: str, step: int, suspects: tuple[int, ...], detail: str, *,
                 parameter: str | None = None, sticky: bool | None = None) -> Incident:
        devices = tuple(self.identities.get(r, (None, ""))[0] or "" for r in suspects)
        hosts = tuple(self.identities.get(r, (None, ""))[1] for r in suspects)
        return Incident(kind=kind, step=step, suspect_ranks=suspects,
                        device=(devices[0] or None) if len(suspects) == 1 else None,
                        detail=detail, devices=devices, hosts=hosts, parameter=parameter, sticky=sticky,
                        job=job_id())
