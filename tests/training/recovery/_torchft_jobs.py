"""The torchft jobs the tests run: replica groups (one process each, one rank per group) under a real torchft
lighthouse, each with its guard and :class:`~sdcguard.training.recovery.torchft.TorchFTEngine`; gloo on CPU.

:func:`run_groups` starts the lighthouse and the groups, restarts a group that left (as a scheduler restarts a
drained group on another node), starts late groups when told, and kills every process it started before it returns.
"""

from __future__ import annotations

import contextlib
import datetime
import multiprocessing as mp
import os
import pickle
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import torch

from sdcguard import SDCGuard
from sdcguard.inject.faults import Fault
from sdcguard.inject.torch_faults import OpFaultMode, corrupt_weights_
from sdcguard.testing.models import TinyTransformer, lm_loss, make_batch
from sdcguard.training.recovery.torchft import TorchFTEngine

STEPS = 5
SEQ = 4


@dataclass(frozen=True)
class Group:
    """One replica group's process: its id, a sticky matmul fault from a step on, whether it corrupts its own
    weights in memory when it first serves a heal (only the first group of the job to serve one does)."""

    replica: int
    fault_from: int | None = None
    corrupt_source: bool = False
    guarded: bool = True
    """False: no guard, only the groups' vote checks the state (a plain forward and backward)."""
    join_after: str | None = None
    """A file this group waits for before it joins the job (a group that joins late); it writes ``joined`` once its
    manager runs, just before its first quorum."""
    announce: dict[int, str] = field(default_factory=dict)
    """Files this group writes before the quorum of a step (step -> file name)."""
    wait_for: dict[int, str] = field(default_factory=dict)
    """Files this group waits for before the quorum of a step (step -> file name)."""


class Traced(NamedTuple):
    """One step of a group, as it saw it."""

    step: int
    replica_rank: int
    healed: bool
    commit: bool
    why: str
    leavers: tuple[int, ...]
    refused: tuple[int, ...]


def _model() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = TinyTransformer(d=8, heads=2, seq=SEQ, layers=1, p=0.0)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


class _Unguarded:
    """A group without a guard: the step's forward and backward, nothing checked but what the groups' vote sees."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model

    def step(self, step: int, batch: Any) -> None:
        lm_loss(self.model, batch).backward()

    def after_optimizer_step(self) -> list[Any]:
        return []


class _CorruptingSource(TorchFTEngine):
    """A source whose memory goes bad between its last vote and the heal it serves: the first group of the job to
    serve a heal flips one bit of a weight in its live state, then serves it (the fingerprints are taken of what it
    sends, so only the vote can tell)."""

    marker: Path

    def serve(self) -> dict[str, Any]:
        with contextlib.suppress(FileExistsError):
            os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL))
            corrupt_weights_(
                self.live.module, Fault(pattern="bitflip", bit=30, elements=1, seed=7), names="*fc1.weight"
            )
        return super().serve()


class _Drill:
    """What a test does to one group besides training: the fault it injects, the files it waits for or writes
    before a quorum, and what the group saw at each step."""

    def __init__(self, g: Group, folder: str, manager: Any) -> None:
        self.g, self.folder, self.manager = g, Path(folder), manager
        self.wait_for = dict(g.wait_for)
        self.trace: list[Traced] = []
        self.fault = None
        if g.fault_from is not None:
            self.fault = OpFaultMode(Fault(pattern="bitflip", bit="exponent", timing="sticky", seed=3), ops="matmul")

    def before_quorum(self) -> None:
        upcoming = self.manager.current_step()
        if upcoming in self.g.announce:
            (self.folder / self.g.announce[upcoming]).touch()
        if upcoming in self.wait_for:
            _wait(self.folder / self.wait_for.pop(upcoming))
            time.sleep(0.5)  # the late group's quorum request reaches the lighthouse first: it joins this quorum

    def faults(self, step: int) -> contextlib.AbstractContextManager[Any]:
        if self.fault is None or self.g.fault_from is None or step < self.g.fault_from:
            return contextlib.nullcontext()
        self.fault.step = step
        return self.fault

    def after_step(self, step: int, engine: TorchFTEngine, commit: bool) -> None:
        v = engine.verdict
        assert v is not None
        self.trace.append(Traced(step, engine.replica_rank, engine.healed, commit, v.why, v.leavers, v.refused))
        self.before_quorum()


def _manager(g: Group, lighthouse: str, min_size: int) -> tuple[Any, Any]:
    """The group's manager, and the group's store it reaches the others' through (keep it alive)."""
    from torchft import Manager
    from torchft.process_group import ProcessGroupGloo

    store = torch.distributed.TCPStore("localhost", 0, is_master=True, wait_for_workers=False)
    seconds = datetime.timedelta(seconds=30)
    manager = Manager(
        pg=ProcessGroupGloo(timeout=seconds),
        load_state_dict=None,
        state_dict=None,
        min_replica_size=min_size,
        use_async_quorum=False,  # a heal lands before the step's forward: the step's vote sees it
        init_sync=False,  # every group starts from the same seeded model (the first vote checks it)
        replica_id=str(g.replica),
        store_addr="localhost",
        store_port=store.port,
        rank=0,
        world_size=1,
        lighthouse_addr=lighthouse,
        timeout=seconds,
        quorum_timeout=datetime.timedelta(seconds=60),
        connect_timeout=seconds,
    )
    return manager, store


