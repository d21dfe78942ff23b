"""Where fire drills go: a store of their own, never the fleet's record.

A scan with ``--inject`` and a training job whose process runs an injector (:mod:`sdcguard.inject`) or sets
``$SDCGUARD_DRILL`` (each injector sets it) are drills; their writes through :func:`~.spool.open_writer` go to the
drill store. Their results are kept (a drill is evidence that the pipeline works) in a SQLite store marked as a
drill store, which every command reads as it reads any store (``sdcguard report --drills``), and
never in the fleet's record: a drill's failures count toward no rate, bound, quarantine, breaker, slowness, HTML
figure or Prometheus counter of the fleet, because the fleet's store never holds them.

The drill store is ``--drill-store`` (``$SDCGUARD_DRILL_STORE``), else beside the fleet's store: ``X.drills.db``
for a SQLite ``X.db``; for a server, ``~/.local/state/sdcguard/drills-<host>-<server>.db``. A drill into a store
that holds real scans is refused, and so is a real scan into a drill store (one line each, exit 2).

A store written before drills were kept apart may hold drill scans (their ``inject`` in ``scans.meta``):
:func:`move_legacy_drills` (``sdcguard db move-drills``) moves them into the drill store, their tallies with them,
by a merge into the drill store first and a deletion from the fleet's second, so a crash between the two leaves the
drill in both, and a second run finishes the move (a merge takes a scan it holds already only once).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ...devices import hostname
from ...entry import is_server_url
from ...errors import BadInput, SdcguardError
from ...logs import get_logger
from .store import Store

__all__ = [
    "DRILL_STORE_ENV",
    "DRILL_ENV",
    "drill_store_for",
    "open_for_drills",
    "refuse_drill_store",
    "drill_running",
    "store_in_use",
    "is_drill_store",
    "drills_writer",
    "MovedDrills",
    "move_legacy_drills",
]

DRILL_STORE_ENV = "SDCGUARD_DRILL_STORE"
"""The environment variable naming the drill store."""
DRILL_ENV = "SDCGUARD_DRILL"
"""Set (to anything but empty or 0) in a training job's environment: the job is a drill."""


def drill_store_for(db: str | os.PathLike[str], named: str | os.PathLike[str] | None = None) -> str:
    """The drill store of the fleet store ``db``: ``named``, else ``$SDCGUARD_DRILL_STORE``, else beside it."""
    if named:
        return str(named)
    if os.environ.get(DRILL_STORE_ENV):
        return os.environ[DRILL_STORE_ENV]
    if is_server_url(db):  # this host's state folder (made here: no drill has run on this host yet)
        state = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state") / "sdcguard"
        state.mkdir(parents=True, exist_ok=True)
        return str(state / f"drills-{hostname()}-{hashlib.sha256(str(db).encode()).hexdigest()[:12]}.db")
    path = Path(db)
    stem = path.name[:-3] if path.name.endswith(".db") else path.name
    return str(path.with_name(f"{stem}.drills.db"))


def open_for_drills(path: str) -> Store:
    """The drill store at ``path``, created and marked as one; :class:`BadInput` for a server URL or a store that
    holds real scans."""
    if is_server_url(path):
        raise BadInput(f"--drill-store {path}: a drill store is a local SQLite file, never a server's store")
    store = Store.open(path)
    try:
        if not store.maintenance.holds_drills:
            if store.maintenance.row_count("scans") or store.maintenance.row_count("incidents"):
                raise BadInput(
                    f"{path} holds real scans: a fire drill goes to a store of its own (--drill-store FILE), never "
                    "into the fleet's record"
                )
            store.maintenance.mark_drills()
    except BaseException:
        store.close()
        raise
    return store


def refuse_drill_store(store: Store) -> None:
    """:class:`BadInput` when ``store`` is a drill store: real results never go there."""
    if store.maintenance.holds_drills:
        raise BadInput(
            f"{store.path} is a drill store (fire drills only): give the fleet's store with --db, or run the drill "
            "with --inject"
        )


def drill_running() -> bool:
    """Whether this process is a drill: ``$SDCGUARD_DRILL`` is set, as every injector of :mod:`sdcguard.inject`
    sets it in the process that makes it."""
    return os.environ.get(DRILL_ENV, "") not in ("", "0")


def is_drill_store(db: str | os.PathLike[str]) -> bool:
    """Whether ``db`` is an existing SQLite store marked as a drill store."""
    if is_server_url(db) or not Path(db).is_file():
        return False
    try:
        with Store.open(str(db), readonly=True) as store:
            return store.maintenance.holds_drills
    except SdcguardError:  # not a store, or one this version cannot read: whoever opens it says why
        return False


_said: set[str] = set()


def store_in_use(db: str | os.PathLike[str]) -> str:
    """The store this process records to and reads its own records from, given the fleet's store ``db``: ``db``,
    or in a drill (:func:`drill_running`) its drill store (``db`` itself when it is one)."""
    if not drill_running() or is_drill_store(db):
        return str(db)
    return drill_store_for(db)


def drills_writer(db: str | os.PathLike[str]) -> Store:
    """The drill store of ``db`` (:func:`store_in_use`), opened for a drill's writes; said once per process
    through the logger."""
    path = store_in_use(db)
    if path not in _said:
        _said.add(path)
        get_logger("store").warning("a fault drill: its records go to the drill store %s, not to %s", path, db)
    return open_for_drills(path)


@dataclass(frozen=True)
class MovedDrills:
    """What :func:`move_legacy_drills` moved."""

    scans: int
    results: int
    devices: tuple[str, ...]
    to: str


def move_legacy_drills(store: Store, drill_store: str) -> MovedDrills:
    """Move the drill scans ``store`` holds from before drills were kept apart into the drill store at
    ``drill_store`` (made if absent; refused when it holds real scans): merged there first (through a SQLite file of
    just those scans beside it), then deleted from ``store`` with their tallies (:meth:`~.scans.Scans.take_out`).
    Scans already pruned are in the roll-ups without their meta and stay there."""
    refuse_drill_store(store)
    found = store.scans.legacy_drills()
    if not found:
        return MovedDrills(0, 0, (), drill_store)
    ids = sorted(found)
    with open_for_drills(drill_store) as drills:
        with tempfile.TemporaryDirectory(dir=Path(drill_store).parent, prefix=".move-drills-") as folder:
            moving = str(Path(folder) / "drills.db")
            Store.open(moving).close()
            store.scans.copy_out(ids, moving)
            drills.maintenance.merge(Path(moving), full=True)
    scans, results = store.scans.take_out(ids)
    return MovedDrills(scans, results, tuple(sorted(set(found.values()))), drill_store)
