"""Everything the campaign's tables say, as one dict (also written as JSON), and the headline CI checks."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

from .faults import BIT_CLASSES, GROUPS, OP_TARGETS, TARGETS, TIMINGS
from .report import (
    SETTINGS,
    Curves,
    Setting,
    derive,
    frameworks,
    judge_peer,
    judge_shadow,
    later_rates,
    measured_episodes,
    per_step,
    validation,
)

ALL = 1.0 - 1e-9
"""A derived share that is 1 up to the rounding of the derivation (each check of a setting adds a few roundings)."""

PER_STEP_CHECKS = ("sdc.replay", "sdc.checksum", "sdc.every", "sdc.weights", "meg.step", "meg.hash", "same.step")


def _by(key: str, value: str) -> Callable[[dict[str, Any]], bool]:
    return lambda j: j[key] == value


def _and(*fs: Callable[[dict[str, Any]], bool]) -> Callable[[dict[str, Any]], bool]:
    return lambda j: all(f(j) for f in fs)


def _group(g: str) -> Callable[[dict[str, Any]], bool]:
    return lambda j: GROUPS[j["target"]] == g


def _derived(
    setting: Setting,
    peer: list[dict[str, Any]],
    shadow: list[dict[str, Any]],
    later: Any,
    shadow_later: Any,
    delay: int,
    cache: Curves,
) -> dict[str, Any]:
    judged, rates = (shadow, shadow_later) if setting.kind == "shadow" else (peer, later)
    if setting.kind == "shadow":
        judged = [j for j in judged if j["sampled"]]
    else:
        delay = 0  # peer replays and every other check report on the step they check
    out: dict[str, Any] = {"all": derive(setting, judged, rates, cache, lambda j: True, delay)}
    for t in TIMINGS:
        out[t] = derive(setting, judged, rates, cache, _by("timing", t), delay)
        for g in ("compute", "after the reduction", "weights in memory"):
            out[f"{t}|{g}"] = derive(setting, judged, rates, cache, _and(_by("timing", t), _group(g)), delay)
    for g in ("compute", "after the reduction", "weights in memory"):
        out[g] = derive(setting, judged, rates, cache, _group(g), delay)
    return out


def _false_alarms(peer_results: list[dict[str, Any]], shadow_results: list[dict[str, Any]]) -> dict[str, Any]:
    clean = [res["clean"] for res in peer_results]
    steps = clean[0]["steps"]
    # a step counts once whatever rank fired: sdcguard's incidents are the same on every rank
    out = {
        "steps": steps,
        "calibrated": all(res["calibrated"] for res in peer_results),
        "sdcguard": clean[0]["sdcguard"],
        "megatron": max(c["megatron"] for c in clean),
        "megatron_hash": clean[0]["hash"],
        "same_device": max(c["same_device"] for c in clean),
        "events": clean[0]["events"],
        "matmuls": clean[0].get("matmuls", [0, 0, 0]),  # rank 0's: checked, unverifiable, run (summed)
    }
    if shadow_results:
        w = shadow_results[0]["clean"]
        out["continuous"] = len({stp for _, stp, _, _ in w["incidents"]})
        out["continuous_steps"] = w["steps"]
    return out


def analyse(
    plan: Any,
    peer_results: list[dict[str, Any]],
    shadow_results: list[dict[str, Any]],
    fsdp_results: list[dict[str, Any]],
    lightning_results: list[dict[str, Any]],
) -> dict[str, Any]:
    peer = judge_peer(plan.peer.trials, peer_results)
    shadow = judge_shadow(plan.shadow.trials, shadow_results) if shadow_results else []
    later, shadow_later = later_rates(peer), later_rates([j for j in shadow if j["sampled"]])
    delays = [j["delay"] for j in shadow if j["delay"] is not None]
    delay = int(statistics.median(delays)) if delays else 2
    cache = Curves()
    derived = {
        s.key: _derived(s, peer, shadow, later, shadow_later, delay, cache)
        for s in SETTINGS
        if s.kind != "shadow" or shadow
    }
    eff = [j for j in peer if j["effective"]]
    steps: dict[str, Any] = {}
    for t in TIMINGS:
        for target in TARGETS:
            steps[f"{t}|{target}"] = per_step(
                peer, PER_STEP_CHECKS, _and(_by("timing", t), _by("target", target), lambda j: j["effective"])
            )
        steps[t] = per_step(peer, PER_STEP_CHECKS, _and(_by("timing", t), lambda j: j["effective"]))
    steps["all"] = per_step(peer, PER_STEP_CHECKS, lambda j: j["effective"])
    for bits in BIT_CLASSES:  # the matmul checksums by bit class (every timing), beside replay
        steps[f"bits|matmul|{bits}"] = per_step(
            peer, PER_STEP_CHECKS, _and(_by("target", "matmul"), _by("bits", bits), lambda j: j["effective"])
        )
    steps["masked"] = per_step(peer, PER_STEP_CHECKS, lambda j: not j["effective"])
    steps["masked, loss changed"] = per_step(peer, PER_STEP_CHECKS, lambda j: not j["effective"] and j["loss_changed"])
    episodes = measured_episodes(plan.peer.episodes, peer_results)
    unsampled = [j for j in shadow if not j["sampled"]]
    out = {
        "faults": len(peer),
        "effective": len(eff),
        "vetoed": sum(1 for j in eff if not j["commit"]),
        "derived": derived,
        "per_step": steps,
        "false_alarms": _false_alarms(peer_results, shadow_results),
        "validation": validation(episodes, peer, later, plan.peer.settings, plan.checkpoints),
        "episodes": episodes,
        "op_calls": peer_results[0]["op_calls"],
        "shadow": {
            "trials": len([j for j in shadow if j["sampled"]]),
            "effective": len([j for j in shadow if j["sampled"] and j["effective"]]),
            "delays": sorted(delays),
            "delay": delay,
            "unsampled": len([j for j in unsampled if j["effective"]]),
            "unsampled_replay_fired": sum(1 for j in unsampled if j["effective"] and j["hit"]["sdc.replay"][0]),
            "given_sampled": per_step(
                [j for j in shadow if j["sampled"]],
                ("sdc.replay", "sdc.every", "sdc.weights"),
                lambda j: j["effective"] and j["target"] in OP_TARGETS,
            ),
        },
        "fsdp": frameworks(plan.frameworks.trials, fsdp_results) if fsdp_results else None,
        "lightning": frameworks(plan.frameworks.trials, lightning_results) if lightning_results else None,
        "seconds": {
            "peer_trials": peer_results[0]["trials_s"],
            "peer_clean": peer_results[0]["clean"]["seconds"],
            "episodes": peer_results[0]["episodes_s"],
        },
        "peer_trials": peer,
        "shadow_trials": shadow,
    }
    return out


def headline_failures(a: dict[str, Any]) -> list[str]:
    """What the headline of docs/detection.md claims, checked against one run; empty when it all holds."""
    bad = []
    d = a["derived"]
    ev = d["every_step"]
    if ev["all"].get("within_1", 0) < ALL or ev["all"].get("attributed", 0) < ALL:
        bad.append(f"replay_every=1: not every effective fault detected and named at its step: {ev['all']}")
    if a["vetoed"] != a["effective"] - sum(1 for j in a["peer_trials"] if j["effective"] and j["target"] == "weights"):
        bad.append(f"the guard did not veto every effective fault's step ({a['vetoed']} of {a['effective']})")
    df = d["defaults"]
    for t in TIMINGS:
        post = df.get(f"{t}|after the reduction", {})
        if post.get("faults") and (post["within_1"] < ALL or post["attributed"] < ALL):
            bad.append(f"defaults: {t} faults after the reduction not all caught and named at their step: {post}")
    comp = d["replay_only"].get("one-off|compute", {})
    if comp.get("faults") and abs(comp["within_1"] - 1 / 50) > 1e-9:
        bad.append(f"replay alone: a one-off compute fault should be caught at its step 1 time in 50: {comp}")
    bad += _checksum_failures(a)
    sticky = df.get("sticky|compute", {})
    if sticky.get("faults") and (sticky["max"] is None or sticky["max"] > 50 or sticky.get("within_100", 0) < 1.0):
        bad.append(f"defaults: a sticky compute fault should be caught within 50 steps: {sticky}")
    for t in TIMINGS:
        weights = df.get(f"{t}|weights in memory", {})
        if weights.get("faults") and weights["within_100"] < 1.0:
            bad.append(f"defaults: {t} corrupted weights not all caught within 100 steps: {weights}")
    for key in ("sticky|compute", "sticky|after the reduction", "one-off|weights in memory"):
        same = d["same_device"].get(key, {})
        if same.get("faults") and same["within_1000"] > 0:
            bad.append(f"same-device replay caught a fault it cannot see ({key}): {same}")
    meg, guard = d["megatron"]["all"], d["defaults"]["all"]
    if meg.get("within_1000", 0) >= guard.get("within_1000", 0):
        bad.append(f"Megatron-LM caught as much as sdcguard at its defaults: {meg} vs {guard}")
    fa = a["false_alarms"]
    if fa["sdcguard"] or fa.get("continuous"):
        bad.append(f"sdcguard raised false alarms on clean steps: {fa}")
    if not fa["calibrated"]:
        bad.append("replays were not bit-identical on this setup (calibrate)")
    sh = a["shadow"]
    if sh["unsampled_replay_fired"]:
        bad.append(f"a shadow's replay saw a fault on a step it did not sample: {sh}")
    gs = sh["given_sampled"]
    if gs["faults"] and tuple(gs["sdc.replay"]) != (gs["faults"], gs["faults"]):
        bad.append(f"continuous: a sampled compute fault not detected and named by the shadow: {gs}")
    for name in ("fsdp", "lightning"):
        fw = a[name]
        if fw is None:
            continue
        if not (fw["detected"] == fw["attributed"] == fw["vetoed"] == fw["effective"]) or fw["clean_incidents"]:
            bad.append(
                f"{name}: not every effective one-off backward fault detected, named and vetoed: "
                f"{ {k: v for k, v in fw.items() if k != 'rows'} }"
            )
        if fw["twin_matched"] != fw["changed"] or not fw["ranks_agree"]:
            bad.append(f"{name}: the twin did not reproduce the job's fault, or ranks disagreed")
    bad += _validation_failures(a["validation"])
    return bad


def _checksum_failures(a: dict[str, Any]) -> list[str]:
    """The checksum goals: at the defaults, one-off matmul faults caught at their step at least 10x as often as by
    replay alone; on a checked step every sign, exponent and NaN fault of a matmul (fp32) caught and named."""
    bad = []
    ps = a["per_step"]
    one_off = ps.get("one-off|matmul", {})
    if one_off.get("faults", 0) >= 10:  # a share of fewer faults says little (the quick campaign has a handful)
        share = one_off["sdc.checksum"][0] / one_off["faults"]
        every = next(s.checksum_every for s in SETTINGS if s.key == "defaults")
        at_default = share / every  # the derivation of the tables, on the measured share
        if at_default < 10 / 50:
            bad.append(
                f"defaults: one-off matmul faults caught at their step {at_default:.3f}, under 10x replay's "
                f"1/50 ({one_off})"
            )
    for bits in ("sign", "exponent", "nan"):
        s = ps.get(f"bits|matmul|{bits}", {})
        if s.get("faults") and tuple(s["sdc.checksum"]) != (s["faults"], s["faults"]):
            bad.append(f"checksum: not every {bits} fault of a matmul caught and named on its step: {s}")
    return bad


def _validation_failures(v: dict[str, Any]) -> list[str]:
    bad = []
    for d, r in v["detectors"].items():
        n = r["compared"]
        if not n:
            continue
        for cp, m, x in zip(v["checkpoints"], r["measured"], r["derived"]):
            # binomial standard error of the measured share, at least one fault's worth of slack
            se = max(x * (1 - x), 0.25 / n) ** 0.5 / n**0.5
            if abs(m - x) > max(3 * se, 1.0 / n):
                bad.append(f"validation: {d} within {cp} steps measured {m:.2f}, derived {x:.2f} over {n} faults")
    return bad
