"""A guard whose ``store=`` cannot take its records is told at construction, not at its first incident (which may
come weeks into the run): a warning through the ``sdcguard`` logger naming the path and the problem; training goes
on, incidents in memory."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

import sdcguard
from sdcguard.fleet.store.store import Store
from tests._logs import expect_log, logged


def _guard(store: Path) -> sdcguard.SDCGuard:
    model = torch.nn.Linear(3, 2)
    return sdcguard.SDCGuard(model, lambda m, b: m(b).sum(), store=store)


@pytest.mark.parametrize("kind", ["missing directory", "not a store", "read-only"])
def test_a_store_that_cannot_be_written_is_told_at_construction(kind: str, tmp_path: Path) -> None:
    if kind == "missing directory":
        path = tmp_path / "nowhere" / "job.db"
    elif kind == "not a store":
        path = tmp_path / "notes.db"
        path.write_text("not a database\n" * 20)
    else:
        if os.geteuid() == 0:
            pytest.skip("root writes read-only files: nothing to refuse")
        path = tmp_path / "ro" / "job.db"
        path.parent.mkdir()
        Store.open(path).close()
        path.chmod(0o444)
        path.parent.chmod(0o555)
    with expect_log("cannot record incidents there") as messages:
        guard = _guard(path)
    assert any(str(path) in m for m in messages)
    out = guard.step(0, torch.ones(4, 3))  # the guard still works
    assert out.commit


def test_a_good_store_is_opened_silently_and_ready(tmp_path: Path) -> None:
    path = tmp_path / "job.db"
    with logged() as messages:
        _guard(path)
    assert not [m for m in messages if "store" in m], messages
    with Store.open(path, readonly=True) as store:
        assert store.training.incidents() == []
