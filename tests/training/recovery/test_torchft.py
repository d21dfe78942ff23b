"""The guard as torchft's verifier (:class:`~sdcguard.training.recovery.torchft.TorchFTEngine`).

Without torchft (a stand-in manager): a heal is written only when its bits have the source's fingerprints; the step's
verdict becomes the group's action (a veto reported to its manager, a leaver's exit 86, a refused heal asked again).

Real jobs (torchft's manager and lighthouse, gloo on CPU, one process per replica group, each with its guard checking
every matmul): a sticky fault on replica group 1 vetoes the step for all three groups, group 1 exits 86, a restarted
group 1 heals from a verified source and the run finishes; a source whose memory went bad just before it served a heal
leaves, and the healing group is refused and heals again from another source. In both, every group that finishes holds
the weights and AdamW state of a fault-free three-group run bit for bit: each step commits on three groups from the
same state, and a group's batch is a function of the step and its replica rank."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from sdcguard.testing.models import TinyTransformer
from sdcguard.training.recovery.groups import GroupVote
from sdcguard.training.recovery.state import state_digest
from sdcguard.training.recovery.torchft import StepVetoed, TorchFTEngine
from tests.training.recovery._torchft_jobs import Ended, Group, Traced, run_groups


class _Work:
    def wait(self) -> None:
        pass


class _Manager:
    """A stand-in for torchft's manager on one group, whose all-reduce adds the other groups' votes (``others``)."""

    def __init__(self, others: list[list[int]] | None = None, index: int = 0) -> None:
        self.others, self.index = others or [], index
        self.errors: list[Exception] = []
        self.loaded: list[dict[str, int]] = []

    def register_state_dict_fn(self, key: str, load: Any, serve: Any) -> None:
        self.load, self.serve = load, serve

    def current_step(self) -> int:
        return 3

    def allreduce(self, tensor: torch.Tensor, should_quantize: bool = False, reduce_op: Any = None) -> _Work:
        if tensor.dtype == torch.int64:  # the votes' table: the other groups fill their rows
            rows = [i for i in range(tensor.shape[0]) if i != self.index]
            for row, vote in zip(rows, self.others):
                tensor[row] += torch.tensor(vote)
        return _Work()

    def participating_rank(self) -> int:
        return self.index

    def num_participants(self) -> int:
        return len(self.others) + 1

    def batches_committed(self) -> int:
        return 0

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.loaded.append(state)

    def report_error(self, e: Exception) -> None:
        self.errors.append(e)

    def should_commit(self) -> bool:
        return not self.errors

    def shutdown(self, wait: bool = True) -> None:
        pass


def _engine(seed: int, manager: _Manager | None = None) -> TorchFTEngine:
    torch.manual_seed(seed)
    model = TinyTransformer(d=8, heads=2, seq=4, layers=1, p=0.0)
    return TorchFTEngine(manager or _Manager(), model, torch.optim.AdamW(model.parameters()))


def _voting(others: list[dict[str, Any]], *, healed: bool = False) -> tuple[TorchFTEngine, _Manager]:
    """An engine whose manager holds the other groups' votes: each the same as this group's, changed by ``others``."""
    manager = _Manager()
    engine = _engine(0, manager)
    engine.average_gradients()
    mine = engine.vote(None)
    manager.others = [GroupVote(**{**mine.__dict__, **changes}).row() for changes in others]
    engine.healed = healed
    return engine, manager


def test_a_step_the_groups_agree_on_commits() -> None:
    engine, manager = _voting([{}, {}])
    assert engine.should_commit(None) and not manager.errors and engine.verdict is not None and engine.verdict.commit


def test_a_corruption_another_group_found_vetoes_this_groups_step_through_its_manager() -> None:
    engine, manager = _voting([{"corrupt": True, "named": True}, {}])
    assert not engine.should_commit(None)
    assert [type(e) for e in manager.errors] == [StepVetoed] and "a guard found a corruption" in str(manager.errors[0])
    assert engine.verdict is not None and engine.verdict.leavers == (1,)


def test_a_group_whose_state_the_others_do_not_hold_leaves_by_the_contract() -> None:
    engine, _ = _voting([{"digest": 5}, {"digest": 5}])
    with pytest.raises(SystemExit) as left:
        engine.should_commit(None)
    assert left.value.code == 86


def test_a_healed_state_the_others_do_not_hold_is_refused_and_asked_for_again() -> None:
    engine, manager = _voting([{"digest": 5}, {"digest": 5}, {"digest": 5}], healed=True)
    assert not engine.should_commit(None)
    assert manager.loaded == [{"step": 0, "batches_committed": 0}]  # behind: torchft heals it at the next quorum


def _digest(engine: TorchFTEngine) -> int:
    from sdcguard.training.recovery.snapshot import snapshot_fingerprints

    skeleton, tensors = engine.live.read()
    return state_digest(snapshot_fingerprints(tensors), skeleton)


def test_a_heal_is_written_only_when_what_arrived_has_the_sources_fingerprints() -> None:
    source, receiver = _engine(0), _engine(1)
    own = _digest(receiver)
    sent = source.serve()
    sent["tensors"][2].view(torch.int32).view(-1)[0] ^= 1 << 20  # one bit flipped on the way
    receiver.heal(sent)
    assert receiver.healed and receiver.refusal == "the bits that arrived do not have the source's fingerprints"
    assert _digest(receiver) == own  # its own state kept: the step's vote refuses it
    receiver.heal(source.serve())
    assert receiver.refusal is None and _digest(receiver) == _digest(source)


def test_a_heal_of_another_models_state_is_refused() -> None:
    torch.manual_seed(0)
    other = TinyTransformer(d=16, heads=2, seq=4, layers=1, p=0.0)
    source = TorchFTEngine(_Manager(), other, torch.optim.AdamW(other.parameters()))
    receiver = _engine(1)
    receiver.heal(source.serve())
    assert receiver.refusal is not None and "another model" in receiver.refusal


@pytest.fixture(scope="module")
def fault_free(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    pytest.importorskip("torchft", reason="torchft is in the test extra (pip install -e '.[test]'); its jobs need it")
    ended = run_groups([Group(0), Group(1), Group(2)], tmp_path_factory.mktemp("fault-free"), timeout=150)
    assert [e.exitcode for e in ended] == [0, 0, 0]
    first = ended[0].result
    assert first is not None and all(e.result is not None and _same(e.result, first) for e in ended)
    return first


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return bool(a["weights"] == b["weights"] and a["optimizer"] == b["optimizer"])


def _by_replica(ended: list[Ended]) -> Iterator[tuple[int, int | None, list[Traced]]]:
    for e in ended:
        yield e.replica, e.exitcode, [] if e.result is None else e.result["trace"]


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_sticky_fault_vetoes_the_step_for_every_group_and_the_restarted_group_heals_from_a_verified_source(
    tmp_path: Path, fault_free: dict[str, Any]
) -> None:
    spare = Group(1, join_after="left1")  # group 1 restarted once it left (a scheduler's replacement)
    ended = run_groups([Group(0), Group(1, fault_from=2), Group(2), spare], tmp_path, timeout=150)
    exits = {(e.replica, e.exitcode) for e in ended}
    assert exits == {(0, 0), (1, 86), (2, 0), (1, 0)}, exits
    for replica, code, trace in _by_replica(ended):
        if code != 0:
            continue
        if replica in (0, 2):  # step 2 computed with the fault: vetoed on every group, group 1 named to leave
            vetoed = next(t for t in trace if t.step == 2)
            assert (vetoed.commit, vetoed.why, vetoed.leavers) == (False, "a guard found a corruption", (1,))
        else:  # the restart: healed at its first quorum, and that step's vote let it commit
            assert trace[0].step == 2 and trace[0].healed and trace[0].commit
        assert [t.step for t in trace if t.commit] == ([0, 1, 2, 3, 4] if replica != 1 else [2, 3, 4])
    for e in ended:
        if e.exitcode == 0:
            assert e.result is not None and _same(e.result, fault_free), e.replica


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_source_whose_memory_went_bad_is_refused_and_the_healing_group_heals_again_from_a_verified_one(
    tmp_path: Path, fault_free: dict[str, Any]
) -> None:
    # Groups 0-2 train; group 3 joins at step 2. Whichever group serves the first heal flips a bit of a weight in
    # its memory just before (torchft picks the source: the first group at the quorum's step, group 0 here). No
    # group has a guard (whose memory check would name the source too): the groups' vote alone decides.
    wait = {2: "joined"}
    groups = [Group(r, corrupt_source=True, wait_for=dict(wait), guarded=False) for r in range(3)]
    groups[0] = Group(0, corrupt_source=True, wait_for=dict(wait), announce={2: "at2"}, guarded=False)
    groups.append(Group(3, join_after="at2", guarded=False))
    ended = run_groups(groups, tmp_path, timeout=150)
    exits = {e.replica: e.exitcode for e in ended}
    assert exits == {0: 86, 1: 0, 2: 0, 3: 0}, exits
    late = next(e for e in ended if e.replica == 3).result
    assert late is not None
    refused, healed = late["trace"][:2]
    assert refused.step == 2 and refused.healed and not refused.commit and refused.replica_rank in refused.refused
    assert refused.leavers == (0,) and refused.why == "a group holds another state than the others"  # the source
    assert healed.step == 2 and healed.healed and healed.commit  # from group 1: verified by that step's vote
    for e in ended:
        if e.exitcode == 0:
            assert e.result is not None and _same(e.result, fault_free), e.replica
