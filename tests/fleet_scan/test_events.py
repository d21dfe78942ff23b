"""The scan's events: what a worker writes on stdout is what the runner and the reporters read back, by kind."""

from __future__ import annotations

import io
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleet_scan.device_scan.summary import DeviceSummary
from fleet_scan.events import (
    CaseFailed,
    Event,
    Message,
    PolicyApplied,
    ScanProgress,
    ScanStarted,
    ScanSummary,
    event_from_json,
)
from fleet_scan.progress import JsonReporter

_text = st.text(max_size=12)
_opt_text = st.none() | _text
_count = st.integers(0, 10**9)
_names = st.lists(_text, max_size=3).map(tuple)
_seconds = st.floats(0, 1e6, allow_nan=False)

_EVENTS: st.SearchStrategy[Event] = st.one_of(
    st.builds(ScanStarted, device=_text, scan=st.integers(1, 10**9), budget_s=st.none() | _seconds),
    st.builds(ScanProgress, device=_text, elapsed_s=_seconds, executions=_count, failures=_count),
    st.builds(
        CaseFailed,
        device=_text,
        case=_text,
        count=st.integers(1, 10**6),
        seed=st.integers(0, 2**63),
        element=st.none() | _count,
        mismatches=_count,
        expected=_opt_text,
        actual=_opt_text,
        xor_mask=_opt_text,
        location=_opt_text,
        sticky=st.none() | st.booleans(),
    ),
    st.builds(Message, text=_text),
    st.builds(
        PolicyApplied,
        scope=st.sampled_from(["fleet", "node"]),
        quarantined=_names,
        breaker_tripped=st.booleans(),
        reasons=_names,
    ),
    st.builds(
        ScanSummary,
        exit_code=st.sampled_from([0, 1, 2, 130, 143]),
        message=_text,
        scanned=_names,
        skipped=_names,
        quarantined=_names,
        breaker_tripped=st.booleans(),
        stopped_by=st.none() | st.sampled_from(["SIGTERM", "SIGINT"]),
    ),
    st.builds(
        DeviceSummary,
        device=_text,
        kind=st.sampled_from(["cpu", "gpu"]),
        status=st.just("complete"),
        scan=st.integers(1, 10**6),
        executions=_count,
        failures=_count,
        failing_cases=st.dictionaries(_text, _count, max_size=3),
        sticky_cases=_names,
        elapsed_s=_seconds,
        budget_s=st.none() | _seconds,
    ),
)


@given(_EVENTS)
def test_every_event_crosses_the_process_boundary_as_itself(event: Event) -> None:
    """One JSON line out (what a worker writes, what ``--json`` prints), the same typed event back in."""
    line = json.dumps(event.to_json())
    data = json.loads(line)
    assert data["event"] == type(event).EVENT
    back = event_from_json(data)
    assert type(back) is type(event) and back == event


@given(_EVENTS)
def test_json_lines_print_each_event_as_its_to_json(event: Event) -> None:
    out = io.StringIO()
    JsonReporter(out).event(event)
    (line,) = out.getvalue().splitlines()
    assert json.loads(line) == json.loads(json.dumps(event.to_json()))


def test_each_kind_has_one_class() -> None:
    kinds = [c.EVENT for c in (ScanStarted, ScanProgress, CaseFailed, Message, PolicyApplied, ScanSummary)]
    assert len(set(kinds)) == len(kinds) and DeviceSummary.EVENT not in kinds


@pytest.mark.parametrize(
    ("data", "error"),
    [
        ({"text": "no kind"}, ValueError),
        ({"event": "nonsense"}, ValueError),
        ([1, 2], ValueError),  # a stray JSON line from a library
        ({"event": "message"}, TypeError),  # a kind without its fields
        ({"event": "message", "text": "x", "extra": 1}, TypeError),
        ({"event": "progress", "device": "d", "elapsed_s": 1.0, "executions": 1}, TypeError),
    ],
)
def test_what_is_no_event_is_refused_by_name(data: object, error: type[Exception]) -> None:
    """The runner skips such a line (a library's print) instead of reading fields that are not there."""
    with pytest.raises(error):
        event_from_json(data)
