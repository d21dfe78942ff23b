"""Verdicts on tensor-parallel shards joined into verdicts on their tensor-parallel groups: blame per rank where a
fault stayed in one rank's shard, per group where it crossed the group's collectives.

Under tensor parallelism a micro-batch is computed by a *unit* (a tensor-parallel group: one rank per shard), and
each shard is judged on its own, by the data-parallel replicas holding the same shard (a *slice*,
:mod:`sdcguard.training.mesh`). The rule, applied to the judgements of every slice about the same micro-batch:

1. A fault that stays on one rank (its weight gradient, written after the last collective of the backward) spoils
   that rank's shard only: one slice names it, the others agree. The rank named stays named.
2. A fault whose result crosses the group's collectives (a forward output feeding an all-reduce, an activation
   gradient) spoils every shard the group computes after it: every slice names *its* member of the same unit, each
   self-consistent (the innocent partners computed faithfully from a corrupted input). The shard fingerprints cannot
   tell which member produced the first wrong value, so the named members of one unit become one ``unresolved``
   verdict naming the whole unit: never the innocent partner alone, and the faulty rank always among the suspects.
3. Unresolved verdicts of several slices about the same micro-batch are one unresolved verdict (their suspects
   together), joined with the units of rule 2.
4. Any software verdict leaves the whole micro-batch software (the setup does not replay).

Pure: a function of frozen judgements and the units, evaluated alike on every rank.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from .attribution import Judgement

__all__ = ["join_units"]

Unit = tuple[int, ...]


def join_units(
    settled: Sequence[tuple[int, Judgement]], unit_of: Callable[[int], Unit], word: str = "tensor-parallel"
) -> list[tuple[int, Judgement]]:
    """The slices' ``(owner, judgement)`` of one micro-batch, joined by the rule of the module docstring
    (``unit_of(rank)``: the ranks computing with ``rank``, itself included; ``word``: what a unit is, as the
    incident says it: ``tensor-parallel``, ``context-parallel``, ``expert-parallel``)."""
    if not settled:
        return []
    software = [(o, j) for o, j in settled if j.verdict == "software"]
    if software:
        return software[:1]
    named: dict[Unit, list[tuple[int, Judgement, int]]] = {}
    for owner, j in settled:
        if j.verdict == "hardware":
            for rank in j.blamed:
                named.setdefault(unit_of(rank), []).append((owner, j, rank))
    crossed = {u for u, items in named.items() if len({rank for _, _, rank in items}) >= 2}
    out: list[tuple[int, Judgement]] = []
    suspects: set[int] = set()
    for owner, j in settled:
        if j.verdict == "unresolved":
            suspects |= set(j.suspects)
            continue
        keep = {r: sticky for r, sticky in j.blamed.items() if unit_of(r) not in crossed}
        if keep or not j.blamed:
            out.append(
                (
                    owner,
                    Judgement(
                        verdict="hardware",
                        agreed=j.agreed,
                        blamed=keep,
                        inconsistent=j.inconsistent,
                        original_corrupt=j.original_corrupt and unit_of(owner) not in crossed,
                        how=j.how,
                        first_unit=j.first_unit,
                    ),
                )
            )
    for u in sorted(crossed):
        suspects |= set(u)
    if not suspects:
        return out
    joined = [(o, j) for o, j in settled if j.verdict == "unresolved" or any(unit_of(r) in crossed for r in j.blamed)]
    owner, first = joined[0]
    members = ", ".join(f"rank {r}" for r in sorted(suspects))
    how = (
        f"the shards of one micro-batch disagree on several {word} ranks at once ({members}): the fault "
        f"crossed the {word} collectives (or the replicas could not decide), so its source in the group "
        f"cannot be traced from the shards; {first.how}"
    )
    out.append(
        (
            owner,
            Judgement(
                verdict="unresolved",
                suspects=tuple(sorted(suspects)),
                original_corrupt=True,
                how=how,
                first_unit=first.first_unit,
            ),
        )
    )
    return out
