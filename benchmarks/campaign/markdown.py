"""The campaign's results as the markdown tables of ``docs/detection.md`` (pasted there unchanged)."""

from __future__ import annotations

from typing import Any

from .faults import BIT_CLASSES, TARGET_LABELS, TARGETS, TIMINGS
from .report import SETTINGS, WITHIN, pct, steps_text

CHECK_LABELS = {
    "sdc.replay": "sdcguard replay (sampled step)",
    "sdc.checksum": "sdcguard matmul checksums (checked step)",
    "sdc.every": "sdcguard gradient check (every step)",
    "sdc.weights": "sdcguard weight check",
    "meg.step": "Megatron loss/grad checks",
    "meg.hash": "Megatron weight hash",
    "same.step": "same-device replay",
}
GROUP_ORDER = ("compute", "after the reduction", "weights in memory")


def _cost(costs: dict[str, Any] | None, key: str) -> str:
    if not costs:
        return "see `benchmarks/detector_costs.py`"
    return costs.get("text", {}).get(key, "–")


def _max(s: dict[str, Any], timing: str) -> str:
    if timing == "intermittent" and s.get("p99") is not None:
        return f"{steps_text(s['p99'])} (p99)"
    return steps_text(s.get("max"))


def choose(a: dict[str, Any], costs: dict[str, Any] | None) -> list[str]:
    fa = a["false_alarms"]
    L = [
        "| detector, setting | workers pay | vetoes the faulty step | false alarms | one-off: within 1 / 1,000 steps "
        "| intermittent: within 10 / 1,000 | sticky: within 10 / 1,000 | named the faulty rank |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s in SETTINGS:
        d = a["derived"].get(s.key)
        if d is None:
            continue
        if s.kind == "shadow":
            alarms = f"{fa.get('continuous', 0)} in {fa.get('continuous_steps', 0):,} steps"
        else:
            n = {"peer": fa["sdcguard"], "megatron": fa["megatron"] + fa["megatron_hash"], "same": fa["same_device"]}[
                s.kind
            ]
            alarms = f"{n} in {fa['steps']:,} steps"
        cells = [
            f"{pct(d[t].get(f'within_{lo}'))} / {pct(d[t].get('within_1000'))}"
            for t, lo in (("one-off", 1), ("intermittent", 10), ("sticky", 10))
        ]
        L.append(
            f"| {s.label} | {_cost(costs, s.key)} | {s.vetoes} | {alarms} | "
            + " | ".join(cells)
            + f" | {pct(d['all'].get('attributed'))} |"
        )
    return L


def per_timing(a: dict[str, Any], timing: str) -> list[str]:
    L = [
        "| detector, setting | faults | "
        + " | ".join(f"within {n:,}" for n in WITHIN)
        + " | median steps | max steps | named the faulty rank |",
        "|---|---:|" + "---:|" * len(WITHIN) + "---:|---:|---:|",
    ]
    for s in SETTINGS:
        d = a["derived"].get(s.key)
        if d is None or not d[timing].get("faults"):
            continue
        x = d[timing]
        L.append(
            f"| {s.label} | {x['faults']} | "
            + " | ".join(pct(x.get(f"within_{n}")) for n in WITHIN)
            + f" | {steps_text(x['median'])} | {_max(x, timing)} | {pct(x['attributed'])} |"
        )
    return L


def by_group(a: dict[str, Any]) -> list[str]:
    head = " | ".join(f"{t}: {g}" for t in TIMINGS for g in GROUP_ORDER)
    L = [f"| detector, setting | {head} |", "|---|" + "---|" * (len(TIMINGS) * len(GROUP_ORDER))]
    for s in SETTINGS:
        d = a["derived"].get(s.key)
        if d is None:
            continue
        cells = []
        for t in TIMINGS:
            for g in GROUP_ORDER:
                x = d.get(f"{t}|{g}", {})
                cells.append("–" if not x.get("faults") else f"{pct(x['within_1'])} / {pct(x['within_1000'])}")
        L.append(f"| {s.label} | " + " | ".join(cells) + " |")
    return L


def _pair(s: dict[str, Any], c: str) -> str:
    n = s["faults"]
    det, attr = s[c]
    return "–" if not n else f"{pct(det / n)} / {pct(attr / n)}"


def measured_step(a: dict[str, Any]) -> list[str]:
    checks = list(CHECK_LABELS)
    L = [
        "| target | timing | faults | " + " | ".join(CHECK_LABELS[c] for c in checks) + " |",
        "|---|---|---:|" + "---|" * len(checks),
    ]
    ps = a["per_step"]
    for key, label in (("all", "all"), *((t, f"all, {t}") for t in TIMINGS)):
        L.append(f"| **{label}** | | {ps[key]['faults']} | " + " | ".join(_pair(ps[key], c) for c in checks) + " |")
    for target in TARGETS:
        for t in TIMINGS:
            s = ps[f"{t}|{target}"]
            if s["faults"]:
                L.append(
                    f"| {TARGET_LABELS[target]} | {t} | {s['faults']} | "
                    + " | ".join(_pair(s, c) for c in checks)
                    + " |"
                )
    for key in ("masked", "masked, loss changed"):
        s = ps[key]
        if s["faults"]:
            L.append(f"| *{key}* | | {s['faults']} | " + " | ".join(_pair(s, c) for c in checks) + " |")
    return L


def matmul_bits(a: dict[str, Any]) -> list[str]:
    """Matmul faults (forward and backward, every timing) by bit class: the checksums beside replay."""
    checks = ("sdc.checksum", "sdc.replay")
    L = ["| bit class | faults | " + " | ".join(CHECK_LABELS[c] for c in checks) + " |", "|---|---:|---|---|"]
    for bits in BIT_CLASSES:
        s = a["per_step"].get(f"bits|matmul|{bits}")
        if s and s["faults"]:
            L.append(f"| {bits} | {s['faults']} | " + " | ".join(_pair(s, c) for c in checks) + " |")
    return L


def validation(a: dict[str, Any]) -> list[str]:
    v = a["validation"]
    cps = v["checkpoints"]
    L = [
        "| detector | faults | "
        + " | ".join(f"within {n}: measured / derived" for n in cps)
        + " | named: measured / derived |",
        "|---|---:|" + "---|" * (len(cps) + 1),
    ]
    for d, label in (("sdcguard", "sdcguard"), ("megatron", "Megatron-LM"), ("same_device", "same-device replay")):
        r = v["detectors"][d]
        if not r["compared"]:
            continue
        cells = [f"{pct(m)} / {pct(x)}" for m, x in zip(r["measured"], r["derived"])]
        L.append(
            f"| {label} | {r['compared']} | "
            + " | ".join(cells)
            + f" | {pct(r['attributed_measured'])} / {pct(r['attributed_derived'])} |"
        )
    return L


def frameworks(a: dict[str, Any]) -> list[str]:
    L = [
        "| entry point | faults | changed the faulty rank's gradients | detected at the step | named the faulty rank "
        "| vetoed (no rank applied it) | masked ones flagged | false alarms on clean steps |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for key, label in (
        ("lightning", "Lightning `SDCGuardCallback`, `DDPStrategy`"),
        ("fsdp", "FSDP2 (`fully_shard`), the guard's four calls"),
    ):
        fw = a.get(key)
        if fw:
            L.append(
                f"| {label} | {fw['faults']} | {fw['effective']} | {fw['detected']} | {fw['attributed']} | "
                f"{fw['vetoed']} | {fw['masked_flagged']} | {fw['clean_incidents']} |"
            )
    return L


def tables(a: dict[str, Any], header: str, costs: dict[str, Any] | None) -> str:
    L = [header, ""]
    L += [
        "### Choose a setting",
        "",
        "Each fault kind's chance of detection within 1 (the faulty step itself), 10 or 1,000 steps, over every "
        "fault of that kind that changed the step's result; *named*: the first detection named exactly the "
        "faulty rank (within 1,000 steps).",
        "",
    ]
    L += choose(a, costs)
    for t in TIMINGS:
        L += ["", f"### {t.capitalize()} faults", ""] + per_timing(a, t)
    L += ["", "### By target: within 1 / within 1,000 steps", ""] + by_group(a)
    L += [
        "",
        "### Measured on the faulty step: what each check sees",
        "",
        "Each cell: detected / named exactly the faulty rank, on the faulty step itself (every check ran on it).",
        "",
    ] + measured_step(a)
    L += [
        "",
        "### Matmul faults by bit class: checksums and replay on the faulty step",
        "",
        "Each cell: detected / named exactly the faulty rank, on the faulty step (both checks ran on it); fp32. "
        + _matmul_counts(a),
        "",
    ] + matmul_bits(a)
    L += [
        "",
        "### The derivation against measured episodes",
        "",
        f"{a['validation']['episodes']} faults at a random phase of real schedules "
        f"(`replay_every={a['settings']['replay_every']}`, `weight_check_every="
        f"{a['settings']['weight_check_every']}`, Megatron's hash every {a['settings']['hash_every']} iterations), "
        "followed step by step; the derived column applies the same derivation as the tables above to the "
        "measured steps of the same fault cells.",
        "",
    ] + validation(a)
    sh = a["shadow"]
    gs = sh["given_sampled"]
    L += [
        "",
        "### Continuous verification (dedicated shadow)",
        "",
        f"On a step whose sample was the faulty worker's, the shadow detected {gs['sdc.replay'][0]} and named the "
        f"faulty worker for {gs['sdc.replay'][1]} of {gs['faults']} compute faults that changed the result; its "
        f"verdict arrived {_delays(sh['delays'])} after the faulty step. On a step whose sample was another "
        f"worker's, the shadow's replay saw {sh['unsampled_replay_fired']} of {sh['unsampled']} such faults.",
    ]
    L += ["", "### The real entry points: one-off faults inside the framework's own backward", ""] + frameworks(a)
    fa = a["false_alarms"]
    L += [
        "",
        "### False alarms",
        "",
        f"{fa['steps']:,} clean steps x 3 ranks with every check on every step (`replay_every=1`, "
        f"`weight_check_every=1`; calibrated bit-identical: {fa['calibrated']}): sdcguard {fa['sdcguard']}, "
        f"Megatron-LM's loss/grad checks {fa['megatron']}, its weight hash {fa['megatron_hash']}, same-device "
        f"replay {fa['same_device']}; continuous verification {fa.get('continuous', '–')} in "
        f"{fa.get('continuous_steps', 0):,} steps. The checksums on those steps: "
        + ", ".join(f"{n:,} {what}" for n, what in zip(fa.get("matmuls", [0, 0, 0]), ("checked", "unverifiable")))
        + f" of {fa.get('matmuls', [0, 0, 0])[2]:,} matmuls run (rank 0).",
    ]
    return "\n".join(L) + "\n"


def _matmul_counts(a: dict[str, Any]) -> str:
    """What the checked steps' checksums covered, per step (rank 0's clean steps): checked, unverifiable, run."""
    fa = a["false_alarms"]
    checked, unverifiable, run = fa.get("matmuls", [0, 0, 0])
    steps = max(1, fa["steps"])
    return (
        f"Matmuls per checked step (rank 0): {checked / steps:.0f} checked, {unverifiable / steps:.0f} "
        f"unverifiable, {run / steps:.0f} run."
    )


def _delays(delays: list[int]) -> str:
    if not delays:
        return "–"
    lo, hi = min(delays), max(delays)
    return f"{lo} step{'s' if lo != 1 else ''}" if lo == hi else f"{lo} to {hi} steps"
