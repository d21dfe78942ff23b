"""``sdcguard merge``: per-node stores into one fleet store, incrementally and idempotently.

Each input is checked (read-only) first: missing, not a store, or of another schema version is refused before anything
is written. Then each is merged in its own transaction by :meth:`sdcguard.fleet.store.maintenance.Maintenance.merge`,
which takes only what is new in it since its last merge (see :mod:`sdcguard.fleet.store.maintenance`).

An input may be a directory: every ``*.db`` file in it is an input (the scanner's node stores, the training
jobs' spools), so a directory that holds none yet is no error, where an unmatched shell glob would be.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ..entry import is_server_url
from ..errors import BadInput
from .store.rows import MergeStats
from .store.sqlite.files import check_merge_input
from .store.store import Store

__all__ = ["MergeStats", "merge_stores", "check_merge_input", "expand_inputs"]


def expand_inputs(inputs: Sequence[Path]) -> list[Path]:
    """The merge inputs: each file as given, each directory as the ``*.db`` files in it (sorted)."""
    out: list[Path] = []
    for p in map(Path, inputs):
        out.extend(sorted(q for q in p.glob("*.db") if q.is_file()) if p.is_dir() else [p])
    return out


def merge_stores(out: str | Path, inputs: Sequence[Path], *, full: bool = False) -> list[MergeStats]:
    """Merge ``inputs`` (SQLite stores) into the store at ``out`` (created if missing: a SQLite file, or a
    PostgreSQL server's ``postgresql://`` URL); returns what each input added.

    ``full``: take every row of every input again instead of what is new since its last merge (natural keys
    still make it count nothing twice).
    """
    if not inputs:
        raise BadInput("merge needs at least one input store")
    inputs = expand_inputs(inputs)
    out_resolved = None if is_server_url(out) else Path(out).resolve()
    for p in inputs:
        if is_server_url(p):
            raise BadInput(f"merge reads SQLite stores (node stores, spools), not {p}: merge into the server instead")
        if Path(p).resolve() == out_resolved:
            raise BadInput(f"cannot merge {p} into itself")
        check_merge_input(Path(p))
    with Store.open(out, create=True) as store:
        return [store.maintenance.merge(Path(p), full=full) for p in inputs]
