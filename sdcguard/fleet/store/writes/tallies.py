"""The store's running totals, kept exact in the transaction of every write that changes the rows they sum: the day
tallies (executions, failures and testing time per UTC day, device and family, the rows held), the case tallies (the
slowness statistic's running totals per device, case and day, schema version 10: :mod:`..schema.tally_tables`) and the
family tallies (the rates' running totals per device, family and day, version 12). A scan's batch adds through
:class:`DayTallies`; a merge subtracts and adds the rows it replaces and writes; a prune deletes no running total and
keeps, of the days before the horizon, each key's latest (the family tallies lose what the prune rolls up from the end
of each pruned day on, which the roll-ups then count)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ....durations import DAY_S as _DAY_S

__all__ = [
    "ADD_TALLIES",
    "day_of",
    "DayTallies",
    "tally_rows",
    "running_tables",
    "Runs",
    "CASES",
    "FAMILIES",
    "apply_deltas",
    "apply_running_deltas",
    "thin_case_tallies",
]


ADD_TALLIES = (
    "INSERT INTO main.day_tallies(device, family, day, executions, failures, test_s) {select} "
    "ON CONFLICT(device, family, day) DO UPDATE SET executions = day_tallies.executions + excluded.executions, "
    "failures = day_tallies.failures + excluded.failures, test_s = day_tallies.test_s + excluded.test_s"
)
"""Adds to ``day_tallies`` what ``{select}`` yields (VALUES or a SELECT of device, family, day and the three counts)."""


def day_of(t: float) -> int:
    """The UTC day (days since the epoch) of a Unix time, as the SQL ``CAST(t / 86400.0 AS INTEGER)`` computes it."""
    return int(t / _DAY_S)


@dataclass(frozen=True)
class Runs:
    """One kind of running totals: its tables and columns (the store's own names, never input). ``tallies`` holds,
    per device, UTC day and key on which something changed, the sums through the end of that day; ``totals`` those
    through the key's last such day (``day``), with its first (``first``) and the ``label`` it carries."""

    name: str
    """The prefix of its temporary tables (``temp.<name>_delta``: the signed changes a write collects)."""
    tallies: str
    totals: str
    key: str
    sums: tuple[str, ...]
    label: str | None = None

    @property
    def columns(self) -> str:
        return ", ".join(self.sums)


CASES = Runs("case", "case_tallies", "case_totals", "case_id", ("executions", "seconds"), "family")
"""The slowness statistic's: passing first executions of a case and their device seconds."""
FAMILIES = Runs("family", "family_tallies", "family_totals", "family", ("executions", "failures", "test_s"))
"""The rates': first-attempt executions of a family, their failures, and every second of testing (retests too)."""

_REAL = frozenset({"seconds", "test_s"})


def _type(column: str) -> str:
    return "REAL" if column in _REAL else "INTEGER"


class DayTallies:
    """Changes to ``day_tallies`` and to the family and case tallies collected in Python (one scan's batch), written
    together."""

    def __init__(self) -> None:
        self._delta: dict[tuple[str, str, int], list[float]] = {}
        self._cases: dict[tuple[str, str, int], list[Any]] = {}

    def add(
        self,
        device: str,
        family: str,
        started_at: float,
        executions: int,
        failures: int,
        seconds: float,
        *,
        case: str | None = None,
    ) -> None:
        """Rows that change by these amounts; with ``case``, passing first executions of it (case tallies too)."""
        key = (device, family, day_of(started_at))
        d = self._delta.setdefault(key, [0, 0, 0.0])
        d[0] += executions
        d[1] += failures
        d[2] += seconds
        if case is not None:
            c = self._cases.setdefault((device, case, key[2]), [family, 0, 0.0])
            c[1] += executions
            c[2] += seconds

    def write(self, conn: Any) -> None:
        if self._delta:
            rows = [(*key, int(n), int(k), float(s)) for key, (n, k, s) in sorted(self._delta.items())]
            # in key order: concurrent writers of one server lock rows in one order
            conn.executemany(ADD_TALLIES.format(select="VALUES (?, ?, ?, ?, ?, ?)"), rows)
            running_tables(conn)
            conn.executemany(
                "INSERT INTO temp.family_delta(device, family, day, executions, failures, test_s) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                rows,
            )
            self._delta.clear()
            apply_deltas(conn, FAMILIES)
        if self._cases:
            running_tables(conn)
            conn.executemany(
                "INSERT INTO temp.case_delta(device, case_id, day, family, executions, seconds) VALUES "
                "(?, ?, ?, ?, ?, ?)",
                [(*k, f, int(n), float(s)) for k, (f, n, s) in self._cases.items()],
            )
            self._cases.clear()
            apply_deltas(conn, CASES)


def tally_rows(conn: Any, scans: str, sign: int) -> None:
    """Add (``sign`` 1) or take away (-1) the tallies of every row of the main store's scans ``scans`` (a subquery
    of scan ids): one pass over those rows for the day tallies (and the family tallies' ``temp.family_delta``), one
    for the case tallies' ``temp.case_delta``."""
    running_tables(conn)
    conn.execute("DELETE FROM temp.tally_pass")
    conn.execute(
        "INSERT INTO temp.tally_pass(device, family, day, executions, failures, test_s) "
        f"SELECT r.device, r.family, CAST(r.started_at / {_DAY_S} AS INTEGER) AS d, "
        f"{sign} * TOTAL(CASE WHEN r.attempt = 0 THEN r.executions ELSE 0 END), "
        f"{sign} * TOTAL(CASE WHEN r.attempt = 0 AND r.passed = 0 THEN 1 ELSE 0 END), "
        f"{sign} * TOTAL(r.duration_s) FROM main.results r WHERE r.scan IN ({scans}) "
        "GROUP BY r.device, r.family, d"
    )
    columns = "device, family, day, executions, failures, test_s"
    conn.execute(ADD_TALLIES.format(select=f"SELECT {columns} FROM temp.tally_pass WHERE true"))
    conn.execute(f"INSERT INTO temp.family_delta({columns}) SELECT {columns} FROM temp.tally_pass")
    conn.execute(
        "INSERT INTO temp.case_delta(device, case_id, day, family, executions, seconds) "
        f"SELECT r.device, r.case_id, CAST(r.started_at / {_DAY_S} AS INTEGER) AS d, MIN(r.family), "
        f"{sign} * SUM(r.executions), {sign} * TOTAL(r.duration_s) FROM main.results r WHERE r.scan IN ({scans}) "
        "AND r.passed = 1 AND r.attempt = 0 GROUP BY r.device, r.case_id, d"
    )


def running_tables(conn: Any) -> None:
    """The temporary tables of the running totals' changes (this connection's): per kind its signed changes
    (``<name>_delta``), their running sums by day (``<name>_run``) and per key (``<name>_keys``)."""
    conn.execute(
        "CREATE TEMP TABLE IF NOT EXISTS tally_pass(device TEXT, family TEXT, day INTEGER, executions INTEGER, "
        "failures INTEGER, test_s REAL)"
    )
    for runs in (CASES, FAMILIES):
        label = f"{runs.label} TEXT, " if runs.label else ""
        sums = ", ".join(f"{c} {_type(c)}" for c in runs.sums)
        head = f"device TEXT, {runs.key} TEXT"
        conn.execute(f"CREATE TEMP TABLE IF NOT EXISTS {runs.name}_delta({head}, day INTEGER, {label}{sums})")
        conn.execute(
            f"CREATE TEMP TABLE IF NOT EXISTS {runs.name}_run({head}, day INTEGER, {label}{sums}, "
            f"PRIMARY KEY (device, {runs.key}, day)) WITHOUT ROWID"
        )
        conn.execute(
            f"CREATE TEMP TABLE IF NOT EXISTS {runs.name}_keys({head}, first INTEGER, last INTEGER, {label}{sums}, "
            f"append INTEGER, PRIMARY KEY (device, {runs.key})) WITHOUT ROWID"
        )


def apply_running_deltas(conn: Any) -> None:
    """:func:`apply_deltas` of every kind (a merge's changes)."""
    for runs in (CASES, FAMILIES):
        apply_deltas(conn, runs)


def apply_deltas(conn: Any, runs: Runs) -> None:
    """Fold ``temp.<name>_delta`` (signed changes per device, key and UTC day, clamped to the horizon's eve) into the
    running totals ``runs``. ``<name>_run``: each key's running sum of its changes by day; ``<name>_keys``: its first
    and last day changed, whole change, and whether it all comes after the key's latest day (today's scans): then a
    row per day changed is the totals plus the running sum. Otherwise a row at each day changed takes the total
    before it, and every row from the first changed day on gains the running sum at its day. The totals gain the
    whole change, the same addition as the key's latest row: they stay equal to it bit for bit."""
    n, key, cols, t, tt = runs.name, runs.key, runs.columns, runs.tallies, runs.totals
    horizon = conn.execute("SELECT value FROM main.meta WHERE key = 'pruned_before'").fetchone()
    eve = -(2**62) if horizon is None else int(float(horizon[0]) // _DAY_S) - 1
    for table in ("run", "keys"):
        conn.execute(f"DELETE FROM temp.{n}_{table}")
    lab, mlab, rlab = (
        (f"{runs.label}, ", f"MIN({runs.label}) AS {runs.label}, ", f"r.{runs.label}, ") if runs.label else ("", "", "")
    )
    agg = ", ".join(f"{'TOTAL' if c in _REAL else 'SUM'}({c}) AS {c}" for c in runs.sums)
    nonzero = " OR ".join(f"{'TOTAL' if c in _REAL else 'SUM'}({c}) != 0" for c in runs.sums)
    conn.execute(
        f"INSERT INTO temp.{n}_run(device, {key}, day, {lab}{cols}) "
        f"SELECT device, {key}, day, {lab}{', '.join(f'SUM({c}) OVER w' for c in runs.sums)} FROM ("
        f"  SELECT device, {key}, day, {mlab}{agg} FROM ("
        f"    SELECT device, {key}, MAX(day, ?) AS day, {lab}{cols} FROM temp.{n}_delta) AS c "
        f"  GROUP BY device, {key}, day HAVING {nonzero}) AS g "
        f"WINDOW w AS (PARTITION BY device, {key} ORDER BY day)",
        (eve,),
    )
    conn.execute(f"DELETE FROM temp.{n}_delta")
    conn.execute(  # the last day's row per key (its label, the whole change), and its first day
        f"INSERT INTO temp.{n}_keys(device, {key}, {lab}first, last, {cols}, append) "
        f"SELECT r.device, r.{key}, {rlab}m.first, r.day, {', '.join(f'r.{c}' for c in runs.sums)}, CASE WHEN "
        f"COALESCE((SELECT t.day FROM main.{tt} t WHERE t.device = r.device AND t.{key} = r.{key}) < m.first, "
        f"  true) THEN 1 ELSE 0 END FROM (SELECT device, {key}, MIN(day) AS first, MAX(day) AS last "
        f"  FROM temp.{n}_run GROUP BY device, {key}) AS m "
        f"JOIN temp.{n}_run r ON r.device = m.device AND r.{key} = m.{key} AND r.day = m.last"
    )
    keyed = f"FROM temp.{n}_keys k JOIN temp.{n}_run r USING (device, {key})"
    zero = {c: "0.0" if c in _REAL else "0" for c in runs.sums}
    conn.execute(
        f"INSERT INTO main.{t}(device, day, {key}, {cols}) SELECT r.device, r.day, r.{key}, "
        + ", ".join(f"COALESCE(t.{c}, {zero[c]}) + r.{c}" for c in runs.sums)
        + f" {keyed} LEFT JOIN main.{tt} t USING (device, {key}) WHERE k.append = 1"
    )
    floor = (
        f"COALESCE((SELECT x.{{0}} FROM main.{t} x WHERE x.device = r.device AND x.{key} = r.{key} "
        "AND x.day < r.day ORDER BY x.day DESC LIMIT 1), 0)"
    )
    conn.execute(
        f"INSERT OR IGNORE INTO main.{t}(device, day, {key}, {cols}) SELECT r.device, r.day, r.{key}, "
        + ", ".join(floor.format(c) for c in runs.sums)
        + f" {keyed} WHERE k.append = 0"
    )
    run = (
        f"(SELECT r.{{0}} FROM temp.{n}_run r WHERE r.device = {t}.device AND r.{key} = {t}.{key} "
        f"AND r.day <= {t}.day ORDER BY r.day DESC LIMIT 1)"
    )
    conn.execute(
        f"UPDATE main.{t} SET "
        + ", ".join(f"{c} = {c} + {run.format(c)}" for c in runs.sums)
        + f" WHERE (device, day, {key}) IN (SELECT x.device, x.day, x.{key} FROM temp.{n}_keys k CROSS JOIN "
        f"main.{t} x ON x.device = k.device AND x.day >= k.first AND x.{key} = k.{key} WHERE k.append = 0)"
    )
    conn.execute(
        f"INSERT INTO main.{tt}(device, {key}, {lab}first, day, {cols}) SELECT device, {key}, {lab}first, last, "
        f"{cols} FROM temp.{n}_keys WHERE true ON CONFLICT(device, {key}) DO UPDATE SET "
        + ", ".join(f"{c} = {tt}.{c} + excluded.{c}" for c in runs.sums)
        + f", first = MIN({tt}.first, excluded.first), day = MAX({tt}.day, excluded.day)"
    )


def thin_case_tallies(conn: Any, horizon: float) -> None:
    """Of the case and family tallies up to the horizon's eve keep each key's latest, moved to the eve (nothing
    changed in between), reading only those days, device by device."""
    eve = int(horizon // _DAY_S) - 1
    for runs in (CASES, FAMILIES):
        t, key, cols = runs.tallies, runs.key, runs.columns
        devices = f"device IN (SELECT DISTINCT device FROM main.{runs.totals})"
        conn.execute(
            f"INSERT INTO main.{t}(device, day, {key}, {cols}) SELECT device, ?, {key}, {cols} FROM (SELECT *, "
            f"ROW_NUMBER() OVER (PARTITION BY device, {key} ORDER BY day DESC) AS k FROM main.{t} WHERE {devices} "
            f"AND day <= ?) AS latest WHERE k = 1 AND day < ? ON CONFLICT(device, day, {key}) DO UPDATE SET "
            + ", ".join(f"{c} = excluded.{c}" for c in runs.sums),
            (eve, eve, eve),
        )
        conn.execute(f"DELETE FROM main.{t} WHERE {devices} AND day < ?", (eve,))
        conn.execute(f"UPDATE main.{runs.totals} SET first = ?, day = MAX(day, ?) WHERE first < ?", (eve, eve, eve))
