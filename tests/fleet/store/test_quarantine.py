"""``store.quarantine``: a quarantine, its release and its history round trip."""

from __future__ import annotations

import pytest

from sdcguard.errors import BadInput
from sdcguard.fleet.store.store import Store
from tests._fleet import NOW, result, scan


def test_quarantine_round_trip_with_history(store_db: str) -> None:
    with Store.open(store_db) as store:
        scan(store, "sim:1", [result("sim:1")])
        assert store.quarantine.status("sim:1", now=NOW) == "healthy"
        store.quarantine.add("sim:1", reason="MCE in dmesg", by="alice@ops", now=NOW)
        assert store.quarantine.status("sim:1") == "quarantined"
        with pytest.raises(BadInput, match="already quarantined"):
            store.quarantine.add("sim:1", reason="again")
        store.quarantine.release("sim:1", reason="board swapped", by="bob@ops", now=NOW + 10)
        assert store.quarantine.status("sim:1") == "probation"
        with pytest.raises(BadInput, match="not quarantined"):
            store.quarantine.release("sim:1", reason="twice")
        hist = store.quarantine.history("sim:1")
        assert [(h["action"], h["by"], h["reason"], h["time"]) for h in hist] == [
            ("quarantine", "alice@ops", "MCE in dmesg", NOW),
            ("release", "bob@ops", "board swapped", NOW + 10),
        ]
        with pytest.raises(BadInput, match="reason"):
            store.quarantine.add("sim:2", reason="  ")
