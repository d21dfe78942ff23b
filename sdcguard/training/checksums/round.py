"""What a step's checksum checks conclude, on every rank alike: which ranks' matmuls failed, and the incidents.

Every rank puts two int64 values into the guard's one per-step all-gather (:func:`columns`: how many of its
matmuls failed after the same-device recompute, how many of those failed again); from the gathered table every rank
knows whether the step is corrupt, with no collective of its own. Only when some rank failed are the failures'
descriptions (layer, op, pass) gathered, so every rank builds the same incidents. The check is local: the rank that
computed the matmul is the suspect, alone, with no vote; *sticky* when the recompute failed again (escalates, like a
sticky replay verdict: :mod:`..verdicts.outcomes`), *transient* when it passed.
"""

from __future__ import annotations

from collections.abc import Sequence

from ...records import Incident
from ..comm import Comm
from ..verdicts.attribution import Attributor
from .mode import ChecksumFailure

__all__ = ["columns", "WIDTH", "checksum_incidents"]

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


def checksum_incidents(
    comm: Comm, attr: Attributor, step: int, table: Sequence[Sequence[int]], failures: Sequence[ChecksumFailure]
) -> list[Incident]:
    """The incidents of a step whose gathered checksum ``table`` (one row of :data:`WIDTH` per member) shows a
    failure; [] otherwise. Collective (every rank calls it with the same table)."""
    if not any(row[0] for row in table):
        return []
    described = comm.gather_objects([(f.op, f.where, f.phase, _describe(f), f.sticky) for f in failures])
    out = []
    for rank, rows in zip(comm.members, described):
        if not rows:
            continue
        identity = attr.identities.get(rank, (None, ""))
        where = f"rank {rank} ({identity[0] or 'device unknown'}, host {identity[1] or 'unknown'})"
        detail = (
            f"step {step}: a matmul result failed its checksum on {where}: "
            + "; ".join(r[3] for r in rows)
            + ". The check is local: the rank that computed is the suspect."
        )
        sticky = True if any(r[4] for r in rows) else (None if any(r[4] is None for r in rows) else False)
        out.append(
            attr.incident(
                "checksum", step, (rank,), detail, parameter=f"{rows[0][1]} [{rows[0][0]}, {rows[0][2]}]", sticky=sticky
            )
        )
    return out
