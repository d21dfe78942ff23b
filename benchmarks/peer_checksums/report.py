"""The comparison's results as tables: detected / injected per class and per site, false alarms, checks, cost.

:func:`summarize` adds each configuration's counts to the results; :func:`markdown` renders the whole run (also from
an earlier run's ``--json`` file, ``--render``).
"""

from __future__ import annotations

import math
from typing import Any

from benchmarks.peer_checksums.faults import CLASSES, describe_class

__all__ = ["LABELS", "summarize", "markdown"]

LABELS = {
    "ours": "ours: ChecksumMode, every matmul",
    "peer-linear": "peer: SDCGuard(every=1).protect(model), nn.Linear",
    "peer-all": "peer: SDCGuard(every=1), dispatch mode, every matmul",
}


def summarize(res: dict[str, Any]) -> None:
    """Per dtype and config: detected / injected per class and per site (pass, kind)."""
    for d in res["dtypes"].values():
        d["summary"] = {}
        for config, faults in d["faults"].items():
            per: dict[str, Any] = {}
            for cls in CLASSES:
                rows = [f for f in faults if f["cls"] == cls]
                eff = [f for f in rows if f["record"].get("changed")]
                per[cls] = {
                    "injected": len(eff),
                    "detected": sum(1 for f in eff if f["alarms"]),
                    "no_op": len(rows) - len(eff),
                    "not_injected": sum(1 for f in rows if "error" in f["record"]),
                }
            sites: dict[str, list[int]] = {}
            for f in faults:
                r = f["record"]
                if r.get("changed"):
                    s = sites.setdefault(f"{r['pass']} {r['kind']}", [0, 0])
                    s[0] += bool(f["alarms"])
                    s[1] += 1
            d["summary"][config] = {"classes": per, "sites": sites}


def _ratio(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{x:.2f}x"


def markdown(res: dict[str, Any]) -> str:
    """The whole run as markdown: per dtype, the table of classes, clean steps, checks and costs, then by site."""
    lines: list[str] = []
    configs = [c for c in ("ours", "peer-linear", "peer-all") if any(c in d["faults"] for d in res["dtypes"].values())]
    missing = ["not run"] if res.get("peer_error") else []
    for dtype, d in res["dtypes"].items():
        n = res["settings"]["faults"]
        title = f"### {dtype}{' (CPU autocast)' if dtype == 'bf16' else ''}: {n} faults per class, detected / injected"
        lines += [title, ""]
        head = ["class", "fault"] + [LABELS[c] for c in configs] + (["peer"] if missing else [])
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        rows = [_class_row(d, configs, cls, dtype) for cls in (CLASSES if n else ())]
        rows += [_clean_row(d, configs), _checks_row(d, configs), *_cost_rows(d, configs)]
        lines += ["| " + " | ".join(row + missing) + " |" for row in rows]
        lines += _site_lines(d, configs, dtype)
        lines.append("")
        lines += [f"- {note}" for note in d.get("notes", [])]
        lines.append("")
    if missing:
        lines.append(f"The peer did not run: {res['peer_error']}")
    return "\n".join(lines)


def _class_row(d: dict[str, Any], configs: list[str], cls: str, dtype: str) -> list[str]:
    row = [cls, describe_class(cls, dtype)]
    for c in configs:
        s = d["summary"].get(c, {}).get("classes", {}).get(cls)
        if s is None:
            row.append("not run")
            continue
        row.append(f"{s['detected']}/{s['injected']}" + (f" ({s['no_op']} no-op)" if s["no_op"] else ""))
    return row


def _clean_row(d: dict[str, Any], configs: list[str]) -> list[str]:
    row = ["clean steps", "false alarms"]
    for c in configs:
        t = d["clean"].get(c)
        row.append(
            "not run"
            if t is None
            else f"{t['alarm_steps']} in {t['steps']} steps ({t['checked']:,} matmul checks"
            + (
                f"; largest clean z {t['max_z_seen']:.2f}, alarm at {t['alarm_line_z']:g})"
                if t.get("max_z_seen")
                else ")"
            )
        )
    return row


def _checks_row(d: dict[str, Any], configs: list[str]) -> list[str]:
    row = ["matmuls", "checked / run per step"]
    for c in configs:
        cc = d["census_check"].get(c)
        if cc is None:
            row.append("not run")
            continue
        ch = cc["checks"]
        row.append(
            f"{ch.get('checked', 0)} of {len(d['census'])}"
            + (f" ({ch['skipped_dtype']} skipped: dtype)" if ch.get("skipped_dtype") else "")
        )
    return row


def _cost_rows(d: dict[str, Any], configs: list[str]) -> list[list[str]]:
    cost = d.get("cost", {})
    every = ["cost", "checked every step"]
    default = ["cost", "at its default sampling"]
    for c in configs:
        cc = cost.get(c)
        if cc is None:
            every.append("not run")
            default.append("not run")
            continue
        every.append(
            f"{_ratio(cc['ratio'])} ({len(cc['rounds'])} paired rounds: "
            f"{_ratio(cc['round_min'])}-{_ratio(cc['round_max'])}; median step {cc['ms']:.0f} vs "
            f"{cc['plain_ms']:.0f} ms plain)"
        )
        default.append(f"{_ratio(cc['default_ratio'])} ({cc['default_label']})")
    return [every, default]


def _site_lines(d: dict[str, Any], configs: list[str], dtype: str) -> list[str]:
    sites = sorted({s for c in configs for s in d["summary"].get(c, {}).get("sites", {})})
    if not sites:
        return []
    lines = ["", f"By site ({dtype}, all classes together, detected / injected):", ""]
    lines += ["| site | " + " | ".join(LABELS[c] for c in configs) + " |", "|" + "---|" * (len(configs) + 1)]
    for s in sites:
        cells = []
        for c in configs:
            v = d["summary"].get(c, {}).get("sites", {}).get(s)
            cells.append(f"{v[0]}/{v[1]}" if v else "-")
        lines.append(f"| {s} | " + " | ".join(cells) + " |")
    return lines
