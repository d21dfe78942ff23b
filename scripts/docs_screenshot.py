"""Build the documentation site and take the screenshots committed under docs/screenshots/ (headless Chromium).

    python scripts/docs_screenshot.py            # writes docs/screenshots/home.png and docs/screenshots/guard.png

The site is built with ``mkdocs build --strict`` into a temporary directory (what ``make docs`` does), then each
page is opened from disk at 1280x1600, as a reader's browser would show it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = {"home.png": "index.html", "guard.png": "guard/index.html"}
"""Screenshot file -> the built page it shows."""
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--host-resolver-rules=MAP * ~NOTFOUND",
    "--window-size=1280,1600",
)


def build_site(site: Path) -> None:
    """``mkdocs build --strict`` of this checkout into ``site``; raises with mkdocs' output when it fails."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    p = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    if p.returncode != 0:
        raise SystemExit(f"mkdocs build --strict failed:\n{p.stdout}{p.stderr}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "screenshots")
    args = ap.parse_args()
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("needs headless Chromium: apt-get install chromium")
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        site = Path(tmp) / "site"
        build_site(site)
        for name, page in PAGES.items():
            target = args.out / name
            subprocess.run(
                [
                    chromium,
                    *FLAGS,
                    f"--user-data-dir={Path(tmp) / 'profile'}",
                    f"--screenshot={target}",
                    (site / page).as_uri(),
                ],
                check=True,
                capture_output=True,
                timeout=120,
            )
            print(f"{target.relative_to(ROOT)} ({target.stat().st_size / 1e3:.0f} kB) from {page}")


if __name__ == "__main__":
    main()