def _group(g: Group, lighthouse: str, folder: str, min_size: int) -> None:
    torch.set_num_threads(1)
    if g.join_after is not None:
        _wait(Path(folder) / g.join_after)
    manager, _store = _manager(g, lighthouse, min_size)
    model, opt = _model()
    engine = TorchFTEngine(manager, model, opt) if not g.corrupt_source else _CorruptingSource(manager, model, opt)
    if isinstance(engine, _CorruptingSource):
        engine.marker = Path(folder) / "corrupted"
    guard: Any = _Unguarded(model)
    if g.guarded:
        guard = SDCGuard(
            model, lm_loss, replay_every=0, checksum_every=1, weight_check_every=0, escalate="off", slow=None
        )
    if g.join_after is not None:
        (Path(folder) / "joined").touch()
    drill = _Drill(g, folder, manager)
    drill.before_quorum()
    while (step := engine.start()) < STEPS:
        if engine.healed:  # the heal wrote the weights outside the optimizer: the guard's memory check starts anew
            guard.after_optimizer_step()
        with drill.faults(step):
            report = guard.step(step, make_batch(step, engine.replica_rank, seq=SEQ))
        engine.average_gradients()
        commit = engine.should_commit(report)  # every group's vote; a leaver exits here
        if commit:
            opt.step()
        opt.zero_grad(set_to_none=True)
        guard.after_optimizer_step()
        drill.after_step(step, engine, commit)
    state = opt.state_dict()["state"]
    result = {
        "weights": [p.detach().numpy().tobytes() for p in model.parameters()],
        "optimizer": {k: {n: t.numpy().tobytes() for n, t in v.items()} for k, v in state.items()},
        "trace": drill.trace,
    }
    (Path(folder) / f"group{g.replica}-{os.getpid()}.pkl").write_bytes(pickle.dumps(result))
    manager.shutdown(wait=False)


def _wait(path: Path) -> None:
    while not path.exists():
        time.sleep(0.05)


@dataclass
class Ended:
    """How one group's process ended: its exit status and, when it finished the run, what it held."""

    replica: int
    exitcode: int | None
    result: dict[str, Any] | None


def run_groups(groups: list[Group], folder: Path, *, min_size: int = 3, timeout: float = 120.0) -> list[Ended]:
    """Run ``groups`` under one lighthouse, each in its process, all started at once (a late group or a spare waits
    in its process for its ``join_after`` file); when a group exits 86 the file ``left<replica>`` appears (a spare
    under the same replica id then joins, as a scheduler restarts a drained group elsewhere). Every process ends
    before this returns (killed past ``timeout``)."""
    from torchft._torchft import LighthouseServer

    lighthouse = LighthouseServer(bind="[::]:0", min_replicas=2, join_timeout_ms=20000, heartbeat_timeout_ms=1000)
    ctx = mp.get_context("forkserver")
    # One server process imports torch, torchft and the job once; every group's process is forked from it (no
    # threads run there), instead of importing them afresh in each (seconds each on a shared machine).
    ctx.set_forkserver_preload(["torch", "torchft.manager", "torchft.process_group", __name__])
    running: list[tuple[Group, Any]] = []
    ended: list[Ended] = []

    def start(g: Group) -> None:
        p = ctx.Process(target=_group, args=(g, lighthouse.address(), str(folder), min_size), daemon=True)
        p.start()
        running.append((g, p))

    deadline = time.monotonic() + timeout
    try:
        for g in groups:
            start(g)
        while running and time.monotonic() < deadline:
            for g, p in list(running):
                if p.exitcode is None:
                    continue
                running.remove((g, p))
                found = sorted(folder.glob(f"group{g.replica}-{p.pid}.pkl"))
                ended.append(Ended(g.replica, p.exitcode, pickle.loads(found[0].read_bytes()) if found else None))
                if p.exitcode == 86:
                    (folder / f"left{g.replica}").touch()
            time.sleep(0.05)
    finally:
        for _, p in running:
            p.kill()
            p.join()
        lighthouse.shutdown()
    if running:
        raise TimeoutError(f"replica groups {[g.replica for g, _ in running]} did not finish in {timeout} s")
    return ended
