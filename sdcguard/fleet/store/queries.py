"""The store's reads not yet moved to a job of their own (part of :class:`~.store.Store`): the quarantine's and the
policy's, and the size of a table."""

from __future__ import annotations

from typing import Literal

from ...records import Incident
from .connection import StoreBase

__all__ = ["StoreQueries"]
_INCIDENT_FIELDS = frozenset(Incident.__dataclass_fields__)
_TUPLE_FIELDS = ("suspect_ranks", "devices", "hosts")


class StoreQueries(StoreBase):
    """Named read queries of the fleet store (part of :class:`sdcguard.fleet.store.store.Store`)."""

    def row_count(self, table: Literal["results", "scans", "devices", "incidents", "rollups"]) -> int:
        """``SELECT COUNT(*)`` of one table: the floor every aggregation is measured against."""
        if table not in ("results", "scans", "devices", "incidents", "rollups"):
            raise ValueError(f"no table {table!r}")
        return int(self._one(f"SELECT COUNT(*) FROM {table}"))
