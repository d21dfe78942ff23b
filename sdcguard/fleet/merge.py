"""``sdcguard merge``: per-node stores into one fleet store, incrementally and idempotently.

Each input is checked (read-only) first: missing, not a store, or of another schema version is refused before anything
is written. Then each is merged in its own transaction by :meth:`sdcguard.fleet.store.maintenance.Maintenance.merge`,
which takes only what is new in it since its last merge (see :mod:`sdcguard.fleet.store.maintenance`).

An input may be a directory: every ``*.db`` file in it is an input (the scanner's node stores, the training
jobs' spools), so a directory that holds none yet is no error, where an unmatched shell glob would be.

Fire drills stay apart (:mod:`sdcguard.fleet.store.drills`): drill stores merge only into a drill store (a new
``OUT`` made of drill stores alone becomes one), and real stores never into one. A drill store found in a directory
is left out of a real merge (its node's drills beside its node store), and named on the result; one named as an
input of a real merge is refused in one line.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ..entry import is_server_url
from ..errors import BadInput
from .store.drills import is_drill_store
from .store.rows import MergeStats
from .store.sqlite.files import check_merge_input
from .store.store import Store

__all__ = ["MergeStats", "merge_stores", "check_merge_input", "expand_inputs", "drills_left_out"]


def expand_inputs(inputs: Sequence[Path]) -> list[Path]:
    """The merge inputs: each file as given, each directory as the ``*.db`` files in it (sorted)."""
    return [q for _, q in _found(inputs)]


def _found(inputs: Sequence[Path]) -> list[tuple[bool, Path]]:
    """``(named, path)`` per input store: named on the command line, or found in a directory."""
    out: list[tuple[bool, Path]] = []
    for p in map(Path, inputs):
        out.extend(
            [(False, q) for q in sorted(q for q in p.glob("*.db") if q.is_file())] if p.is_dir() else [(True, p)]
        )
    return out


def drills_left_out(out: str | Path, inputs: Sequence[Path]) -> list[Path]:
    """The drill stores a merge of ``inputs`` into ``out`` leaves out: those found in a directory, when ``out`` is
    the fleet's record (not a drill store, nor a new one made of drill stores alone)."""
    found = [(named, p) for named, p in _found(inputs) if p.is_file()]
    return [p for _, p in found if is_drill_store(p)] if not _into_drills(out, found) else []


def _into_drills(out: str | Path, found: Sequence[tuple[bool, Path]]) -> bool:
    """Whether the merge goes into a drill store: ``out`` is one, or is new and every input is one."""
    if is_server_url(out):
        return False
    if Path(out).exists():
        return is_drill_store(out)
    return bool(found) and all(p.is_file() and is_drill_store(p) for _, p in found)


def merge_stores(out: str | Path, inputs: Sequence[Path], *, full: bool = False) -> list[MergeStats]:
    """Merge ``inputs`` (SQLite stores) into the store at ``out`` (created if missing: a SQLite file, or a
    PostgreSQL server's ``postgresql://`` URL); returns what each input added.

    ``full``: take every row of every input again instead of what is new since its last merge (natural keys
    still make it count nothing twice).
    """
    if not inputs:
        raise BadInput("merge needs at least one input store")
    found = _found(inputs)
    out_resolved = None if is_server_url(out) else Path(out).resolve()
    for _, p in found:
        if is_server_url(p):
            raise BadInput(f"merge reads SQLite stores (node stores, spools), not {p}: merge into the server instead")
        if Path(p).resolve() == out_resolved:
            raise BadInput(f"cannot merge {p} into itself")
        check_merge_input(Path(p))
    drills = _into_drills(out, found)
    taken = []
    for named, p in found:
        if is_drill_store(p) == drills:
            taken.append(p)
        elif drills:
            raise BadInput(f"{out} is a drill store (fire drills only): {p} holds real scans and never goes into it")
        elif named:
            raise BadInput(
                f"{p} is a drill store (fire drills only): it never goes into the fleet's record {out}; merge drill "
                "stores into a drill store of their own (sdcguard merge fleet.drills.db NODE.drills.db...)"
            )
    with Store.open(out, create=True) as store:
        if drills:
            store.maintenance.mark_drills()
        return [store.maintenance.merge(Path(p), full=full) for p in taken]
