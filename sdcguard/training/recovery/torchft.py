"""The guard as torchft's verifier: replica groups under torchft's ``Manager`` (torchtitan's fault tolerance), where
a corruption vetoes the step for every group, the named group leaves, and a healing group's state commits only once
the groups' fingerprints confirmed it.

torchft alone trusts every replica: ``report_error`` vetoes only the caller's group (``should_commit`` agrees within
a group, not across groups), nothing excludes a group, and a healing group takes the live state of whichever replica
the quorum picks, unchecked. :class:`TorchFTEngine` adds, on every replica group, once per step:

1. :meth:`~TorchFTEngine.start`: torchft's quorum. The manager must use ``use_async_quorum=False``: a healing group
   then receives its state before the step's forward, so this step's vote sees the healed state before anything
   commits. A heal goes through the callbacks this engine registers with the manager: the source serves a copy of
   its live state with the fingerprint of every tensor (:meth:`~TorchFTEngine.serve`); the receiver writes it into
   its live state only when the bits that arrived have those fingerprints and fit its model
   (:meth:`~TorchFTEngine.heal`), else keeps its own (which the vote then refuses).
2. The group's guard runs the step (``escalate="off"``: what to do about a verdict is decided across the groups).
   After a heal (:attr:`~TorchFTEngine.healed`) the loop first calls ``guard.after_optimizer_step()``, as after any
   write of the weights outside the optimizer: the guard's memory check takes the healed weights as its reference
   (else it names its own group).
3. :meth:`~TorchFTEngine.average_gradients`: ``manager.allreduce`` of every gradient, no DDP wrapper (torchft
   0.2.0's was seen to kill a healthy survivor when a peer died in the middle of an all-reduce, issue 46).
4. :meth:`~TorchFTEngine.should_commit`: each group's vote (its guard's verdict, the digests of the state the step
   started from and of the averaged gradients, whether it healed at this step's quorum) is gathered through the
   manager, and :func:`~.groups.judge_groups` decides alike on every group: a leaver exits by the contract (86),
   a refused heal is asked again at the next quorum (from another source: the one that sent it holds the same
   wrong state and leaves), an unresolved disagreement ends every group (85); when no group may commit, each calls
   ``manager.report_error``, so torchft's own ``should_commit`` says no on every group.

Why this is not a :class:`~.engine.RecoveryEngine`: that interface is driven by one job-wide decision over a process
group every rank of the job belongs to (``exclude`` returns the new group, ``heal`` is a collective the guard calls).
torchft's groups share no such group: they meet only in the step's quorum and its all-reduces, a group leaves by
stopping (the lighthouse forms the next quorum without it), a spare or restarted group is *promoted* by joining the
quorum, and a heal is a pair of callbacks torchft calls. The same verbs, at the points torchft gives them. Not built:
*roll back*. The vote comes before any commit, so a vetoed step leaves nothing to undo; a fault that committed
unseen before its verdict (a guard sampling replay one step in N) is in every group's state, and this engine does
not go back to a verified snapshot (docs/recovery.md).
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from typing import Any, NoReturn, Protocol

import torch
from torch import nn

from ...contract import EXIT_RESTART, EXIT_SUSPECT_DEVICE
from ...fingerprints import combine, signed64
from ...records import PASSIVE_KINDS, Incident
from ..comm import Allreducer, average_, gather_rows_by_sum
from ..config import StepReport
from ..response import exit_by_contract
from .groups import GroupsVerdict, GroupVote, judge_groups
from .snapshot import snapshot_fingerprints
from .state import LiveState, Stateful, state_digest

__all__ = ["FTManager", "TorchFTEngine", "StepVetoed"]


class StepVetoed(RuntimeError):
    """What a group reports to torchft's manager when the groups' verdict vetoed the step."""


class FTManager(Allreducer, Protocol):
    """What the engine uses of torchft's ``Manager`` (torchft 0.2)."""

    def register_state_dict_fn(self, key: str, load_state_dict: Any, state_dict: Any) -> None: ...

    def start_quorum(self) -> None: ...

    def should_commit(self) -> bool: ...

    def report_error(self, e: Exception) -> None: ...

    def current_step(self) -> int: ...

    def batches_committed(self) -> int: ...

    def load_state_dict(self, state_dict: dict[str, int]) -> None: ...

    def participating_rank(self) -> int | None: ...

    def num_participants(self) -> int: ...

    def shutdown(self, wait: bool = True) -> None: ...


