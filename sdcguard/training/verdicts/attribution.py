"""Who is wrong when computations of one micro-batch disagree: the rule of evidence.

A sampled micro-batch is computed at least twice: the original on its owner's device and a replay on another
device. When they differ, the devices compute it once more (the owner's recomputation is a *rerun*: the same
input, the same weights, the same device), and :func:`judge` settles the disagreement from every computation.
Each device's computations are its *opinions*; a device that computed twice either reproduced itself bit for bit
(*self-consistent*) or not (*self-inconsistent*). The rule, in order:

1. **Software** when two or more devices are self-inconsistent in one settlement: the setup does not replay bit
   for bit (uncaptured randomness, order-dependent sums). No device is named, the step is not vetoed for it, and
   replay turns off for the run. Also software, where the evidence cannot separate a device from its setup: the
   self-consistent devices split into value groups that coincide exactly with groups of different *setups* (device
   model, driver, library versions: gathered at construction), which is the setup computing differently, not a
   fault, unless a strict majority (rule 2) stands against values each computed by one device alone: a setup's
   difference shows on every device of that setup, so a lone device of another setup contradicted by a strict
   majority is that device (setups A, B, B with the A device wrong: hardware, A named), while two devices of one
   setup agreeing against the rest are that setup (software).
2. **Hardware** when a value is *agreed*: computed by at least two devices and by a strict majority of the devices
   (one vote per device, for each value it computed); or, failing that, when exactly one device is
   self-inconsistent and every other device computed the same value, at least one of them twice (a device that
   reproduces itself is deterministic; the one that did not had a fault). Every device that computed anything
   else is at fault: *sticky* when it computed at least twice and every computation was wrong (it reproduces its
   fault), *transient* when not.
   The step is corrupt when the owner's original differs from the agreed value.
3. **Unresolved** otherwise (two self-consistent devices disagree and nothing decides between them, or a tie):
   every device of the disagreement is a suspect, the step is treated as corrupt, and nothing is said about
   software. A verdict that cannot name the device is never evidence for "software".

In a single process there is one device: its original and two reruns vote as computations (two agreeing against
one name the odd one transient); all three differing is software (a device that never reproduces itself).

Nothing depends on how many faulty devices a job has or had before: each settlement is judged on its own
computations. It is pure bookkeeping, no collectives: every rank holds the same gathered opinions and reaches the
same verdict. The verdict assumes that two independent faults do not produce the same wrong bits (a majority of
identical wrong results would be taken for the truth).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from ...records import Incident
from ..digest import Digest

__all__ = ["Opinion", "Judgement", "Verdict", "settle", "judge", "Attributor"]

Verdict = Literal["hardware", "unresolved", "software"]


@dataclass(frozen=True)
class Opinion:
    """One computation of the micro-batch: who computed it (a global rank) and what came out."""

    rank: int
    digest: Digest


@dataclass(frozen=True)
class Judgement:
    """The verdict on one disagreement."""

    verdict: Verdict
    agreed: Digest | None = None
    """The value the evidence settled on (hardware verdicts only)."""
    blamed: dict[int, bool] = field(default_factory=dict)
    """Hardware: global rank -> sticky (True: every one of its two or more computations was wrong alike)."""
    suspects: tuple[int, ...] = ()
    """Unresolved: every device of the disagreement (global ranks)."""
    inconsistent: tuple[int, ...] = ()
    """Devices that did not reproduce their own result."""
    original_corrupt: bool = False
    """The step must not be committed: the owner's original differs from the agreed value (hardware), or nobody
    can tell (unresolved)."""
    how: str = ""
    """One sentence: how it was decided."""
    first_unit: int | None = None
    """Index of the first unit whose gradient differs (None: only the loss, or unknown)."""


def _values(computations: Mapping[int, Sequence[Digest]]) -> list[tuple[Digest, set[int]]]:
    """Distinct values and the devices that computed each (in first-seen order)."""
    out: list[tuple[Digest, set[int]]] = []
    for dev, digests in computations.items():
        for d in digests:
            for value, devs in out:
                if value == d:
                    devs.add(dev)
                    break
            else:
                out.append((d, {dev}))
    return out


def _distinct(digests: Sequence[Digest]) -> int:
    seen: list[Digest] = []
    for d in digests:
        if not any(d == s for s in seen):
            seen.append(d)
    return len(seen)


def settle(computations: Mapping[int, Sequence[Digest]], setups: Mapping[int, Hashable] | None = None) -> Judgement:
    """The rule of the module docstring over ``computations`` (global rank -> its computations of the micro-batch,
    in order) and ``setups`` (global rank -> what the device runs: model, driver, versions; None: all alike).
    Corruption of an original is the caller's to decide (see :func:`judge`)."""
    devices = sorted(computations)
    if not devices:
        raise ValueError("settle() needs at least one computation")
    inconsistent = tuple(d for d in devices if _distinct(computations[d]) > 1)
    if len(devices) == 1:
        return _one_device(devices[0], computations[devices[0]])
    if len(inconsistent) >= 2:
        return Judgement(
            verdict="software",
            inconsistent=inconsistent,
            how=f"{len(inconsistent)} devices (ranks {_ranks(inconsistent)}) each computed the same "
            "micro-batch differently on a second try: the setup does not replay bit for bit",
        )
    values = _values(computations)
    consistent = [d for d in devices if d not in inconsistent]
    agreed = next((v for v, devs in values if len(devs) >= 2 and 2 * len(devs) > len(devices)), None)
    # a strict majority against lone devices separates each of them from its setup (rule 1): only otherwise can the
    # setups' difference explain the split
    separated = agreed is not None and all(len(devs) == 1 for v, devs in values if v != agreed)
    if setups is not None and not separated and _split_by_setup(values, consistent, setups):
        return Judgement(
            verdict="software",
            how="the devices that disagree run different setups (device model, "
            "driver or library versions) and each setup reproduces its own result: the setups compute "
            "differently; no device is at fault",
        )
    how = ""
    if agreed is not None:
        n = next(len(devs) for v, devs in values if v == agreed)
        how = f"{n} of {len(devices)} devices computed the same result"
    elif (
        len(inconsistent) == 1
        and len({_index(values, computations[d][0]) for d in consistent}) == 1
        and any(len(computations[d]) >= 2 for d in consistent)
    ):
        agreed = computations[consistent[0]][0]
        how = (
            f"rank {inconsistent[0]} did not reproduce its own result while every other device computed one "
            "result, and reproduced it"
        )
    if agreed is None:
        return Judgement(
            verdict="unresolved",
            suspects=tuple(devices),
            inconsistent=inconsistent,
            original_corrupt=True,
            how=f"the {len(devices)} devices (ranks {_ranks(devices)}) disagree, "
            + ("each reproducing its own result, " if not inconsistent else "")
            + "and no majority decides between them",
        )
    blamed: dict[int, bool] = {}
    first: int | None = None
    for d in devices:
        wrong = [c for c in computations[d] if c != agreed]
        if wrong:
            blamed[d] = len(wrong) == len(computations[d]) >= 2 and d not in inconsistent
            first = first if first is not None else agreed.first_difference(wrong[0])
    return Judgement(
        verdict="hardware", agreed=agreed, blamed=blamed, inconsistent=inconsistent, how=how, first_unit=first
    )


