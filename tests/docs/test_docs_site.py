"""The documentation site builds with no warning (``mkdocs build --strict``, what ``make docs`` runs: a broken link or
anchor, a missing page or snippet, an API entry that no longer resolves fails it), and its pages open in headless
Chromium with their content."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = next((p for p in (shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome")) if p), None)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("mkdocs", reason="the docs extra is not installed (make setup installs it)")
    out = tmp_path_factory.mktemp("site")
    p = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        timeout=300,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert "WARNING" not in p.stdout + p.stderr, p.stdout + p.stderr
    return out


@pytest.mark.slow
def test_the_site_builds_strict_with_every_page_and_the_api(site: Path) -> None:
    for page in (ROOT / "docs").glob("*.md"):
        name = "index.html" if page.stem == "index" else f"{page.stem}/index.html"
        assert (site / name).is_file(), name
    api = (site / "api" / "index.html").read_text()
    assert all(name in api for name in ("SDCGuard", "StepReport", "QuarantinePolicy", "OpFaultMode", "DrillLog"))


@pytest.mark.slow
def test_the_api_reference_renders_every_public_name_and_no_raw_role(site: Path) -> None:
    """Every name of ``sdcguard.__all__`` has its entry (an anchor at its defining module's path), and no reST role
    of a docstring (``:meth:`step```) reaches any page as text: scripts/griffe_rst_roles.py turns them into links."""
    import re

    import sdcguard

    api = (site / "api" / "index.html").read_text()
    anchors = set(re.findall(r'id="(sdcguard\.[\w.]+)"', api))
    missing = []
    for name in sdcguard.__all__:
        if name == "__version__":
            assert "sdcguard.__version__" in api
            continue
        obj = getattr(sdcguard, name)
        if f"{obj.__module__}.{obj.__qualname__}" not in anchors:
            missing.append(f"{name} ({obj.__module__}.{obj.__qualname__})")
    assert missing == [], f"public names missing from docs/api.md: {missing}"
    role = re.compile(r":(?:class|meth|func|mod|data|attr|exc|obj):`")
    for page in site.rglob("*.html"):
        text = re.sub(r"<[^>]+>", "", page.read_text())
        assert not role.search(text), f"{page.relative_to(site)}: {role.search(text)[0]!r}"  # type: ignore[index]
    assert 'class="autorefs autorefs-internal"' in api  # the roles that name a rendered object link to it


@pytest.mark.slow
@pytest.mark.browser
@pytest.mark.skipif(CHROMIUM is None, reason="browser test: no chromium on PATH (apt-get install chromium)")
@pytest.mark.parametrize(
    ("page", "heading", "text"),
    [
        ("index.html", "sdcguard", "Where to start"),
        ("guard/index.html", "The training guard", "The rule of evidence"),
        ("getting-started/index.html", "Getting started", "A guarded training loop"),
    ],
)
def test_a_page_opens_in_headless_chromium(site: Path, page: str, heading: str, text: str, tmp_path: Path) -> None:
    assert CHROMIUM is not None
    p = subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-background-networking",
            "--host-resolver-rules=MAP * ~NOTFOUND",
            f"--user-data-dir={tmp_path / 'profile'}",
            "--dump-dom",
            (site / page).as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    dom = p.stdout
    assert f">{heading}<" in dom and text in dom
    assert "The training guard" in dom and "Python API" in dom  # the navigation, on every page
