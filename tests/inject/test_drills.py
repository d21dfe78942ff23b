"""A training fault drill says what it did: what it injected, or that it injected nothing and the likely reason,
as a warning through the ``sdcguard.inject`` logger by the end of its run (issue 35: a ``CorruptingCommHook``
without ``hook.step`` and an ``OpFaultMode(steps=[5])`` on a step the loop never marks changed nothing, silently)."""

from __future__ import annotations

import gc
import logging

import pytest
import torch

from sdcguard.inject.faults import Fault
from sdcguard.inject.torch_faults import CorruptingCommHook, OpFaultMode

LOGGER = "sdcguard.inject"


def _steps(mode: OpFaultMode, steps: int, *, set_step: bool = True) -> None:
    model = torch.nn.Linear(4, 4)
    with mode:
        for step in range(steps):
            if set_step:
                mode.step = step
            model(torch.ones(2, 4)).sum().backward()


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING]


def test_a_drill_that_injected_says_what_and_where_and_warns_nothing(caplog: pytest.LogCaptureFixture) -> None:
    mode = OpFaultMode(Fault(pattern="bitflip", bit=30), ops="matmul", phase="forward", steps=[1])
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        _steps(mode, 3)
        text = mode.drill.finish()
    assert mode.records and text.startswith("OpFaultMode(rank=None, steps=[1], ops=matmul, phase=forward) injected")
    assert "at step(s) [1]" in text and "aten.addmm" in text
    assert mode.drill.changed == len(mode.records)
    assert _warnings(caplog) == []


def test_a_step_the_loop_never_reaches_is_named(caplog: pytest.LogCaptureFixture) -> None:
    mode = OpFaultMode(Fault(pattern="bitflip"), ops="matmul", steps=[5])
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        _steps(mode, 3)
        mode.drill.finish()
        mode.drill.finish()  # said once
    (line,) = _warnings(caplog)
    assert "injected nothing" in line and "none at its step(s) [5]" in line
    assert mode.records == []


def test_an_unset_step_is_told_at_once_and_at_the_end(caplog: pytest.LogCaptureFixture) -> None:
    mode = OpFaultMode(Fault(pattern="bitflip"), ops="matmul", steps=[0])
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        _steps(mode, 2, set_step=False)
        mode.drill.finish()
    first, last = _warnings(caplog)
    assert ".step is not set" in first and "injected nothing" in last


def test_an_op_the_model_never_runs_is_named(caplog: pytest.LogCaptureFixture) -> None:
    mode = OpFaultMode(Fault(pattern="zero"), ops="embedding")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        _steps(mode, 1)
        del mode
        gc.collect()  # not finished by hand: said when the injector goes away
    (line,) = _warnings(caplog)
    assert "ops=embedding" in line and "no call it watches ran" in line


def test_another_ranks_drill_stays_quiet(caplog: pytest.LogCaptureFixture) -> None:
    mode = OpFaultMode(Fault(pattern="zero"), ops="matmul", rank=1)  # this process is rank 0
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        _steps(mode, 1)
        text = mode.drill.finish()
    assert _warnings(caplog) == [] and "the drill injects on rank 1" in text


class _Bucket:
    def __init__(self, t: torch.Tensor) -> None:
        self.t = t

    def index(self) -> int:
        return 0

    def buffer(self) -> torch.Tensor:
        return self.t


def _reduced(state: object, bucket: _Bucket) -> torch.futures.Future[torch.Tensor]:
    fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


def test_a_comm_hook_without_its_step_says_so_and_with_it_injects(caplog: pytest.LogCaptureFixture) -> None:
    unset = CorruptingCommHook(Fault(pattern="zero"), rank=0, steps=[3], base=_reduced)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        for _ in range(5):
            unset(None, _Bucket(torch.ones(8))).wait()
        unset.drill.finish()
    first, last = _warnings(caplog)
    assert ".step is not set" in first and "CorruptingCommHook(rank=0, steps=[3]) injected nothing" in last
    hook = CorruptingCommHook(Fault(pattern="zero"), rank=0, steps=[3], base=_reduced)
    outputs = []
    for step in range(5):
        hook.step = step
        outputs.append(hook(None, _Bucket(torch.ones(8))).wait())
    assert [bool((o == 0).any()) for o in outputs] == [False, False, False, True, False]
    assert "at step(s) [3]: comm_hook:bucket0" in hook.drill.finish()
