"""The config file of `scan` and `policy`: every wrong value is one line naming the file, the key and what is
expected, exit 2; never an internal error."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleet_scan.config import SCAN_KEYS, read_config
from sdcguard.cli import cli
from sdcguard.errors import BadInput


def _toml(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, float):
        return {math.inf: "inf", -math.inf: "-inf"}.get(value, "nan" if value != value else repr(value))
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return repr(value)


BAD_SCAN = [
    ("budget", "abc"),
    ("budget", 0),
    ("budget", -5),
    ("budget", math.inf),
    ("budget", True),
    ("budget", [60]),
    ("retests", 1.5),
    ("retests", -1),
    ("retests", "3"),
    ("only_idle", "yes"),
    ("only_idle", 1),
    ("actions", "slurm-drain"),
    ("actions", [1]),
    ("lock_dir", 5),
    ("idle_window", -1),
    ("gpu_util_max", 101),
    ("cpu_busy_max", "50%"),
    ("devices", "cuda:0"),
    ("policy_scope", "cluster"),
    ("golden_dir", ""),
]


@pytest.mark.parametrize(("key", "value"), BAD_SCAN)
def test_a_bad_scan_value_is_one_line_naming_file_key_and_expectation(tmp_path: Path, key: str, value: object) -> None:
    config = tmp_path / "sdcguard.toml"
    config.write_text(f"[scan]\n{key} = {_toml(value)}\n")
    result = CliRunner().invoke(cli, ["--db", str(tmp_path / "x.db"), "scan", "--config", str(config)])
    assert result.exit_code == 2, result.output
    line = result.output.strip()
    assert line.count("\n") == 0 and "internal error" not in line, line
    assert str(config) in line and f"[scan] {key} = " in line and "expected" in line, line
    assert not (tmp_path / "x.db").exists()  # refused before anything was touched


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ('[policy]\nrate_threshold = "abc"\n', "[policy] rate_threshold = 'abc': expected a number"),
        ("[policy]\nconfidence = 2\n", "confidence must be in (0, 1)"),
        ('[policy]\nquarantine_on_sticky = "no"\n', "expected true or false"),
        ("[policy]\nprobation_clean_scans = 2.5\n", "expected a whole number"),
        ('[policy]\nwindow_s = "7 days"\n', "[policy] window_s = '7 days': expected a duration"),
        ("[policy]\nrate_treshold = 1e-4\n", "rate_treshold"),
        ("scan = 3\n", "must be a [scan] section"),
    ],
)
def test_a_bad_policy_value_is_one_line_for_scan_and_policy(tmp_path: Path, text: str, words: str) -> None:
    config = tmp_path / "sdcguard.toml"
    config.write_text(text)
    for command in (["scan"], ["policy"]):
        result = CliRunner().invoke(cli, ["--db", str(tmp_path / "x.db"), *command, "--config", str(config)])
        assert result.exit_code == 2, result.output
        assert words in result.output and str(config) in result.output, result.output
        assert result.output.strip().count("\n") == 0, result.output


_text = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=8)
_values = st.one_of(
    _text,
    st.booleans(),
    st.integers(-(10**6), 10**6),
    st.floats(allow_nan=True, allow_infinity=True),
    st.lists(st.integers(-3, 3), max_size=3),
    st.lists(_text, max_size=3),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.sampled_from(sorted(SCAN_KEYS)), value=_values)
def test_any_scan_value_is_accepted_or_refused_with_its_key(tmp_path: Path, key: str, value: object) -> None:
    config = tmp_path / "c.toml"
    config.write_text(f"[scan]\n{key} = {_toml(value)}\n")
    try:
        data = read_config(config)
    except BadInput as e:
        assert f"[scan] {key} = " in str(e) and "expected" in str(e)
        return
    check, _ = SCAN_KEYS[key]
    assert check(data["scan"][key])


def test_durations_take_units_in_the_config_and_on_the_command_line(tmp_path: Path) -> None:
    """A duration is seconds (a number) or a number and a unit, wherever one is taken."""
    from fleet_scan.config import load_policy
    from fleet_scan.options import ScanOptions

    config = tmp_path / "sdcguard.toml"
    config.write_text('[scan]\nbudget = "2m"\nidle_window = "1.5s"\n[policy]\nwindow_s = "3d"\nreap_grace_s = 60\n')
    data = read_config(config)
    options = ScanOptions.from_settings({}, data["scan"], db="x.db")
    assert (options.budget_s, options.idle_window_s) == (120.0, 1.5)
    policy = load_policy(data)
    assert (policy.window_s, policy.reap_grace_s) == (3 * 86400.0, 60.0)
    assert ScanOptions.from_settings({"budget": 90.0}, data["scan"], db="x.db").budget_s == 90.0
    for bad, words in (("abc", "is not a duration"), ("0", "must be > 0"), ("-5s", "is not a duration")):
        result = CliRunner().invoke(cli, ["--db", str(tmp_path / "x.db"), "scan", "--all", "--budget", bad])
        assert result.exit_code == 2 and words in result.output, result.output
        assert result.output.strip().count("\n") == 0 and "--budget" in result.output, result.output
    assert not (tmp_path / "x.db").exists()
