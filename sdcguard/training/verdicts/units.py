"""Verdicts on tensor-parallel shards joined into verdicts on their tensor-parallel groups: blame per rank where a
fault stayed in one rank's shard, per group where it crossed the group's collectives.

Under tensor parallelism a micro-batch is computed by a *unit* (a tensor-parallel group: one rank per shard), and
each shard is judged on its own, by the data-parallel replicas holding the same shard (a *slice*,
:mod:`sdcguard.training.mesh`). The rule, applied to the judgements of every slice about the same micro-batch:

1. A fault that stays on one rank (its weight gradient, written after the last collective of the backward) spoils
   that rank's shard only: one slice names it, the others agree. The rank named stays named.
2. A fault whose result crosses the group's collectives (a forward output feeding an all-reduce, an activation
   gradient) spoils every shard the group computes after it: every slice names *its* member of the same unit, each
   self-consistent (the innocent partners computed faithfully from a corrupted input). Where the shard fingerprints
   cannot tell which member produced the first wrong value (no traces place it, below), the named members of one unit
   become one ``unresolved`` verdict naming the whole unit: never the innocent partner alone, and the faulty rank
   always among the suspects.
3. Unresolved verdicts of several slices about the same micro-batch are one unresolved verdict (their suspects
   together), joined with the units of rule 2; one slice's alone keeps its own words.
4. Any software verdict leaves the whole micro-batch software (the setup does not replay).

Before the rule, the *traces* (:mod:`..replay.collectives`) narrow the judgements to the slices where the fault
started: :func:`first_to_differ`. Every computation of a micro-batch by a unit issues the same collectives in the same
order, so up to the first collective where any slice's computations put differing values in, every rank computed from
the same inputs: a slice whose computations differ there computed differently on its own, and the other slices only
received what it sent. Rule 2 then applies only where two slices differ at that same collective; a fault whose start
the traces place in one slice is named by that slice's judgement alone, as in rule 1.

Pure: a function of frozen judgements, traces and the units, evaluated alike on every rank.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from .attribution import Judgement

__all__ = ["join_units", "first_to_differ"]

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
    lone = [(o, j) for o, j in settled if j.verdict == "unresolved"]
    if not crossed and len(lone) == 1:  # one slice's replicas could not decide: its own words
        return out + lone
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


def narrowed(
    judged: Sequence[tuple[int, int, Judgement]], first: set[int], word: str = "tensor-parallel"
) -> list[tuple[int, Judgement]]:
    """The judgements ``(slice, owner, judgement)`` of one micro-batch, kept where the traces place the fault's start
    (``first``: :func:`first_to_differ`), each saying so; all of them when ``first`` is empty or names no slice that
    judged (the traces then say nothing the shards do not)."""
    kept = [(owner, j) for s, owner, j in judged if s in first]
    if not kept or len(kept) == len(judged):
        return [(owner, j) for _, owner, j in judged]
    ranks = sorted({r for _, j in kept for r in (*j.blamed, *j.suspects)})
    said = (
        f"the contributions to the {word} collectives first differed on {_ranks(ranks)} (the other {word} ranks "
        "only received the fault); "
    )
    return [(owner, replace(j, how=said + j.how)) for owner, j in kept]


def first_to_differ(traces: Mapping[int, Sequence[Sequence[int]]]) -> set[int]:
    """The slices whose computations of one micro-batch first put differing values into their units' collectives.

    ``traces``: slice -> its computations' traces (the same computations in the same order in every slice: the
    original, the replay, the reruns). An empty trace (a computation no tracer saw) is left out; a trace shorter than
    another differs where it ends. Empty when no slice's computations differ.
    """
    first: dict[int, int] = {}
    for slice_, computations in traces.items():
        seen = [t for t in computations if t]
        length = max((len(t) for t in seen), default=0)
        k = next((k for k in range(length) if len({t[k] if k < len(t) else None for t in seen}) > 1), None)
        if k is not None:
            first[slice_] = k
    if not first:
        return set()
    earliest = min(first.values())
    return {s for s, k in first.items() if k == earliest}


def _ranks(ranks: Sequence[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(str(r) for r in ranks)
