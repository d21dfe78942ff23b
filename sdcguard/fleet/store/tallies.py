"""The store's running totals, kept exact in the transaction of every write that changes the rows they sum: the day
tallies (executions, failures and testing time per UTC day, device and family, what reports of any window read)
and the case tallies (the slowness statistic's totals per device, case and day, :mod:`.schema` version 10). A
scan's batch adds through :class:`DayTallies`; a merge subtracts and adds the rows it replaces and writes; a prune
deletes no case tallies and keeps, of the days before the horizon, each key's latest."""

from __future__ import annotations

from typing import Any

from ...durations import DAY_S as _DAY_S

__all__ = ["ADD_TALLIES", "day_of", "DayTallies", "tally_rows", "case_tables", "apply_case_deltas", "thin_case_tallies"]


ADD_TALLIES = (
    "INSERT INTO main.day_tallies(device, family, day, executions, failures, test_s) {select} "
    "ON CONFLICT(device, family, day) DO UPDATE SET executions = day_tallies.executions + excluded.executions, "
    "failures = day_tallies.failures + excluded.failures, test_s = day_tallies.test_s + excluded.test_s"
)
"""Adds to ``day_tallies`` what ``{select}`` yields (VALUES or a SELECT of device, family, day and the three counts)."""


def day_of(t: float) -> int:
    """The UTC day (days since the epoch) of a Unix time, as the SQL ``CAST(t / 86400.0 AS INTEGER)`` computes it."""
    return int(t / _DAY_S)


class DayTallies:
    """Changes to ``day_tallies`` and to the case tallies collected in Python (one scan's batch), written together."""

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
            conn.executemany(  # in key order: concurrent writers of one server lock rows in one order
                ADD_TALLIES.format(select="VALUES (?, ?, ?, ?, ?, ?)"),
                [(*key, int(n), int(k), float(s)) for key, (n, k, s) in sorted(self._delta.items())],
            )
            self._delta.clear()
        if self._cases:
            case_tables(conn)
            conn.executemany(
                "INSERT INTO temp.case_delta(device, case_id, day, family, executions, seconds) VALUES "
                "(?, ?, ?, ?, ?, ?)",
                [(*k, f, int(n), float(s)) for k, (f, n, s) in self._cases.items()],
            )
            self._cases.clear()
            apply_case_deltas(conn)


def tally_rows(conn: Any, scans: str, sign: int) -> None:
    """Add (``sign`` 1) or take away (-1) the tallies of every row of the main store's scans ``scans`` (a subquery
    of scan ids): one pass over those rows for the day tallies, one for the case tallies' ``temp.case_delta``."""
    conn.execute(
        ADD_TALLIES.format(
            select=(
                f"SELECT r.device, r.family, CAST(r.started_at / {_DAY_S} AS INTEGER) AS d, "
                f"{sign} * TOTAL(CASE WHEN r.attempt = 0 THEN r.executions ELSE 0 END), "
                f"{sign} * TOTAL(CASE WHEN r.attempt = 0 AND r.passed = 0 THEN 1 ELSE 0 END), "
                f"{sign} * TOTAL(r.duration_s) FROM main.results r WHERE r.scan IN ({scans}) "
                "GROUP BY r.device, r.family, d "
                "HAVING true"
            )
        )
    )
    case_tables(conn)
    conn.execute(
        "INSERT INTO temp.case_delta(device, case_id, day, family, executions, seconds) "
        f"SELECT r.device, r.case_id, CAST(r.started_at / {_DAY_S} AS INTEGER) AS d, MIN(r.family), "
        f"{sign} * SUM(r.executions), {sign} * TOTAL(r.duration_s) FROM main.results r WHERE r.scan IN ({scans}) "
        "AND r.passed = 1 AND r.attempt = 0 GROUP BY r.device, r.case_id, d"
    )


def case_tables(conn: Any) -> None:  # the temporary tables of the case tallies' changes (this connection's)
    sums = "family TEXT, executions INTEGER, seconds REAL"
    conn.execute(f"CREATE TEMP TABLE IF NOT EXISTS case_delta(device TEXT, case_id TEXT, day INTEGER, {sums})")
    conn.execute(
        f"CREATE TEMP TABLE IF NOT EXISTS case_run(device TEXT, case_id TEXT, day INTEGER, {sums}, "
        "PRIMARY KEY (device, case_id, day)) WITHOUT ROWID"
    )
    conn.execute(
        f"CREATE TEMP TABLE IF NOT EXISTS case_keys(device TEXT, case_id TEXT, first INTEGER, last INTEGER, "
        f"{sums}, append INTEGER, PRIMARY KEY (device, case_id)) WITHOUT ROWID"
    )


