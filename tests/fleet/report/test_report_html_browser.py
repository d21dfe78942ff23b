"""The HTML report in a real browser: headless Chromium renders it (not blank, status colours on screen), its
script raises nothing and logs nothing, and clicking a header sorts the device table.

Two runs of the browser, about a second each: ``--screenshot`` of the page as written, with console messages on
stderr (the page logs nothing, so any ``CONSOLE`` line is a finding: an uncaught error shows up there too); and
``--dump-dom`` of a copy with a small harness around the page's own script that records errors and clicks
headers, then writes what it saw into the DOM. Skipped, with the reason, where Chromium is not installed (CI
installs Debian's ``chromium``: .ci/run).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from sdcguard.fleet.report.html import build_html
from sdcguard.fleet.store.store import Store
from tests._fleet import NOW
from tests._html import HOSTILE, fill_store

CHROMIUM = next((p for p in (shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome")) if p), None)

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(CHROMIUM is None, reason="browser test: no chromium on PATH (apt-get install chromium)"),
]

_FLAGS = (
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
    "--enable-logging=stderr",
    "--v=0",
)

_HARNESS_HEAD = (
    "<script>window.__errors = []; window.addEventListener('error', function (e) "
    "{ window.__errors.push(String(e.message)); });</script>"
)
_HARNESS_TAIL = """<script>
(function () {
  var out = {};
  var table = document.querySelectorAll("table.sortable")[1];  // hosts, then devices
  function column(i) { return Array.prototype.map.call(table.tBodies[0].rows, function (r) {
    return r.cells[i].textContent; }); }
  var heads = Array.prototype.map.call(table.tHead.rows[0].cells, function (th) { return th.textContent; });
  var failures = heads.indexOf("failures"), device = heads.indexOf("device");
  out.before = column(device);
  table.tHead.rows[0].cells[failures].click();
  out.failures_up = column(failures);
  out.sort_state = table.tHead.rows[0].cells[failures].getAttribute("aria-sort");
  table.tHead.rows[0].cells[failures].click();
  out.failures_down = column(failures);
  table.tHead.rows[0].cells[device].click();
  out.devices_up = column(device);
  out.errors = window.__errors;

  var pre = document.createElement("pre");
  pre.id = "harness";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
})();
</script>"""


_OUTSIDE = """<script>
(function () {
  var out = {outside: [], texts: 0};  // labels the browser lays out past their chart's edges (cut off on screen)
  document.querySelectorAll("svg").forEach(function (svg) {
    var vb = svg.viewBox.baseVal;
    svg.querySelectorAll("text").forEach(function (t) {
      var b = t.getBBox();
      out.texts += 1;
      if (b.x < vb.x - 0.5 || b.x + b.width > vb.x + vb.width + 0.5) {
        out.outside.push(t.textContent + " at " + b.x.toFixed(1) + ".." + (b.x + b.width).toFixed(1) + " of "
          + vb.width);
      }
    });
  });
  var pre = document.createElement("pre");
  pre.id = "harness";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
})();
</script>"""


def _chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    return subprocess.run(
        [CHROMIUM, *_FLAGS, f"--user-data-dir={tmp_path / 'profile'}", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.fixture()
def page(tmp_path: Path) -> Path:
    with Store.open(tmp_path / "fleet.db") as store:
        fill_store(store, hostile=HOSTILE)
        text = build_html(store, since=None, window="all", now=NOW)
    path = tmp_path / "report.html"
    path.write_text(text, encoding="utf-8")
    return path


def _png_pixels(path: Path) -> np.ndarray:
    image = pytest.importorskip("matplotlib.image", reason="decoding the screenshot needs matplotlib (test extras)")
    return np.asarray(image.imread(str(path)))[..., :3]


def test_the_page_renders_without_console_errors(page: Path, tmp_path: Path) -> None:
    shot = tmp_path / "shot.png"
    run = _chromium(tmp_path, f"--screenshot={shot}", "--window-size=1280,1600", page.as_uri())
    assert shot.exists(), run.stderr[-2000:]
    console = [line for line in run.stderr.splitlines() if ":CONSOLE" in line]
    assert console == []
    pixels = _png_pixels(shot)
    assert pixels.shape[:2] == (1600, 1280)
    rgb = (pixels * 255).round().astype(np.uint32).reshape(-1, 3)
    colours = np.unique(rgb[:, 0] << 16 | rgb[:, 1] << 8 | rgb[:, 2])
    assert len(colours) > 100  # text, charts, cards: far from a blank page
    red = np.all(np.abs(pixels - np.array([0xC6, 0x28, 0x28]) / 255) < 0.02, axis=-1).sum()
    green = np.all(np.abs(pixels - np.array([0x2E, 0x7D, 0x32]) / 255) < 0.02, axis=-1).sum()
    assert red > 2000 and green > 2000  # the quarantined and healthy cards were styled and drawn


def test_clicking_a_header_sorts_the_device_table(page: Path, tmp_path: Path) -> None:
    text = page.read_text(encoding="utf-8")
    harnessed = tmp_path / "harnessed.html"
    harnessed.write_text(
        text.replace("<head>", "<head>" + _HARNESS_HEAD, 1).replace("</body>", _HARNESS_TAIL + "</body>", 1),
        encoding="utf-8",
    )
    run = _chromium(tmp_path, "--dump-dom", harnessed.as_uri())
    found = re.search(r'<pre id="harness">(.*?)</pre>', run.stdout, re.S)
    assert found is not None, run.stderr[-2000:]
    out = json.loads(
        found.group(1).replace("&quot;", '"').replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")
    )
    assert out["errors"] == []
    assert out["before"][:2] == ["sim:2", "sim:1"]  # the report's order: quarantined first
    as_numbers = [int(x.replace(",", "")) for x in out["failures_up"]]
    assert as_numbers == sorted(as_numbers) and as_numbers[-1] == 3
    assert out["sort_state"] == "ascending"
    assert [int(x) for x in out["failures_down"]] == sorted(as_numbers, reverse=True)
    assert out["devices_up"] == [f"sim:{i}" for i in range(1, 6)]


def test_a_time_label_at_a_charts_edge_stays_inside_it(tmp_path: Path) -> None:
    """Bins whose last edge carries a tick (8 days of 1 d: ticks at both ends, dates the longest labels): laid out
    by the browser with the page's own style, no label of the rate chart or the timeline crosses its chart."""
    from sdcguard.fleet.report.html_assets import PAGE_CSS
    from sdcguard.fleet.report.svg import BinRate, Bins, Segment, TimelineRow, rate_chart, timeline

    day = 86400.0
    bins = Bins(origin=20_000 * day, width=day, count=8, end=20_008 * day)
    rates = [BinRate(bin=b, executions=100, failures=b % 2, rate=(b % 2) / 100, low=0.0, high=0.05) for b in range(8)]
    row = TimelineRow(
        device="sim:1",
        host="h",
        segments=(Segment(state="quarantined", start=bins.origin + day, end=None, reason="x"),),
    )
    page = tmp_path / "charts.html"
    page.write_text(
        f"<!doctype html><html><head><style>{PAGE_CSS}</style>{_HARNESS_HEAD}</head><body>"
        + rate_chart(rates, bins, label="rate")
        + timeline([row], bins)
        + _OUTSIDE
        + "</body></html>",
        encoding="utf-8",
    )
    run = _chromium(tmp_path, "--dump-dom", page.as_uri())
    found = re.search(r'<pre id="harness">(.*?)</pre>', run.stdout, re.S)
    assert found is not None, run.stderr[-2000:]
    out = json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&"))
    assert out["texts"] > 10 and out["outside"] == []
