"""What the guard does with incidents: keep them, record them in the fleet store, and act on ``on_detect``.

Exit-code contract (``on_detect="exit"``): every rank of the data-parallel group holds the same incidents and
leaves at the same step, so no rank waits on a dead peer. Ranks named as suspects exit with
:data:`~sdcguard.contract.EXIT_SUSPECT_DEVICE` (86): "do not restart on this node"; the others with
:data:`~sdcguard.contract.EXIT_RESTART` (85): "restart me (without the suspect node)"; each writes its verdict where
a launcher wrapper finds it (:mod:`sdcguard.contract`). A suspect rank also appends the
incidents as JSON lines to ``$SDCGUARD_SUSPECT_FILE`` when that variable is set, so a node-level wrapper around
``torchrun`` can tell "leave the job" from "rejoin".
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Literal, NoReturn

from ..contract import EXIT_RESTART, EXIT_SUSPECT_DEVICE, Verdict, under_torchrun, write_verdict
from ..errors import CorruptionDetected
from ..logs import get_logger
from ..records import PASSIVE_KINDS, Incident
from .config import Escalate, OnDetect

__all__ = ["Responder", "exit_status", "exit_by_contract"]

_log = get_logger("training")


def exit_status(rank: int, incidents: Sequence[Incident]) -> int:
    """A rank's exit status under the contract: :data:`~sdcguard.contract.EXIT_SUSPECT_DEVICE` when ``incidents``
    name it."""
    return EXIT_SUSPECT_DEVICE if any(rank in i.suspect_ranks for i in incidents) else EXIT_RESTART


def exit_by_contract(status: int, incidents: Sequence[Incident], why: str, *, left: bool = False) -> NoReturn:
    """Leave the job by the exit-code contract with ``status``: a suspect appends its incidents to
    ``$SDCGUARD_SUSPECT_FILE``; every rank writes its verdict where a launcher finds it
    (:func:`sdcguard.contract.write_verdict`), then one line on stderr, and the status. ``left``: this rank leaves
    alone and the job goes on without it; under torchrun it then exits 0, since torchrun's agent stops every worker
    of the node when one exits non-zero (``sdcguard launch`` still reports 86 for the node, from the verdict)."""
    records = [asdict(i) for i in incidents]
    if status == EXIT_SUSPECT_DEVICE and os.environ.get("SDCGUARD_SUSPECT_FILE"):
        with contextlib.suppress(OSError):
            with open(os.environ["SDCGUARD_SUSPECT_FILE"], "a", encoding="utf-8") as f:
                for record in records:
                    f.write(json.dumps(record) + "\n")
    line = f"sdcguard: exit {status}: {why}"
    write_verdict(Verdict(status=status, message=line, left=left, pid=os.getpid(), incidents=records))
    print(line, file=sys.stderr, flush=True)
    sys.exit(0 if left and under_torchrun() else status)


class Responder:
    """Records and acts on incidents for one rank (``writer``: the one rank of the group that writes the store)."""

    def __init__(
        self,
        on_detect: OnDetect,
        store: str | None,
        *,
        rank: int,
        writer: bool,
        escalate: Escalate = "raise",
        job: str | None = None,
    ) -> None:
        self.on_detect = on_detect
        self.store = store
        self.rank = rank
        self.writer = writer
        self.escalate = escalate
        self.job = job
        self.incidents: list[Incident] = []
        self.before_acting: Callable[[Literal["raise", "exit"], list[Incident], Callable[[int], int]], None] | None = (
            None
        )
        """Called on every rank right before it raises or exits, with the incidents and each rank's exit status under
        the contract (:func:`exit_status`): the guard tells its dedicated shadows."""
        self.store_problem: str | None = self._check_store()
        """Why ``store`` cannot take this job's records (None: it can, or there is none, or not this rank's)."""

    def _check_store(self) -> str | None:
        """Open the store once at construction on the writer rank, so a path that cannot be written is told now,
        not at the first incident. It only logs a warning (the other ranks go on with the same collectives; the
        incidents stay in ``guard.incidents``)."""
        if self.store is None or not self.writer:
            return None
        try:
            from ..fleet.store.spool import open_writer

            open_writer(self.store).close()  # a server's store is not reached here: while it is away, its spool
        except Exception as e:  # a bad path, a read-only or damaged store: training goes on, records in memory
            problem = " ".join(str(e).split())
            _log.warning(
                "SDCGuard(store=%r) cannot record incidents there: %s; they will be kept in guard.incidents only",
                self.store,
                problem,
            )
            return problem
        return None

    def handle(self, found: list[Incident], *, escalate: list[Incident] | None = None) -> list[Incident]:
        """Keep and record ``found``; raise or exit when ``on_detect`` says so and something names a device, or
        when ``escalate`` (a sticky or repeated unresolved verdict among ``found``) escalates under ``skip``. Under
        ``escalate="recover"`` the escalating incidents are returned instead, unrecorded (the guard records them
        once it knows how the recovery went: :meth:`record`); else []."""
        if not found:
            return []
        self.incidents.extend(found)
        actionable = [i for i in found if i.kind not in PASSIVE_KINDS]  # never raise or exit for these
        action: str = self.on_detect
        if actionable and action == "skip" and escalate and self.escalate != "off":
            action, actionable = self.escalate, escalate
        if action == "recover":
            self._record([i for i in found if i not in actionable])
            return actionable
        self._record(found)
        if not actionable:
            return []
        if action in ("raise", "exit") and self.before_acting is not None:
            self.before_acting(
                "raise" if action == "raise" else "exit", actionable, lambda rank: exit_status(rank, actionable)
            )
        if action == "raise":
            raise CorruptionDetected(f"silent data corruption: {actionable[0].detail}", tuple(actionable))
        if action == "exit":
            exit_by_contract(exit_status(self.rank, actionable), actionable, actionable[0].detail)
        return []

    def record(self, updated: Sequence[Incident]) -> None:
        """Record incidents :meth:`handle` returned, as they are now (with how the recovery went), and keep them so
        in :attr:`incidents`."""
        for new in updated:
            at = next(
                (
                    k
                    for k, old in enumerate(self.incidents)
                    if old.time == new.time
                    and old.kind == new.kind
                    and old.step == new.step
                    and old.suspect_ranks == new.suspect_ranks
                ),
                None,
            )
            if at is not None:
                self.incidents[at] = new
        self._record(list(updated))

    def record_checkpoint(self, checkpoint_id: str, step: int, verified: bool, digest: str) -> None:
        """Record a checkpoint in the fleet store (by the writer rank; a failure only warns)."""
        if self.store is None or not self.writer:
            return
        try:
            from ..fleet.store.spool import open_writer

            with open_writer(self.store) as store:  # a server's outage: its spool, and a warning once
                store.training.record_checkpoint(
                    checkpoint_id=checkpoint_id, step=step, verified=verified, digest=digest, job=self.job
                )
        except Exception as e:  # never crash training over bookkeeping
            _log.warning("could not record checkpoint %s in %s: %s", checkpoint_id, self.store, e)

    def _record(self, found: list[Incident]) -> None:
        if self.store is None or not self.writer:
            return
        try:
            from ..fleet.store.spool import open_writer

            with open_writer(self.store) as store:  # a server's outage: its spool, and a warning once
                for incident in found:
                    store.training.record_incident(incident)
        except Exception as e:  # never crash training over bookkeeping: the incident stays in memory
            _log.warning(
                "could not record %d incident(s) in %s: %s; they are kept in guard.incidents", len(found), self.store, e
            )