def apply_case_deltas(conn: Any) -> None:
    """Fold ``temp.case_delta`` (signed changes per device, case and UTC day, clamped to the horizon's eve) into
    ``case_tallies`` and ``case_totals``. ``case_run``: each key's running sum of its changes by day; ``case_keys``:
    its first and last day changed, whole change, and whether it all comes after the key's latest day (today's
    scans): then a row per day changed is the totals plus the running sum. Otherwise a row at each day changed
    takes the total before it, and every row from the first changed day on gains the running sum at its day. The
    totals gain the whole change, the same addition as the key's latest row: they stay equal to it bit for bit."""
    horizon = conn.execute("SELECT value FROM main.meta WHERE key = 'pruned_before'").fetchone()
    eve = -(2**62) if horizon is None else int(float(horizon[0]) // _DAY_S) - 1
    for table in ("case_run", "case_keys"):
        conn.execute(f"DELETE FROM temp.{table}")
    conn.execute(
        "INSERT INTO temp.case_run(device, case_id, day, family, executions, seconds) "
        "SELECT device, case_id, day, family, SUM(n) OVER w, SUM(s) OVER w FROM ("
        "  SELECT device, case_id, day, MIN(family) AS family, SUM(executions) AS n, TOTAL(seconds) AS s FROM ("
        "    SELECT device, case_id, MAX(day, ?) AS day, family, executions, seconds FROM temp.case_delta) AS c "
        "  GROUP BY device, case_id, day HAVING SUM(executions) != 0 OR TOTAL(seconds) != 0) AS g "
        "WINDOW w AS (PARTITION BY device, case_id ORDER BY day)",
        (eve,),
    )
    conn.execute("DELETE FROM temp.case_delta")
    conn.execute(  # the last day's row per key (its family, the whole change), and its first day
        "INSERT INTO temp.case_keys(device, case_id, family, first, last, executions, seconds, append) "
        "SELECT r.device, r.case_id, r.family, m.first, r.day, r.executions, r.seconds, CASE WHEN COALESCE(("
        "  SELECT t.day FROM main.case_totals t WHERE t.device = r.device AND t.case_id = r.case_id) < m.first, "
        "  true) THEN 1 ELSE 0 END FROM (SELECT device, case_id, MIN(day) AS first, MAX(day) AS last "
        "  FROM temp.case_run GROUP BY device, case_id) AS m "
        "JOIN temp.case_run r ON r.device = m.device AND r.case_id = m.case_id AND r.day = m.last"
    )
    keyed = "FROM temp.case_keys k JOIN temp.case_run r USING (device, case_id)"
    conn.execute(
        "INSERT INTO main.case_tallies(device, day, case_id, executions, seconds) SELECT r.device, r.day, r.case_id, "
        f"COALESCE(t.executions, 0) + r.executions, COALESCE(t.seconds, 0.0) + r.seconds {keyed} "
        "LEFT JOIN main.case_totals t USING (device, case_id) WHERE k.append = 1"
    )
    floor = (
        "COALESCE((SELECT x.{0} FROM main.case_tallies x WHERE x.device = r.device AND x.case_id = r.case_id "
        "AND x.day < r.day ORDER BY x.day DESC LIMIT 1), 0)"
    )
    conn.execute(
        "INSERT OR IGNORE INTO main.case_tallies(device, day, case_id, executions, seconds) SELECT "
        f"r.device, r.day, r.case_id, {floor.format('executions')}, {floor.format('seconds')} {keyed} "
        "WHERE k.append = 0"
    )
    run = (
        "(SELECT r.{0} FROM temp.case_run r WHERE r.device = case_tallies.device AND r.case_id = "
        "case_tallies.case_id AND r.day <= case_tallies.day ORDER BY r.day DESC LIMIT 1)"
    )
    conn.execute(
        f"UPDATE main.case_tallies SET executions = executions + {run.format('executions')}, seconds = seconds + "
        f"{run.format('seconds')} WHERE (device, day, case_id) IN (SELECT x.device, x.day, x.case_id FROM "
        "  temp.case_keys k CROSS JOIN main.case_tallies x ON x.device = k.device AND x.day >= k.first "
        "  AND x.case_id = k.case_id WHERE k.append = 0)"
    )
    conn.execute(
        "INSERT INTO main.case_totals(device, case_id, family, first, day, executions, seconds) SELECT device, "
        "case_id, family, first, last, executions, seconds FROM temp.case_keys WHERE true ON CONFLICT(device, case_id) "
        "DO UPDATE SET executions = case_totals.executions + excluded.executions, "
        "seconds = case_totals.seconds + excluded.seconds, first = MIN(case_totals.first, excluded.first), "
        "day = MAX(case_totals.day, excluded.day)"
    )


def thin_case_tallies(conn: Any, horizon: float) -> None:
    """Of the case tallies up to the horizon's eve keep each key's latest, moved to the eve (nothing changed in
    between), reading only those days, device by device."""
    eve, devices = int(horizon // _DAY_S) - 1, "device IN (SELECT DISTINCT device FROM main.case_totals)"
    conn.execute(
        "INSERT INTO main.case_tallies(device, day, case_id, executions, seconds) SELECT device, "
        "?, case_id, executions, seconds FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY device, case_id "
        f"ORDER BY day DESC) AS k FROM main.case_tallies WHERE {devices} AND day <= ?) AS latest "
        "WHERE k = 1 AND day < ? ON CONFLICT(device, day, case_id) DO UPDATE SET executions = excluded.executions, "
        "seconds = excluded.seconds",
        (eve, eve, eve),
    )
    conn.execute(f"DELETE FROM main.case_tallies WHERE {devices} AND day < ?", (eve,))
    conn.execute("UPDATE main.case_totals SET first = ?, day = MAX(day, ?) WHERE first < ?", (eve, eve, eve))
