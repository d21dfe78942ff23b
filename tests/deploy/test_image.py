"""The container image's Dockerfile, linted (no image registry is reachable where CI runs, so the image itself is
built elsewhere: docs/scanner.md, "The image"): the wheel is built once and installed by both targets, the scan node
has no torch, each target ends as an unprivileged user, the build context holds what the wheel needs and nothing
else, and the Kubernetes manifests name the image by the version in pyproject.toml."""

from __future__ import annotations

import fnmatch
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = (ROOT / "Dockerfile").read_text()
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
VERSION = PYPROJECT["project"]["version"]


def _instructions() -> list[tuple[str, str]]:
    """(instruction, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(
        r"\\\n", " ", "\n".join(line for line in DOCKERFILE.splitlines() if not line.lstrip().startswith("#"))
    )
    return [(m[1].upper(), m[2].strip()) for m in re.finditer(r"^\s*([A-Za-z]+)\s+(.*)$", text, re.M)]


def _stages() -> dict[str, list[tuple[str, str]]]:
    stages: dict[str, list[tuple[str, str]]] = {}
    current = None
    for op, args in _instructions():
        if op == "FROM":
            base, _, name = args.partition(" AS ")
            current = name.strip()
            stages[current] = [("FROM", base.strip())]
        elif current is not None:
            stages[current].append((op, args))
    return stages


def test_the_stages_build_the_wheel_once_and_the_scan_node_has_no_torch() -> None:
    stages = _stages()
    assert list(stages) == ["wheel", "scan", "train"]
    assert stages["wheel"][0] == ("FROM", "${CUDA_BASE}") and stages["scan"][0] == ("FROM", "${CUDA_BASE}")
    assert stages["train"][0] == ("FROM", "scan")  # the training image is the scan node plus torch
    runs = {name: " ".join(a for op, a in body if op == "RUN") for name, body in stages.items()}
    assert DOCKERFILE.count("pip wheel") == 1 and "pip wheel" in runs["wheel"]
    assert ("COPY", "--from=wheel /wheels /wheels") in stages["scan"]
    assert "torch" not in runs["scan"] and '"torch>=2.3,<3"' in runs["train"]
    extras = re.search(r"sdcguard_fleet-\*\.whl\)\[([a-z,]+)\]", runs["scan"])
    assert extras is not None and set(extras[1].split(",")) <= set(PYPROJECT["project"]["optional-dependencies"])
    assert {"gpu", "postgres"} <= set(extras[1].split(","))


def test_each_target_ends_as_an_unprivileged_user_and_apt_stays_lean() -> None:
    for name in ("scan", "train"):
        users = [a for op, a in _stages()[name] if op == "USER"]
        assert users and users[-1] == "10001", (name, users)
    for _, args in _instructions():
        if "apt-get install" in args:
            assert "--no-install-recommends" in args and "rm -rf /var/lib/apt/lists/*" in args, args
    assert ":latest" not in DOCKERFILE


def _ignored(path: str) -> bool:
    """Whether the build context leaves ``path`` out (.dockerignore: the last matching rule wins)."""
    rules = [r.strip() for r in (ROOT / ".dockerignore").read_text().splitlines() if r.strip() and r[0] != "#"]
    out = False
    for rule in rules:
        negate, pattern = rule.startswith("!"), rule.lstrip("!").rstrip("/")
        if fnmatch.fnmatch(path, pattern) or path.startswith(pattern + "/") or fnmatch.fnmatch(path, pattern + "/*"):
            out = not negate
    return out


def test_the_build_context_holds_what_the_wheel_is_built_from() -> None:
    sources = [src for op, a in _stages()["wheel"] if op == "COPY" for src in a.split()[:-1]]
    assert sorted(sources) == sorted(
        ["pyproject.toml", "README.md", "sdcguard", "fleet_scan", "kernels", "golden_vectors"]
    )
    for src in sources:
        assert (ROOT / src).exists() and not _ignored(src), src
    # every package the wheel declares comes from a copied folder
    dirs = PYPROJECT["tool"]["setuptools"]["package-dir"]
    for package in PYPROJECT["tool"]["setuptools"]["packages"]:
        top = dirs.get(package, package.replace(".", "/")).split("/")[0]
        assert top in sources, package
    assert _ignored(".venv/bin/python") and _ignored("tests/conftest.py") and not _ignored("sdcguard/cli/report.py")
    assert _ignored("sdcguard/__pycache__/x.pyc") and _ignored("sdcguard/_fpcore.cpython-311-x86_64-linux-gnu.so")


def test_the_manifests_name_the_image_by_the_version() -> None:
    images = []
    for manifest in sorted((ROOT / "deploy" / "kubernetes").glob("*.yaml")):
        images += re.findall(r"^\s*image:\s*(\S+)", manifest.read_text(), re.M)
    ours = [i for i in images if "sdcguard" in i]
    assert ours and set(ours) == {f"sdcguard-fleet:{VERSION}"}, images
    assert f"-t sdcguard-fleet:{VERSION}" in DOCKERFILE
