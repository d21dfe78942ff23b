"""Golden data: verify passes, any damaged byte is caught and named, generate is deterministic."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from sdcguard.cli import cli
from sdcguard.errors import GoldenDataError
from sdcguard.golden import PORTABLE_CASES, generate, load_suite, verify
from tests._golden import REPO_GOLDEN, copy_golden, flip_byte, golden_files, rewrite_manifest_hashes


def test_repository_golden_data_verifies() -> None:
    result = CliRunner().invoke(cli, ["golden", "verify", "--dir", str(REPO_GOLDEN)])
    assert result.exit_code == 0, result.output
    assert f"{len(PORTABLE_CASES)} cases" in result.output


def test_repository_copy_stays_small() -> None:
    total = sum(p.stat().st_size for p in golden_files(REPO_GOLDEN))
    assert total < 4 * 1024 * 1024, total


def test_flipping_any_byte_of_any_file_fails_naming_it(tmp_path: Path) -> None:
    d = copy_golden(tmp_path)
    files = golden_files(d)
    assert len(files) == len(PORTABLE_CASES) + 1
    for path in files:
        size = path.stat().st_size
        for offset in (0, size // 2, size - 1):
            flip_byte(path, offset)
            with pytest.raises(GoldenDataError) as err:
                verify(d)
            assert path.name in str(err.value), (path, offset, str(err.value))
            with pytest.raises(GoldenDataError, match=path.name.replace(".", r"\.")):
                load_suite(d)
            flip_byte(path, offset)  # restore
    verify(d)


def test_cli_verify_names_the_damaged_file_and_exits_2(tmp_path: Path) -> None:
    d = copy_golden(tmp_path)
    victim = d / "ieee" / "ieee.fp32.div.bin"
    flip_byte(victim, 100, 0x01)
    result = CliRunner().invoke(cli, ["golden", "verify", "--dir", str(d)])
    assert result.exit_code == 2
    assert "ieee.fp32.div.bin" in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize("rel", ["gemm/gemm.fp32.int.cublas.bin", "memory/memory.u32.random.rows.bin"])
def test_recomputed_reference_catches_data_with_consistent_hashes(tmp_path: Path, rel: str) -> None:
    d = copy_golden(tmp_path)
    flip_byte(d / rel, 4096 + 3, 0x10)
    rewrite_manifest_hashes(d)
    load_suite(d)  # the hashes agree again: only recomputing the reference can tell
    with pytest.raises(GoldenDataError, match=Path(rel).name.replace(".", r"\.")):
        verify(d)


def test_stray_and_missing_files_are_named(tmp_path: Path) -> None:
    d = copy_golden(tmp_path)
    (d / "alu" / "extra.bin").write_bytes(b"x")
    with pytest.raises(GoldenDataError, match="extra.bin"):
        verify(d)
    (d / "alu" / "extra.bin").unlink()
    (d / "shared" / "shared.u64.bins.bin").unlink()
    with pytest.raises(GoldenDataError, match="shared.u64.bins.bin"):
        verify(d)
    with pytest.raises(GoldenDataError, match="manifest.json"):
        load_suite(tmp_path / "nowhere")


def test_generate_is_deterministic_and_matches_the_repository(tmp_path: Path) -> None:
    out = tmp_path / "regen"
    generate(out)
    mine = {p.relative_to(out).as_posix(): p.read_bytes() for p in golden_files(out)}
    repo = {p.relative_to(REPO_GOLDEN).as_posix(): p.read_bytes() for p in golden_files(REPO_GOLDEN)}
    assert mine.keys() == repo.keys()
    for rel in mine:
        assert mine[rel] == repo[rel], f"{rel} differs after regenerating"


@pytest.fixture(scope="module")
def golden_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_golden(tmp_path_factory.mktemp("flips"))


@settings(max_examples=40)
@given(data=st.data())
def test_any_flipped_byte_is_named_property(golden_copy: Path, data: st.DataObject) -> None:
    path = data.draw(st.sampled_from(golden_files(golden_copy)))
    offset = data.draw(st.integers(0, path.stat().st_size - 1))
    mask = data.draw(st.integers(1, 255))
    flip_byte(path, offset, mask)
    try:
        with pytest.raises(GoldenDataError) as err:
            load_suite(golden_copy)
        assert path.name in str(err.value)
    finally:
        flip_byte(path, offset, mask)
