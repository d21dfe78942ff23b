"""Regenerate docs/report.png, the picture of ``sdcguard report --html``, from the current code.

A demo fleet through the scanner's recording path (``fleet_scan.sim``): 6 hosts of 8 simulated devices scanned
three times a day for 14 days; ``node-03`` is a lemon (three devices failing at 1e-3, 2e-4 and 4e-5 per execution), one
device on ``node-05`` fails at 2e-2; the fleet policy runs after every round of scans and quarantines what it
should; one device quarantined by hand earlier is released to probation; a training job saves a checkpoint a day
and has one incident that names the lemon's worst device. Then the page is rendered and headless Chromium takes
the screenshot (1280x1600).

    python scripts/report_screenshot.py                 # writes docs/report.png
    python scripts/report_screenshot.py --keep /tmp/demo # also keep the store and the page there
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from fleet_scan.sim import DEFAULT_CASES, scan_sim_device  # noqa: E402
from sdcguard.durations import DAY_S as DAY  # noqa: E402
from sdcguard.fleet.policy import QuarantinePolicy, apply_policy  # noqa: E402
from sdcguard.fleet.report.html import write_html  # noqa: E402
from sdcguard.fleet.store.store import Store  # noqa: E402
from sdcguard.records import DeviceInfo, Incident  # noqa: E402

HOSTS, PER_HOST, DAYS, ROUNDS = 6, 8, 14, 3
FAULTY = {24: 1e-3, 27: 2e-4, 30: 4e-5, 41: 2e-2}
"""Device number -> probability that one execution fails (everyone else: only the rare transient)."""


def build_demo_store(path: Path, now: float) -> None:
    """The demo fleet described in the module docstring, ending at ``now``."""
    rng = np.random.default_rng(13)
    start = now - DAYS * DAY + 600.0  # the whole history inside the page's window
    with Store.open(path) as store:
        devices = [
            DeviceInfo(id=f"sim:{n}", host=f"node-{n // PER_HOST:02d}", kind="sim", model="SimGPU 80GB")
            for n in range(HOSTS * PER_HOST)
        ]
        store.scans.record_devices(devices, now=start)
        store.quarantine.add("sim:9", reason="ECC double-bit errors in dmesg", by="alice@ops", now=start + 0.5 * DAY)
        store.quarantine.release("sim:9", reason="board reseated, ECC clean", by="alice@ops", now=start + 3.2 * DAY)
        for rnd in range(DAYS * ROUNDS):
            t = start + rnd * DAY / ROUNDS
            quarantined = {e.device for e in store.quarantine.entries() if e.state == "quarantined"}
            for n, d in enumerate(devices):
                if d.id in quarantined:
                    continue
                scan_sim_device(
                    store,
                    dev=d.id,
                    host=d.host,
                    p_fault=FAULTY.get(n, 0.0),
                    transient_rate=2e-7,
                    t=t + 40.0 * n,
                    cases=DEFAULT_CASES,
                    past_failures={},
                    budget_s=60.0,
                    retests=3,
                    rng=rng,
                )
            apply_policy(store, QuarantinePolicy(), now=t + 3600.0)
            if rnd % ROUNDS == ROUNDS - 1:  # the training job's daily checkpoint
                step = (rnd + 1) // ROUNDS * 1000
                store.training.record_checkpoint(
                    checkpoint_id=f"llm-7b/step-{step}", step=step, verified=True, job="4242", now=t + 7200.0
                )
        store.training.record_incident(
            Incident(
                kind="replay",
                step=DAYS * 1000 - 380,
                suspect_ranks=(3,),
                device="sim:24",
                devices=("sim:24",),
                hosts=("node-03",),
                job="4242",
                time=now - 0.6 * DAY,
                rollback=f"llm-7b/step-{DAYS * 1000 - 1000}",
                detail="rank 3's local gradients of layers.17.mlp differ from its shadow's replay in 412 elements; "
                "rank 5's second replay agrees with the shadow",
            )
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "report.png")
    ap.add_argument("--keep", type=Path, default=None, help="keep the demo store and the page in this directory")
    args = ap.parse_args()
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("needs headless Chromium: apt-get install chromium")
    with tempfile.TemporaryDirectory() as tmp:
        work = args.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        db, page = work / "demo.db", work / "report.html"
        db.unlink(missing_ok=True)
        now = time.time()
        w = time.perf_counter()
        build_demo_store(db, now)
        built = time.perf_counter() - w
        with Store.open(db, create=False) as store:
            w = time.perf_counter()
            size = write_html(store, page, since=now - DAYS * DAY, window=f"{DAYS}d", now=now)
            rendered = time.perf_counter() - w
        subprocess.run(
            [
                chromium,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--hide-scrollbars",
                f"--user-data-dir={work / 'profile'}",
                f"--screenshot={args.out}",
                "--window-size=1280,1600",
                page.as_uri(),
            ],
            check=True,
            capture_output=True,
            timeout=120,
        )
    print(
        f"demo store built in {built:.1f} s; page {size / 1e3:.0f} kB rendered in {rendered:.2f} s; "
        f"{args.out} {args.out.stat().st_size / 1e3:.0f} kB"
    )


if __name__ == "__main__":
    main()
