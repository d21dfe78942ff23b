"""Verdicts from what one rank can see of itself, with no vote: its own parameter shards changed outside the
optimizer step (memory corruption), non-finite values in its step (a loss or a gradient), and a gradient changed on
its way from the backward into the reduction.

The rule, applied to every rank's row of the step's gather (group order):

1. **Memory.** A rank's shard of the parameters changes only through the optimizer step (:mod:`..local.memory`): a rank
   whose shards differ at the step's check from what they were right after the last optimizer step had its memory
   corrupted. It is named alone (``memory``, ``sticky``: the wrong value stays in memory), whatever the others
   hold: no replica is needed, so it holds where none exists (a pure FSDP2 shard, a tensor-parallel shard with no
   data-parallel copy). A rank whose shards did not change is never named by this rule.
2. **Non-finite values.** A step in which some rank's loss or gradient is not finite is never committed
   (``nonfinite``). Which rank produced the first one: the ranks whose own loss was not finite when not every rank's
   was (a loss is computed by its rank alone); else every rank of the gather, whichever held the non-finite
   gradients: a reduction spreads one rank's NaN to every replica, or to another rank's shard only (FSDP2's
   reduce-scatter: the rank whose shard came out non-finite is not the one that made it, as the full detection
   campaign showed), so no rank is named alone by it; rule 3 narrows it where a rank's own evidence explains it.
3. **Explained disagreements.** A rank named by rule 1 computed with corrupted weights, and so did every rank that
   received them (its tensor-parallel partners through their collectives, FSDP2's all-gather, its replicas' reduced
   gradients). A disagreement of the same step whose suspects include such a rank (``gradient_replica``,
   ``weight_replica``, ``unresolved``, ``nonfinite``) is explained by it: its suspects are narrowed to the ranks rule 1
   named, never widened, so the corrupted rank is named alone and its innocent partners are not. An incident naming
   none of them (another rank's own replay verdict) is kept as it is. A second fault in the same step among the
   ranks of an explained disagreement is not told apart (the step is vetoed either way). A ``nonfinite`` incident is
   also explained by a rank a ``replay`` or ``checksum`` verdict of the same step names alone: its computation was
   shown wrong on its own evidence, and the NaN or infinity it made reached every rank through the reduction (so is
   one by a rank a ``reduction`` verdict names, rule 4).
4. **The path into the reduction.** A rank whose gradient DDP all-reduced is not the one its own backward produced
   for that parameter (:mod:`..hooks.bucket`: a hook registered after the guard's, the accumulation into ``.grad``,
   the copy into DDP's bucket, or the memory under them) is named alone (``reduction``), whatever the others found:
   every replica received its changed gradient, and only it saw the change. ``sticky`` when the same rank was named
   at the check before too (the change reproduced). A rank whose path matched is never named by this rule. Vetoed,
   never escalated and never evidence for quarantine (:data:`~sdcguard.records.NOT_EVIDENCE_KINDS`): a gradient hook
   registered after the guard's is software, and as likely a cause as the device.

Pure: a function of the gathered integers and every rank's identity, evaluated alike on every rank.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import replace

from ...records import Incident

__all__ = ["Identity", "memory_incidents", "nonfinite_incidents", "reduction_incidents", "explained", "EXPLAINABLE"]

EXPLAINABLE = frozenset({"gradient_replica", "weight_replica", "unresolved", "nonfinite"})
"""The kinds of disagreement rule 3 narrows (a ``replay`` verdict names a device on its own evidence)."""
OWN_EVIDENCE = frozenset({"replay", "checksum", "reduction"})
"""The verdicts that name a rank alone on its own computation, which explain a ``nonfinite`` incident (rule 3)."""

Identity = tuple[int, str | None, str]
"""A rank as incidents name it: global rank, device id, host."""


def memory_incidents(
    step: int, rows: Sequence[Sequence[int]], names: Sequence[str], identities: Sequence[Identity], job: str | None
) -> list[Incident]:
    """Rule 1: one incident per rank whose row says ``(changed tensors, first changed index)`` with a count above 0."""
    out = []
    for (changed, first), (rank, device, host) in zip(rows, identities, strict=True):
        if changed <= 0:
            continue
        name = names[first] if 0 <= first < len(names) else "<a parameter>"
        more = f" and {changed - 1} more" if changed > 1 else ""
        out.append(
            Incident(
                kind="memory",
                step=step,
                suspect_ranks=(rank,),
                device=device,
                devices=(device or "",),
                hosts=(host,),
                parameter=name,
                sticky=True,
                job=job,
                detail=(
                    f"rank {rank}'s own shard of {name}{more} changed in memory after the optimizer step of step "
                    f"{step - 1} and before step {step}'s check: memory corruption on that rank (no vote needed)"
                ),
            )
        )
    return out


def nonfinite_incidents(
    step: int, rows: Sequence[Sequence[int]], identities: Sequence[Identity], job: str | None
) -> list[Incident]:
    """Rule 2: ``rows`` per rank ``(non-finite losses, non-finite gradients)``; one incident, or none."""
    losses = [i for i, (bad_loss, _) in enumerate(rows) if bad_loss > 0]
    grads = [i for i, (_, bad_grad) in enumerate(rows) if bad_grad > 0]
    if not losses and not grads:
        return []
    if losses and len(losses) < len(rows):
        who, how = losses, "its own loss was not finite, the other ranks' were"
    else:
        who = list(range(len(rows)))
        how = (
            f"not finite on rank(s) {', '.join(str(identities[i][0]) for i in sorted(set(losses) | set(grads)))} after "
            "the reduction: which rank produced it first cannot be told from this step"
        )
    ranks = tuple(identities[i][0] for i in who)
    devices = tuple(identities[i][1] or "" for i in who)
    return [
        Incident(
            kind="nonfinite",
            step=step,
            suspect_ranks=ranks,
            device=(devices[0] or None) if len(who) == 1 else None,
            devices=devices,
            hosts=tuple(identities[i][2] for i in who),
            job=job,
            detail=(
                f"a non-finite loss or gradient at step {step} on rank(s) {', '.join(map(str, ranks))} ({how}); the "
                "step is not committed (a device, the data or the settings: a replay tells a device from the rest)"
            ),
        )
    ]


def reduction_incidents(
    step: int,
    rows: Sequence[Sequence[int]],
    names: Sequence[str],
    identities: Sequence[Identity],
    job: str | None,
    before: Collection[int] = (),
) -> list[Incident]:
    """Rule 4: one incident per rank whose row says ``(parameters compared, how many differed, the first one's
    index)`` with a count above 0; ``before``: the global ranks this rule named at the check before (sticky)."""
    out = []
    for (_, changed, first), (rank, device, host) in zip(rows, identities, strict=True):
        if changed <= 0:
            continue
        name = names[first] if 0 <= first < len(names) else "<a parameter>"
        more = f" and {changed - 1} more" if changed > 1 else ""
        again = rank in before
        out.append(
            Incident(
                kind="reduction",
                step=step,
                suspect_ranks=(rank,),
                device=device,
                devices=(device or "",),
                hosts=(host,),
                parameter=name,
                sticky=again,
                job=job,
                detail=(
                    f"rank {rank}'s gradient of {name}{more} changed between its backward and DDP's all-reduce at step "
                    f"{step}{' (again)' if again else ''}: every replica received the changed gradient, which its "
                    "backward did not produce (a gradient hook registered after the guard's, the accumulation into "
                    ".grad, the copy into DDP's bucket, or the memory under them; no vote needed)"
                ),
            )
        )
    return out


def explained(incidents: Sequence[Incident], corrupted: Collection[int] = ()) -> list[Incident]:
    """Rule 3: ``incidents`` of one step with every disagreement that includes a rank whose own shards changed (named
    by a ``memory`` incident among them, or in ``corrupted``) narrowed to those ranks."""
    bad = set(corrupted) | {r for i in incidents if i.kind == "memory" for r in i.suspect_ranks}
    shown_wrong = {i.suspect_ranks[0] for i in incidents if i.kind in OWN_EVIDENCE and len(i.suspect_ranks) == 1}
    out = []
    for i in incidents:
        explaining = bad | shown_wrong if i.kind == "nonfinite" and not bad else bad
        keep = [k for k, r in enumerate(i.suspect_ranks) if r in explaining]
        if i.kind not in EXPLAINABLE or not keep or len(keep) == len(i.suspect_ranks):
            out.append(i)
            continue
        ranks = tuple(i.suspect_ranks[k] for k in keep)
        devices = tuple(i.devices[k] for k in keep) if len(i.devices) == len(i.suspect_ranks) else ()
        hosts = tuple(i.hosts[k] for k in keep) if len(i.hosts) == len(i.suspect_ranks) else ()
        others = ", ".join(str(r) for r in i.suspect_ranks if r not in explaining)
        cause = "own shards changed in memory" if bad else "own computation its replay or checksums showed wrong"
        why = (
            f"; explained by rank(s) {', '.join(map(str, ranks))}, whose {cause} (ranks {others} received its values: "
            "not suspects)"
        )
        out.append(
            replace(
                i,
                suspect_ranks=ranks,
                devices=devices,
                hosts=hosts,
                device=(devices[0] or None) if len(ranks) == 1 and devices else None,
                detail=i.detail + why,
            )
        )
    return out
