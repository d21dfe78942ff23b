"""deploy/prometheus and deploy/grafana: the alert rules pass ``promtool check rules`` and their unit tests
(``promtool test rules``), every query of the rules and of the Grafana dashboard names only metrics sdcguard's
textfiles emit and parses as PromQL, and the spool textfile says what a spool holds that its server has not had."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from sdcguard.fleet.report.prometheus import METRICS, SPOOL_METRICS, render_spools
from sdcguard.fleet.store.store import Store
from tests._fleet import NOW, result, scan

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "sdcguard-alerts.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "sdcguard-dashboard.json"
EMITTED = set(METRICS) | set(SPOOL_METRICS)


def _promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("promtool is missing (CI must run it: .ci/run installs Debian's prometheus)", pytrace=False)
        pytest.skip("promtool is not installed here (Debian's prometheus package has it; CI installs it)")
    return found


def _exprs() -> list[tuple[str, str]]:
    """(where, query) of every alert rule and every dashboard query, Grafana's variables given values."""
    rules = [(r["alert"], r["expr"]) for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]
    dash = json.loads(DASHBOARD.read_text())
    queries = [(f"panel {p['title']!r}", t["expr"]) for p in dash["panels"] for t in p["targets"]]
    queries += [(f"variable {v['name']}", v["definition"]) for v in dash["templating"]["list"] if "definition" in v]
    return rules + [(w, q.replace("$host", ".*")) for w, q in queries]


def test_the_rules_pass_promtools_check_and_their_unit_tests() -> None:
    promtool = _promtool()
    for args in (["check", "rules", RULES.name], ["test", "rules", "sdcguard-alerts.test.yml"]):
        p = subprocess.run([promtool, *args], cwd=RULES.parent, capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stdout + p.stderr


def test_every_query_names_only_emitted_metrics_and_parses(tmp_path: Path) -> None:
    queries = _exprs()
    named = [(w, set(re.findall(r"\bsdcguard_[a-z_]+", q))) for w, q in queries]
    assert all(n for _, n in named) and [(w, n - EMITTED) for w, n in named if n - EMITTED] == []
    used = set().union(*(n for _, n in named))
    assert EMITTED - used == set(), "every emitted metric is on the dashboard or in a rule"
    # every panel query parses as PromQL: promtool checks them as recording rules
    recorded = [{"record": f"check:q{i}", "expr": q} for i, (_, q) in enumerate(queries) if "label_values" not in q]
    (tmp_path / "q.yml").write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": recorded}]}))
    p = subprocess.run([_promtool(), "check", "rules", "q.yml"], cwd=tmp_path, capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr


def test_the_spool_textfile_counts_what_waits_since_the_last_forward(tmp_path: Path) -> None:
    spool = tmp_path / "spool.db"
    with Store.open(spool) as s:
        scan(s, "sim:1", [result("sim:1", t=NOW - 200)], t=NOW - 200)  # finished at NOW - 140
        s.maintenance.mark_forwarded(NOW - 50, s.maintenance.high_water())
        assert s.maintenance.backlog.scans == 0 and s.maintenance.backlog.oldest is None
        scan(s, "sim:1", [result("sim:1", t=NOW - 10)], t=NOW - 10)
    samples = {
        f.name: f.samples[0] for f in text_string_to_metric_families(render_spools([spool], host="n1")) if f.samples
    }
    assert samples["sdcguard_spool_pending_scans"].value == 1
    assert samples["sdcguard_spool_oldest_pending_timestamp_seconds"].value == NOW - 10
    assert samples["sdcguard_spool_last_forward_timestamp_seconds"].value == NOW - 50
    assert samples["sdcguard_spool_pending_scans"].labels == {"Hostname": "n1", "spool": str(spool)}