def _one_device(dev: int, digests: Sequence[Digest]) -> Judgement:
    counts = [(d, sum(1 for e in digests if e == d)) for d in digests]
    best = max(counts, key=lambda dn: dn[1])
    if best[1] >= 2 and 2 * best[1] > len(digests):
        agreed = best[0]
        wrong = [d for d in digests if d != agreed]
        return Judgement(
            verdict="hardware",
            agreed=agreed,
            blamed={dev: False} if wrong else {},
            first_unit=agreed.first_difference(wrong[0]) if wrong else None,
            how=f"{best[1]} of {len(digests)} computations on the one device agree",
        )
    return Judgement(
        verdict="software",
        inconsistent=(dev,),
        how=f"no two of the {len(digests)} computations on the one device agree: software nondeterminism, not hardware",
    )


def _index(values: list[tuple[Digest, set[int]]], d: Digest) -> int:
    return next(i for i, (v, _) in enumerate(values) if v == d)


def _split_by_setup(
    values: list[tuple[Digest, set[int]]], consistent: list[int], setups: Mapping[int, Hashable]
) -> bool:
    """True when the self-consistent devices form two or more value groups whose setups never mix."""
    groups: dict[int, set[Hashable]] = {}
    for d in consistent:
        groups.setdefault(_index(values, next(v for v, devs in values if d in devs)), set()).add(setups.get(d))
    if len(groups) < 2:
        return False
    kinds = list(groups.values())
    return all(len(k) >= 1 and not (k & other) for i, k in enumerate(kinds) for other in kinds[i + 1 :])


def _ranks(ranks: Sequence[int]) -> str:
    return ", ".join(map(str, ranks))


