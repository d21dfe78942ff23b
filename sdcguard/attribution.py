"""Who is wrong when two devices disagree on one micro-batch: settling replay mismatches into incidents.

A replay mismatch says only that an original and a replay differ. The guard gathers more opinions on the same
micro-batch (another rank's replay, re-runs on the devices involved) and :class:`Attributor` turns them into
incidents that name the suspect rank(s), their devices and hosts, the first differing parameter, and whether
the fault reproduced (sticky) or not (transient). It is pure bookkeeping: no collectives, so every rank, holding
the same gathered opinions, reaches the same verdict.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Sequence

from .records import Incident
from .replay import Digest
from .shadows import digest_hash

__all__ = ["Attributor", "Conflict", "Settled", "job_id"]


@dataclass(frozen=True)
class Conflict:
    """Two devices disagreeing on one micro-batch, with what is known about the disagreement."""

    owner: int
    """Data-parallel index of the rank whose micro-batch it is."""
    other: int | None
    """Data-parallel index of the replaying rank; None for a dedicated shadow."""
    other_global: int
    """Global rank of the replaying rank or shadow."""
    original: Digest
    """The owner's digest of its original computation."""
    parameter: int | None
    """Index of the first differing parameter (None: only the loss differs)."""
    loss_differs: bool


Settled = tuple[tuple[int, ...], bool | None, str, Conflict]
"""(suspect global ranks, sticky or None when unknown, how it was decided, the conflict)."""


def job_id() -> str | None:
    """The launcher's job id (torchelastic or Slurm), recorded with every incident."""
    return os.environ.get("TORCHELASTIC_RUN_ID") or os.environ.get("SLURM_JOB_ID")


class Attributor:
    """Turns gathered opinions into incidents for one data-parallel group."""

    def __init__(self, members: Sequence[int], param_names: Sequence[str],
                 identities: dict[int, tuple[str | None, str]]) -> None:
        self.members = list(members)
        """Global rank of each data-parallel index."""
        self.param_names = list(param_names)
        self.identities = identities
        """Global rank -> (device id, hostname)."""

    def settle(self, c: Conflict, *, replica: Digest | None, third: Digest | None, third_rank: int | None,
               rerun: Digest, other_rerun: Digest | None, replica_hash: int | None = None) -> Settled:
        """Decide who is wrong in a two-device disagreement.

        ``replica`` is the replaying device's digest (or only its hash, ``replica_hash``, from a dedicated
        shadow); ``third`` a third device's replay (data-parallel index ``third_rank``); ``rerun`` and
        ``other_rerun`` re-runs on the owner's and the replaying device.
        """
        owner_g = self.members[c.owner]
        other_g = c.other_global
        other_name = f"rank {other_g}" + (" (dedicated shadow)" if c.other is None else "")

        def same_as_replica(d: Digest) -> bool:
            return d == replica if replica is not None else digest_hash(d) == replica_hash

        if third is not None:
            third_g = self.members[third_rank] if third_rank is not None else -1
            if same_as_replica(third) and third != c.original:
                sticky = rerun != third
                how = (f"rank {third_g}'s replay agrees with {other_name}; a re-run on rank {owner_g} "
                       + ("reproduced the wrong result (sticky)" if sticky else "was correct (transient)"))
                return (owner_g,), sticky, how, c
            if third == c.original and not same_as_replica(third):
                sticky = None if other_rerun is None else other_rerun != third
                how = f"rank {third_g}'s replay agrees with rank {owner_g}: {other_name} computed the replay wrong"
                return (other_g,), sticky, how, c
            return (owner_g, other_g), None, f"rank {third_g}'s replay agrees with neither", c
        # Two devices only: the re-runs are the third opinion.
        if same_as_replica(rerun) and (other_rerun is None or same_as_replica(other_rerun)):
            return (owner_g,), False, f"a re-run on rank {owner_g} agrees with {other_name} (transient)", c
        if rerun == c.original and other_rerun is not None and other_rerun == c.original:
            return (other_g,), False, f"a re-run on {other_name} agrees with rank {owner_g} (transient)", c
        return (owner_g, other_g), None, "both devices reproduce their own result: no third device to decide", c

    def settle_single(self, step: int, c: Conflict) -> list[Incident]:
        """A single rank whose re-run differs from its original: it is the only suspect there can be."""
        how = "a re-run on the same device differs (single rank: no other device to compare with)"
        return self.merge(step, [((self.members[0],), False, how, c)])

    def merge(self, step: int, results: list[Settled]) -> list[Incident]:
        """One incident per suspect set and step (a sticky device fails its own and its replay of another)."""
        by_suspects: dict[tuple[int, ...], list[tuple[bool | None, str, Conflict]]] = {}
        for suspects, sticky, how, c in results:
            by_suspects.setdefault(suspects, []).append((sticky, how, c))
        out = []
        for suspects, items in by_suspects.items():
            sticky_values = [s for s, _, _ in items if s is not None]
            sticky = any(sticky_values) if sticky_values else None
            first = items[0][2]
            param = self.param_names[first.parameter] if first.parameter is not None else None
            parts = []
            for _, how, c in items:
                where = f"parameter {self.param_names[c.parameter]!r}" if c.parameter is not None else "the loss"
                other = f"rank {c.other_global}" + (" (dedicated shadow)" if c.other is None else "")
                loss_too = " (loss differs too)" if c.loss_differs and c.parameter is not None else ""
                parts.append(f"rank {self.members[c.owner]}'s micro-batch: original and {other}'s replay differ "
                             f"first at {where}{loss_too}; {how}")
            detail = f"step {step}: " + ". ".join(parts)
            out.append(self.incident("replay", step, suspects, detail, parameter=param, sticky=sticky))
        return out

    def nondeterministic(self, step: int, c: Conflict) -> Incident:
        """A mismatch on a setup that ``calibrate`` found nondeterministic: reported, blamed on no device."""
        where = f"parameter {self.param_names[c.parameter]!r}" if c.parameter is not None else "the loss"
        detail = (f"step {step}: rank {self.members[c.owner]}'s micro-batch replayed on rank {c.other_global} "
                  f"differs first at {where}, but calibrate() found this setup nondeterministic: not blamed on "
                  "hardware")
        return self.incident("nondeterministic", step, (), detail, parameter=None)

    def incident(self, kind: str, step: int, suspects: tuple[int, ...], detail: str, *,
                 parameter: str | None = None, sticky: bool | None = None) -> Incident:
        """An incident naming the suspects' devices and hosts."""
        devices = tuple(self.identities.get(r, (None, ""))[0] or "" for r in suspects)
        hosts = tuple(self.identities.get(r, (None, ""))[1] for r in suspects)
        return Incident(kind=kind, step=step, suspect_ranks=suspects,
                        device=(devices[0] or None) if len(suspects) == 1 else None,
                        detail=detail, devices=devices, hosts=hosts, parameter=parameter, sticky=sticky,
                        job=job_id())
