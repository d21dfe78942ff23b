"""Derived summaries the store keeps (``store.summaries``): figures too costly to recompute on every read at fleet
scale (the slowness verdicts, :mod:`sdcguard.fleet.slow_fleet`; a report's rows, :mod:`sdcguard.fleet.report.kept`),
and what tells a kept one from a stale one: each device's version (:data:`~.core.ADD_ONE`) and the devices whose
figures a moved window's start changes. Derived data: never merged, forwarded or pruned."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from .core import StoreCore

__all__ = ["Summaries"]

_UPSERT = "INSERT INTO meta(key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value"


class Summaries:
    """Kept summaries and the devices' versions.

    Args:
        core: the store's core (:class:`~.core.StoreCore`).
    """

    def __init__(self, core: StoreCore) -> None:
        self._core = core

    def keep(self, name: str, summary: Mapping[str, Any], *, body: str | None = None) -> None:
        """Keep a summary (JSON-able) under ``name``, replacing the one kept before. ``body``: a text kept with it,
        as it is (no JSON string to escape and unescape). :meth:`kept` and :meth:`kept_with_body` read it back."""
        with self._core.write() as conn:
            conn.execute(_UPSERT, (f"summary.{name}", json.dumps(summary, separators=(",", ":"))))
            if body is not None:
                conn.execute(_UPSERT, (f"body.{name}", body))

    def kept(self, name: str) -> dict[str, Any] | None:
        """The summary last kept under ``name``, None if none was."""
        value = self._core.meta(f"summary.{name}")
        return None if value is None else dict(json.loads(value))

    def kept_with_body(self, name: str) -> tuple[dict[str, Any], str] | None:
        """The summary last kept under ``name`` with the text kept beside it (``body``, read in the same
        statement: the two written together), None if none was."""
        rows = dict(
            self._core.rows("SELECT key, value FROM meta WHERE key IN (?, ?)", (f"summary.{name}", f"body.{name}"))
        )
        head, body = rows.get(f"summary.{name}"), rows.get(f"body.{name}")
        return None if head is None or body is None else (dict(json.loads(head)), str(body))

    def device_versions(self) -> dict[str, int]:
        """Every known device's version: one more with every write that changed what a report says of it."""
        return dict(self._core.rows("SELECT id, version FROM devices"))

    def devices_started_between(self, lo: float, hi: float) -> set[str]:
        """The devices with an execution or a complete scan that started in ``[lo, hi)`` (rows held: pruned days
        have none): those whose figures change when a window's start moves from ``lo`` to ``hi`` within a UTC
        day."""
        return {
            r[0]
            for r in self._core.rows(
                "SELECT DISTINCT device FROM results INDEXED BY results_time WHERE started_at >= ? AND started_at < ? "
                "UNION SELECT DISTINCT device FROM scans INDEXED BY scans_status WHERE status = 'complete' "
                "AND started_at >= ? AND started_at < ?",
                (lo, hi, lo, hi),
            )
        }
