"""``dcgmi diag -j`` outputs of the two documented shapes (DCGM 4.x and 3.x) read into per-GPU results (failures,
warnings with their error ids, skipped and not-run tests, serials, other entities left out), and anything else
refused in one line: not JSON, foreign JSON, a run that never ran, a status DCGM does not write."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sdcguard.errors import BadInput
from sdcguard.fleet.dcgm import parse_diag

DATA = Path(__file__).parent / "data" / "dcgm"


def test_a_level_3_run_of_dcgm_4() -> None:
    run = parse_diag((DATA / "level3-4x-memory-fail.json").read_text())
    assert (run.dcgm_version, run.driver, run.indices) == ("4.2.3", "570.124.06", (0, 1))
    by = {(r.index, r.test): r for r in run.results}
    assert len(run.results) == 8  # 2 GPUs x 4 tests; the CPU entity left out
    fail = by[(1, "memory")]
    assert (fail.status, fail.category, fail.serial) == ("fail", "Hardware", "1652322004398")
    assert [(w.error_id, w.category, w.severity) for w in fail.warnings] == [(62, 10, 2)]
    assert "8 bits differ" in fail.warnings[0].text and fail.info == ("Allocated 76 GB of framebuffer",)
    assert by[(0, "memtest")].status == by[(1, "memtest")].status == "skip"  # Skip and Not Run alike
    assert by[(0, "targeted_stress")].status == "warn" and by[(0, "software")].status == "pass"


def test_a_level_1_run_of_dcgm_3() -> None:
    run = parse_diag((DATA / "level1-3x.json").read_text())
    assert (run.dcgm_version, run.driver, run.indices) == ("3.3.5", "535.104.05", (0, 1))
    persistence = [r for r in run.results if r.test == "Persistence Mode"]
    assert [(r.index, r.status, r.serial) for r in persistence] == [
        (0, "fail", "1564720002211"),
        (1, "fail", "1564720004497"),
    ]
    assert "persistence mode" in persistence[0].warnings[0].text.lower()
    assert {r.test for r in run.results} == {"Persistence Mode", "Environmental Variables"}  # system tests out


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("not json", "invalid JSON"),
        ("[1, 2]", "a list, not an object"),
        ('{"report": []}', "no 'DCGM Diagnostic' object"),
        ('{"DCGM Diagnostic": {"runtime_error": "Unable to connect to the host engine"}}', "did not run"),
        ('{"DCGM Diagnostic": {"test_categories": "x"}}', "no list of test_categories"),
        ('{"DCGM Diagnostic": {"test_categories": [{"tests": [{"name": "m"}]}]}}', "no list of results"),
        (
            '{"DCGM Diagnostic": {"test_categories": [{"category": "H", "tests": [{"name": "m", "results": '
            '[{"entity_group": "GPU", "entity_id": 0, "status": "Maybe"}]}]}]}}',
            "status 'Maybe'",
        ),
        (
            '{"DCGM Diagnostic": {"test_categories": [{"category": "H", "tests": [{"name": "m", "results": '
            '[{"entity_group": "GPU", "entity_id": "zero", "status": "Pass"}]}]}]}}',
            "not an index",
        ),
        ('{"DCGM Diagnostic": {"test_categories": []}}', "no result of any GPU"),
    ],
)
def test_bad_or_foreign_json_is_one_line(text: str, words: str) -> None:
    with pytest.raises(BadInput, match=words) as e:
        parse_diag(text)
    assert "\n" not in str(e.value)


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=5),
        lambda c: (
            st.lists(c)
            | st.dictionaries(
                st.sampled_from(
                    [
                        "DCGM Diagnostic",
                        "test_categories",
                        "tests",
                        "results",
                        "name",
                        "status",
                        "entity_id",
                        "entity_group",
                        "gpu_ids",
                        "warnings",
                        "category",
                    ]
                ),
                c,
            )
        ),
        max_leaves=25,
    )
)
def test_any_json_is_read_or_refused_never_a_crash(doc: object) -> None:
    try:
        run = parse_diag(json.dumps(doc))
    except BadInput as e:
        assert "\n" not in str(e)
        return
    assert run.results and all(r.status in ("pass", "fail", "warn", "skip") for r in run.results)
