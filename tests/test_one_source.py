"""One definition per fact: each fact below is written in one module and derived everywhere else. Each test reads
the code (ast) or the behaviour that would change if a second copy crept back in.

- the scan's settings: :class:`fleet_scan.options.ScanOptions`;
- the exit codes: :mod:`sdcguard.exit_codes`;
- a day and the default window (7 days): :mod:`sdcguard.durations`;
- the e4m3 table: :mod:`sdcguard.fp8`;
- a fingerprint's 64-bit signedness: :mod:`sdcguard.fingerprints.definition`;
- a rank's shard of a tensor (``to_local``): :func:`sdcguard.training.hooks.taps.local`;
- the rank runner of the tests, the GPU check and the benchmarks: :mod:`sdcguard.testing`;
- a job's id (which launcher variables name it, and that torchrun's ``"none"`` is none):
  :func:`sdcguard.training.identity.launcher_job_id`.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

import numpy as np

from tests._code import Module, docstring_nodes, library, modules

ALL = list(modules().values())
"""The library, the scanner, the scripts and the benchmarks."""


def _in(ms: list[Module], *, but: set[str]) -> list[Module]:
    return [m for m in ms if m.rel not in but]


def _constants(m: Module) -> Iterator[tuple[int, object]]:
    """``(line, value)`` of every constant expression in ``m`` outside docstrings, folded where it is arithmetic of
    constants (``7 * 86400.0``, ``1 << 64``, ``(1 << 64) - 1``, ``-(2**63)``), each folded expression once."""
    docs = docstring_nodes(m.tree)
    inside: set[int] = set()
    for node in ast.walk(m.tree):
        if id(node) in inside or id(node) in docs:
            continue
        if isinstance(node, ast.BinOp | ast.UnaryOp | ast.Constant):
            try:
                value = eval(compile(ast.Expression(node), m.rel, "eval"), {})  # constants only: no names
            except Exception:
                continue
            inside.update(id(n) for n in ast.walk(node))
            yield node.lineno, value


# ------------------------------------------------------------------------------------------------ scan settings


def test_the_config_files_scan_keys_are_the_settings_of_scan_options() -> None:
    from fleet_scan.config import SCAN_KEYS
    from fleet_scan.options import ScanOptions, settings

    assert set(SCAN_KEYS) == {*settings(), "actions", "devices", "policy_scope"}
    for key, f in settings().items():
        check, expects = SCAN_KEYS[key]
        assert expects == f.metadata["expects"]
        if f.default is not None:
            assert check(f.default), key  # what the options accept, the file accepts
    assert ScanOptions.from_settings({}, {}, db="x") == ScanOptions(db="x")


def test_the_scan_commands_options_are_the_settings_with_their_defaults() -> None:
    """A setting's option has the setting's name, leaves the default to ScanOptions (click's default is None, or
    the field's own for a flag) and shows the field's default in its help."""
    from fleet_scan.command import scan
    from fleet_scan.options import settings

    params = {p.name: p for p in scan.params}
    for key, f in settings().items():
        option = params[key]
        assert option.default in (None, f.default), key
        if isinstance(f.default, float | int) and not isinstance(f.default, bool):
            assert f"default {f.default:g}" in (getattr(option, "help", "") or ""), key


def test_no_other_module_lists_the_scan_settings() -> None:
    """A table of the settings' keys (a dict, set, list or tuple holding three or more of them) outside
    ``fleet_scan/options.py`` is a second copy of the settings."""
    from fleet_scan.options import settings

    keys = set(settings())
    copies = []
    for m in _in(ALL, but={"fleet_scan/options.py"}):
        for node in ast.walk(m.tree):
            items = node.keys if isinstance(node, ast.Dict) else getattr(node, "elts", None)
            if isinstance(node, ast.Dict | ast.Set | ast.List | ast.Tuple) and items:
                named = {i.value for i in items if isinstance(i, ast.Constant) and i.value in keys}
                if len(named) >= 3:
                    copies.append(f"{m.rel}:{node.lineno} {sorted(named)}")
    assert copies == []


# -------------------------------------------------------------------------------------------------- exit codes


def test_the_exit_codes_are_defined_once_and_never_written_as_numbers() -> None:
    """``EXIT_OK``, ``EXIT_CORRUPTION`` and ``EXIT_CANNOT_RUN`` are assigned in ``sdcguard/exit_codes.py`` only,
    and no command ends with ``exit(1)`` or ``exit(2)`` written as a number."""
    from sdcguard import exit_codes

    names = {n for n in exit_codes.__all__ if n.startswith("EXIT_")}
    assert {getattr(exit_codes, n) for n in names} == {0, 1, 2}
    defined, literal = set(), []
    for m in library():
        for node in ast.walk(m.tree):
            if isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                defined |= {
                    (m.rel, n.id) for t in targets for n in ast.walk(t) if isinstance(n, ast.Name) and n.id in names
                }
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "exit"
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and node.args[0].value in (1, 2)
            ):
                literal.append(f"{m.rel}:{node.lineno}")
    assert defined == {("sdcguard/exit_codes.py", n) for n in names}
    assert literal == []


# ------------------------------------------------------------------------------------- a day, the 7-day window

DAY_EXCEPTIONS = {
    "sdcguard/durations.py": "the definition",
    "sdcguard/fleet/store/schema/tally_tables.py": (
        "the migrations' SQL (versions 8 and 10) is kept as it ran: CAST(started_at / 86400.0 ...)"
    ),
}


def test_a_day_and_the_default_window_are_written_once() -> None:
    """86400 (a day) and 604800 (the 7-day window) appear in no module but the one that defines them (a number in
    SQL text counts too), nor does the library spell the default window ``"7d"`` again; ``7 * DAY_S`` is not
    written again either. (A benchmark may measure a 7-day window of its own.)"""
    found = []
    for m in _in(ALL, but=set(DAY_EXCEPTIONS)):
        in_library = m.name.split(".")[0] in ("sdcguard", "fleet_scan")
        for lineno, value in _constants(m):
            if isinstance(value, str) and ("86400" in value or (in_library and value.strip() == "7d")):
                found.append(f"{m.rel}:{lineno} {value[:40]!r}")
            elif isinstance(value, int | float) and not isinstance(value, bool) and value in (86400, 604800):
                found.append(f"{m.rel}:{lineno} {value}")
        for node in ast.walk(m.tree):
            if (
                isinstance(node, ast.BinOp)
                and isinstance(node.op, ast.Mult)
                and {ast.unparse(node.left), ast.unparse(node.right)} == {"7", "DAY_S"}
            ):
                found.append(f"{m.rel}:{node.lineno} {ast.unparse(node)}")
    assert found == []


def test_the_default_window_is_seven_days_everywhere() -> None:
    from sdcguard.durations import DAY_S, DEFAULT_WINDOW, DEFAULT_WINDOW_S, parse_duration
    from sdcguard.fleet.policy import QuarantinePolicy

    assert DEFAULT_WINDOW_S == parse_duration(DEFAULT_WINDOW) == 7 * DAY_S
    assert QuarantinePolicy().window_s == DEFAULT_WINDOW_S


# --------------------------------------------------------------------------------------------------- e4m3 table


def test_the_e4m3_table_is_built_once() -> None:
    """Only ``sdcguard/fp8.py`` walks the 256 codes of a byte to build a table; the golden suite's float32 table
    and the injector's decoding are that table."""
    from sdcguard.fp8 import e4m3_values
    from sdcguard.golden.bits import e4m3_table
    from sdcguard.inject.formats import get

    builders = []
    for m in _in(library(), but={"sdcguard/fp8.py"}):
        for node in ast.walk(m.tree):
            if (
                isinstance(node, ast.For)
                and isinstance(node.iter, ast.Call)
                and ast.unparse(node.iter.func) == "range"
                and [ast.unparse(a) for a in node.iter.args] == ["256"]
            ):
                builders.append(f"{m.rel}:{node.lineno}")
    assert builders == []
    codes = np.arange(256, dtype=np.uint8)
    assert np.array_equal(get("float8_e4m3fn").decode(codes), e4m3_values(), equal_nan=True)
    assert np.array_equal(e4m3_table(), e4m3_values().astype(np.float32), equal_nan=True)


# ----------------------------------------------------------------------------------------------- signed 64 bits

SIGNED64_EXCEPTIONS = {
    "sdcguard/fingerprints/definition.py": "the definition (signed64, unsigned64, MASK64)",
    "sdcguard/golden/reference.py": "the integer-ALU golden references wrap modulo 2**64: a golden case's arithmetic",
    "fleet_scan/config.py": "the smallest whole number a [policy] key may hold (SQLite's int64 range)",
}


def test_a_fingerprints_sign_is_handled_in_one_place() -> None:
    """``2**63``, ``2**64`` and ``2**64 - 1`` (however written: ``1 << 64``, ``0xFFFF_FFFF_FFFF_FFFF``) appear only
    where a fingerprint's signedness is defined; everything else calls ``signed64`` / ``unsigned64``."""
    found = []
    for m in _in(ALL, but=set(SIGNED64_EXCEPTIONS)):
        for lineno, value in _constants(m):
            if isinstance(value, int) and not isinstance(value, bool) and abs(value) in (2**63, 2**64, 2**64 - 1):
                found.append(f"{m.rel}:{lineno} {value:#x}")
    assert found == []


# ---------------------------------------------------------------------------------------------------- to_local


def test_a_ranks_shard_is_taken_in_one_place() -> None:
    """Everywhere sdcguard reads a rank's shard it goes through ``local_tensor``; the one other ``to_local`` is the
    MoE test model's own forward (``sdcguard/testing/moe.py``), which computes with its expert shard under autograd,
    as a user's expert-parallel model does (``local_tensor`` detaches)."""
    found = []
    for m in _in(library(), but={"sdcguard/fingerprints/tensors.py", "sdcguard/testing/moe.py"}):
        docs = docstring_nodes(m.tree)
        for node in ast.walk(m.tree):
            named = isinstance(node, ast.Constant) and node.value == "to_local" and id(node) not in docs
            if named or (isinstance(node, ast.Attribute) and node.attr == "to_local"):
                found.append(f"{m.rel}:{node.lineno}")
    assert found == []


# ------------------------------------------------------------------------------------------------- rank runner


def test_one_rank_runner_and_nothing_imports_the_tests() -> None:
    """``run_ranks`` is defined once, in the library, for the tests, the GPU check and the benchmarks alike; no
    script or benchmark imports the rank runner from ``tests``."""
    from tests._code import ROOT

    definitions = []
    for path in sorted(
        [
            *ROOT.glob("sdcguard/**/*.py"),
            *ROOT.glob("fleet_scan/**/*.py"),
            *ROOT.glob("scripts/**/*.py"),
            *ROOT.glob("benchmarks/**/*.py"),
            *ROOT.glob("tests/**/*.py"),
        ]
    ):
        tree = ast.parse(path.read_text())
        definitions += [
            f"{path.relative_to(ROOT)}"
            for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef) and node.name == "run_ranks"
        ]
    assert definitions == ["sdcguard/testing/ranks.py"]
    from_tests = []
    for m in ALL:
        for node in ast.walk(m.tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in ("tests", "_dist"):
                from_tests.append(f"{m.rel}:{node.lineno} {node.module}")
            if isinstance(node, ast.Import):
                from_tests += [f"{m.rel}:{node.lineno} {a.name}" for a in node.names if a.name.split(".")[0] == "tests"]
    assert from_tests == []


def test_every_exception_above_is_still_needed() -> None:
    """A listed exception whose file no longer holds the fact goes from its list."""

    def values(rel: str) -> list[object]:
        return [v for _, v in _constants(next(m for m in ALL if m.rel == rel))]

    assert any(isinstance(v, str) and "86400" in v for v in values("sdcguard/fleet/store/schema/tally_tables.py"))
    for rel in SIGNED64_EXCEPTIONS:
        assert any(
            isinstance(v, int) and not isinstance(v, bool) and abs(v) in (2**63, 2**64, 2**64 - 1) for v in values(rel)
        ), rel


# ---------------------------------------------------------------------------------------------------- job id


def test_the_job_id_rule_is_written_once() -> None:
    """The launcher variables that name a job are read in ``sdcguard/training/identity.py`` only; every other
    module that needs the job's id calls its ``launcher_job_id`` (the async checkpointer kept a copy that took
    torchrun's placeholder ``"none"`` for an id)."""
    names = {"TORCHELASTIC_RUN_ID", "SLURM_JOB_ID"}
    readers = sorted({m.rel for m in ALL for _, value in _constants(m) if isinstance(value, str) and value in names})
    assert readers == ["sdcguard/training/identity.py"]