def judge(
    original: Opinion,
    others: Sequence[Opinion],
    setups: Mapping[int, Hashable] | None = None,
    *,
    contemporary: bool = True,
) -> Judgement:
    """Settle a disagreement between ``original`` (the owner's computation of the step) and ``others`` (every
    other computation of the same micro-batch: the replay, the reruns, the owner's own rerun), by
    :func:`settle`; the owner's original decides whether the step is corrupt.

    ``contemporary=False``: the original was computed steps before the others (a dedicated shadow's verdict comes
    later), so it says nothing about whether the owner reproduces itself *now*: it is judged against the verdict
    but not counted among the owner's computations."""
    computations: dict[int, list[Digest]] = {original.rank: [original.digest]} if contemporary else {}
    for o in others:
        computations.setdefault(o.rank, []).append(o.digest)
    j = settle(computations, setups)
    if j.verdict != "hardware":
        return j
    assert j.agreed is not None
    corrupt = original.digest != j.agreed
    blamed = dict(j.blamed)
    if corrupt and original.rank not in blamed:  # its later computations were right: the original was a one-off
        blamed[original.rank] = False
    parts = []
    for rank, sticky in sorted(blamed.items()):
        what = "original" if rank == original.rank and corrupt else "computation"
        parts.append(
            f"rank {rank}'s {what} differs from the agreed result"
            + (" and it reproduced that (sticky)" if sticky else " (transient)")
        )
    how = "; ".join(parts) + f" ({j.how})"
    first = j.agreed.first_difference(original.digest) if corrupt else j.first_unit
    return Judgement(
        verdict="hardware",
        agreed=j.agreed,
        blamed=blamed,
        inconsistent=j.inconsistent,
        original_corrupt=corrupt,
        how=how,
        first_unit=first,
    )


class Attributor:
    """Turns judgements into incidents that name the suspects' devices and hosts."""

    def __init__(
        self,
        unit_names: Sequence[str],
        identities: dict[int, tuple[str | None, str]],
        *,
        job: str | None = None,
        job_size: int | None = None,
    ) -> None:
        self.unit_names = list(unit_names)
        self.identities = identities
        """Global rank -> (device id, hostname)."""
        self.job = job
        """The job's id, recorded with every incident (one job: the fleet's training breaker never pools two)."""
        self.job_size = job_size
        """How many devices the job's guard watches (the breaker weighs the devices named against it)."""

    def replay_incidents(
        self, step: int, settled: Sequence[tuple[int, Judgement]], *, kind: str = "replay"
    ) -> list[Incident]:
        """One incident per blamed rank (hardware verdicts), from the ``(owner's global rank, judgement)`` of every
        disagreement settled at ``step`` (a sticky device spoils its own micro-batch and the one it replays: one
        incident says both)."""
        by_rank: dict[int, list[tuple[int, Judgement, bool]]] = {}
        for owner, j in settled:
            for rank, sticky in j.blamed.items():
                by_rank.setdefault(rank, []).append((owner, j, sticky))
        out = []
        for rank, items in sorted(by_rank.items()):
            first = next((j.first_unit for _, j, _ in items if j.first_unit is not None), None)
            detail = f"step {step}: " + ". ".join(
                f"rank {owner}'s micro-batch computed differently {self._where(j)}: {j.how}" for owner, j, _ in items
            )
            out.append(
                self.incident(
                    kind, step, (rank,), detail, parameter=self._unit(first), sticky=any(s for _, _, s in items)
                )
            )
        return out

    def unresolved(self, step: int, owner: int, j: Judgement, *, alone: bool) -> Incident:
        """Evidence that cannot pick the device: both (all) devices are suspects, the step is treated as corrupt."""
        more = (
            " No third device exists in this job to decide; on_detect decides what happens (restarting "
            "elsewhere settles it)."
            if alone
            else " A repeat of this escalates."
        )
        detail = (
            f"step {step}: rank {owner}'s micro-batch computed differently {self._where(j)}: {j.how}; "
            f"unresolved: every one of them is a suspect and the step is treated as corrupt.{more}"
        )
        return self.incident("unresolved", step, j.suspects, detail, parameter=self._unit(j.first_unit))

    def nondeterministic(self, step: int, what: str, causes: Sequence[str]) -> Incident:
        """The setup was found not to replay bit for bit: reported once, blamed on no device."""
        detail = (
            f"step {step}: {what}; replay checks are off for this run (cross-replica checks stay on). "
            f"Likely causes: {'; '.join(causes)}"
        )
        return self.incident("nondeterministic", step, (), detail)

    def incident(
        self,
        kind: str,
        step: int,
        suspects: tuple[int, ...],
        detail: str,
        *,
        parameter: str | None = None,
        sticky: bool | None = None,
    ) -> Incident:
        devices = tuple(self.identities.get(r, (None, ""))[0] or "" for r in suspects)
        hosts = tuple(self.identities.get(r, (None, ""))[1] for r in suspects)
        return Incident(
            kind=kind,
            step=step,
            suspect_ranks=suspects,
            device=(devices[0] or None) if len(suspects) == 1 else None,
            detail=detail,
            devices=devices,
            hosts=hosts,
            parameter=parameter,
            sticky=sticky,
            job=self.job,
            job_size=self.job_size,
        )

    def _unit(self, index: int | None) -> str | None:
        return self.unit_names[index] if index is not None and index < len(self.unit_names) else None

    def _where(self, j: Judgement) -> str:
        name = self._unit(j.first_unit)
        return f"first at {name!r}" if name is not None else "in the loss"