class TorchFTEngine:
    """One replica group's part (see the module docstring); one rank per replica group.

    Args:
        manager: the group's torchft ``Manager``, built with ``use_async_quorum=False`` and without state-dict
            callbacks of its own for what this engine keeps (it registers its own, under the key ``"sdcguard"``).
        module: the model without data-parallel wrapper.
        optimizer: its optimizer.
        state: more stateful objects a heal carries (schedulers, a data loader's position), in a fixed order.
    """

    def __init__(
        self, manager: FTManager, module: nn.Module, optimizer: Stateful, state: Sequence[Stateful] = ()
    ) -> None:
        self.manager = manager
        self.live = LiveState(module, optimizer, list(state))
        self.params = [p for p in module.parameters() if p.requires_grad]
        self.healed = False
        """This step's quorum healed this group (its state came from another group)."""
        self.refusal: str | None = None
        """Why this group's last heal was not written into its state (None: it was, or none came)."""
        self.verdict: GroupsVerdict | None = None
        """The last step's verdict."""
        manager.register_state_dict_fn("sdcguard", self.heal, self.serve)

    @property
    def replica_rank(self) -> int:
        """This group's place in the step's quorum: the data-parallel index whose batches it feeds."""
        rank = self.manager.participating_rank()
        return 0 if rank is None else rank

    def start(self) -> int:
        """Join the step's quorum (a heal, when the quorum asks for one, is done when this returns); the step."""
        self.healed, self.refusal = False, None
        self.manager.start_quorum()
        return self.manager.current_step()

    def average_gradients(self) -> None:
        """Average the gradients across the groups. A parameter without a gradient gets zeros (every group must
        all-reduce the same tensors), which an optimizer then applies as any gradient (AdamW's moments decay)."""
        for p in self.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        average_(self.manager, [p.grad for p in self.params if p.grad is not None])

    def vote(self, report: StepReport | None) -> GroupVote:
        """This group's vote at the current step (``report``: its guard's, None without a guard)."""
        incidents = () if report is None else report.incidents
        skeleton, tensors = self.live.read()
        grads = [p.grad for p in self.params if p.grad is not None]
        return GroupVote(
            corrupt=report is not None and not report.commit,
            named=any(i.sticky for i in incidents if i.kind not in PASSIVE_KINDS),
            healed=self.healed,
            step=self.manager.current_step(),
            digest=signed64(state_digest(snapshot_fingerprints(tensors), skeleton)),
            gradients=signed64(combine(snapshot_fingerprints(grads))),
        )

    def should_commit(self, report: StepReport | None) -> bool:
        """The groups' verdict of the step (module docstring, step 4), then torchft's ``should_commit``: True when
        this group applies the step. A leaver, and every group on an unresolved verdict, exits here."""
        mine = self.vote(report)
        index, size = self.replica_rank, self.manager.num_participants()
        rows = gather_rows_by_sum(self.manager, mine.row(), index, size)
        verdict = self.verdict = judge_groups([GroupVote.from_row(r) for r in rows])
        step = mine.step
        incidents = [] if report is None else [i for i in report.incidents if i.kind not in PASSIVE_KINDS]
        if verdict.unresolved:
            self.manager.shutdown(wait=False)
            exit_by_contract(EXIT_RESTART, incidents, f"torchft step {step}: the replica groups' states disagree")
        if index in verdict.leavers:
            self.exclude(incidents or [self._stray(step, index)], f"torchft step {step}: this replica group left")
        if index in verdict.refused:
            # Heal again at the next quorum: torchft heals a group whose step is behind the quorum's.
            self.manager.load_state_dict({"step": 0, "batches_committed": self.manager.batches_committed()})
        if not verdict.commit:
            self.manager.report_error(StepVetoed(f"sdcguard vetoed torchft step {step}: {verdict.why}"))
        return bool(self.manager.should_commit())

    def exclude(self, incidents: Sequence[Incident], why: str) -> NoReturn:
        """This group leaves: its manager stops (the lighthouse forms the next quorum without it) and it exits by
        the contract (86, as a rank that leaves while the job goes on)."""
        self.manager.shutdown(wait=False)
        exit_by_contract(EXIT_SUSPECT_DEVICE, incidents, why, left=True)

    def serve(self) -> dict[str, Any]:
        """The state a healing group receives from this one (torchft calls it on the source): a copy of the live
        state, with the fingerprint of every tensor taken of that copy."""
        skeleton, tensors = self.live.read()
        copies = [t.detach().clone() for t in tensors]
        return {
            "step": self.manager.current_step(),
            "skeleton": pickle.dumps(skeleton, protocol=4),
            "tensors": copies,
            "fingerprints": snapshot_fingerprints(copies),
        }

    def heal(self, sent: dict[str, Any]) -> None:
        """Write a healing state into the live state (torchft calls it on the receiver), only when its bits have
        the fingerprints the source took and it is this model's; else keep this group's own (:attr:`refusal` says
        why) and let the step's vote refuse it."""
        self.healed = True
        tensors = list(sent["tensors"])
        skeleton = pickle.loads(sent["skeleton"])
        if snapshot_fingerprints(tensors) != list(sent["fingerprints"]):
            self.refusal = "the bits that arrived do not have the source's fingerprints"
        else:
            self.refusal = self.live.fits(skeleton, tensors)
        if self.refusal is None:
            self.live.write(skeleton, tensors, lambda t: t.clone())

    def _stray(self, step: int, index: int) -> Incident:
        why = "its state is not the one a strict majority of the replica groups holds"
        how = "changed outside a committed step, or the source of a refused heal"
        return Incident(
            kind="memory",
            step=step,
            suspect_ranks=(index,),
            device=None,
            detail=f"replica group {index}: {why} ({how})",
        )
