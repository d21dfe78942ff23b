"""The distribution's name: ours, not PyPI's ``sdcguard`` (another project), in pyproject, the wheel and the docs.

The import package and the command stay ``sdcguard``; what pip installs by name is ``sdcguard-fleet``.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NAME = "sdcguard-fleet"

# `pip install sdcguard`, with options, quotes, extras or a version: PyPI's project. `sdcguard-fleet`,
# `sdcguard_fleet-0.1.0-...whl` and paths such as `/opt/sdcguard` do not match.
_PYPI_INSTALL = re.compile(r"\bpip3?\s+install\b[^\n`]*?(?<![\w./-])['\"]?sdcguard(?![\w.-])")
# An extra spelled on the old name (`sdcguard[gpu]`): it would be installed from PyPI too.
_PYPI_EXTRA = re.compile(r"(?<![\w./-])sdcguard\[")
# The warnings that name the wrong command on purpose.
_WARNING = re.compile(r"[Nn]ot `pip install sdcguard`")


def _installs_pypis_sdcguard(line: str) -> bool:
    line = _WARNING.sub("", line)
    return bool(_PYPI_INSTALL.search(line) or _PYPI_EXTRA.search(line))


def _docs() -> list[Path]:
    """What tells a person how to install: the README, the deploy files, the docs, the setup script."""
    files = [ROOT / "README.md", ROOT / "scripts" / "setup.sh", ROOT / "Makefile"]
    files += [p for p in (ROOT / "deploy").rglob("*") if p.is_file()]
    files += sorted((ROOT / "docs").glob("*.md"))
    return files


def test_pyproject_names_our_distribution_and_keeps_the_import_package() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["name"] == NAME
    assert project["project"]["scripts"]["sdcguard"] == "sdcguard.cli:main"
    assert "sdcguard" in project["tool"]["setuptools"]["packages"]


@pytest.mark.parametrize(
    "text",
    [
        "pip install sdcguard",
        "pip install -U 'sdcguard[gpu]'",
        "python -m pip install sdcguard==0.4.0",
        "pip3 install --user sdcguard",
        "uv pip install sdcguard",
        "then `pip install sdcguard` on each node",
    ],
)
def test_the_check_sees_an_install_of_pypis_name(text: str) -> None:
    assert _installs_pypis_sdcguard(text)


@pytest.mark.parametrize(
    "text",
    [
        "pip install .",
        "pip install '.[gpu]'",
        "pip install sdcguard-fleet",
        "pip install 'dist/sdcguard_fleet-0.1.0-cp311-cp311-linux_x86_64.whl[gpu]'",
        "cd /opt/sdcguard && .venv/bin/pip install '.[gpu]'",
        "(not `pip install sdcguard`: that is another project on PyPI)",
    ],
)
def test_the_check_lets_our_installs_and_the_warnings_pass(text: str) -> None:
    assert not _installs_pypis_sdcguard(text)


def test_no_readme_or_deploy_file_installs_pypis_sdcguard() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for path in _docs()
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if _installs_pypis_sdcguard(line)
    ]
    assert not found, "installs PyPI's sdcguard (another project):\n" + "\n".join(found)


def test_the_readme_says_pypis_sdcguard_is_another_project() -> None:
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert f"The distribution is named `{NAME}`" in readme
    assert "PyPI's `sdcguard` is a different project" in readme


def test_the_built_wheel_carries_the_distribution_name(tmp_path: Path) -> None:
    # Built from a copy of the tracked files, so the checkout gets no build/ or egg-info; without build isolation,
    # so no index is needed (setuptools is in the test extra).
    src = tmp_path / "src"
    tracked = subprocess.run(
        ["git", "ls-files", "-z", "pyproject.toml", "README.md", "sdcguard", "fleet_scan", "kernels", "golden_vectors"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout
    for rel in filter(None, tracked.decode().split("\0")):
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, src / rel)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path / "dist"),
            str(src),
        ],
        check=True,
        capture_output=True,
        timeout=240,
    )
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    assert wheel.name.startswith("sdcguard_fleet-0.1.0-")
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        (meta,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        fields = dict(line.split(": ", 1) for line in z.read(meta).decode().splitlines() if ": " in line)
    assert fields["Name"] == NAME
    assert "sdcguard/__init__.py" in names and "fleet_scan/__init__.py" in names
    assert not any(n.startswith("sdcguard-") for n in names)  # no dist-info under the old name
