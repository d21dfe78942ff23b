"""The campaign's analysis parts: per-step measurements judged per fault, the derived detection curves per detector
and setting, the measured check of the derivation (episodes), and the real entry points' results."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from sdcguard.training.config import DEFAULT_CHECKSUM_EVERY

from .faults import BIT_CLASSES, GROUPS, TARGET_LABELS, TARGETS, TIMINGS, Trial
from .schedule import Component, curves, quantile_steps, within

HORIZON = 1000
WITHIN = (1, 10, 100, 1000)
SHADOW_WORKERS = 3


@dataclass(frozen=True)
class Setting:
    """One detector at one setting: a row of the tables."""

    key: str
    label: str
    kind: str  # "peer", "shadow", "megatron", "same"
    replay_every: int = 0
    weight_check_every: int = 0
    hash_every: int = 0
    vetoes: str = ""
    checksum_every: int = 0
    """Checksum checks of the matmuls on one step in N (0: off)."""


SETTINGS = (
    Setting(
        "defaults",
        f"sdcguard, defaults (`replay_every=50`, `weight_check_every=100`, `checksum_every={DEFAULT_CHECKSUM_EVERY}`)",
        "peer",
        50,
        100,
        vetoes="yes, when it sees the fault on its step",
        checksum_every=DEFAULT_CHECKSUM_EVERY,
    ),
    Setting(
        "replay_only",
        "sdcguard, replay alone at the defaults (`replay_every=50`, `checksum_every=0`)",
        "peer",
        50,
        100,
        vetoes="yes, when it sees the fault on its step",
    ),
    Setting(
        "checksum1",
        "sdcguard, `checksum_every=1` (`replay_every=50`, `weight_check_every=100`)",
        "peer",
        50,
        100,
        vetoes="yes, when it sees the fault on its step",
        checksum_every=1,
    ),
    Setting(
        "replay10",
        "sdcguard, `replay_every=10` (`weight_check_every=100`)",
        "peer",
        10,
        100,
        vetoes="yes, when it sees the fault on its step",
    ),
    Setting(
        "continuous",
        "sdcguard, continuous: 1 dedicated shadow per 3 workers, `replay_every=1`",
        "shadow",
        1,
        100,
        vetoes="faults after the reduction only (a shadow reports 2 steps later)",
    ),
    Setting("every_step", "sdcguard, `replay_every=1`, `weight_check_every=1` (peer)", "peer", 1, 1, vetoes="yes"),
    Setting(
        "megatron",
        "Megatron-LM, every shipped check, weight hash every 20,000 iterations",
        "megatron",
        hash_every=20000,
        vetoes="no: NaN/Inf and a hash mismatch stop the job, spikes are logged",
    ),
    Setting(
        "megatron10",
        "Megatron-LM, every shipped check, weight hash every 10 iterations",
        "megatron",
        hash_every=10,
        vetoes="no (as above)",
    ),
    Setting("same_device", "same-device replay of every step (torchtitan-style)", "same", vetoes="no"),
)


# ---------------------------------------------------------------------------------------------- judging


REPLAY_KINDS = ("replay", "unresolved")
"""Incidents of the replay check: a device named, or a disagreement nobody could settle (every device a suspect)."""


def _fired(kinds: Iterable[tuple[str, list[int]]], kind: str | tuple[str, ...]) -> tuple[bool, list[int]]:
    wanted = (kind,) if isinstance(kind, str) else kind
    suspects = sorted({s for k, sus in kinds if k in wanted for s in sus})
    return any(k in wanted for k, _ in kinds), suspects


def _view(per_rank: list[dict[str, Any]], which: str) -> dict[str, tuple[bool, list[int]]]:
    """Every check's (fired, suspects) on one step, from all ranks' observations of it."""
    sdc = per_rank[0][which]["sdcguard"]  # identical on every rank
    out = {
        f"sdc.{k}": _fired(sdc, n)
        for k, n in (
            ("every", "gradient_replica"),
            ("replay", REPLAY_KINDS),
            ("weights", "weight_replica"),
            ("checksum", "checksum"),
        )
    }
    meg = [r for r, res in enumerate(per_rank) if res[which]["megatron"]]
    out["meg.step"] = (bool(meg), meg)
    out["meg.hash"] = (bool(per_rank[0][which]["hash"]), list(per_rank[0][which]["hash"]))
    local = [r for r, res in enumerate(per_rank) if res[which]["same_device"][0]]
    reduced = [r for r, res in enumerate(per_rank) if res[which]["same_device"][1]]
    out["same.step"] = (bool(local or reduced), local or reduced)
    out["nondeterministic"] = _fired(sdc, "nondeterministic")
    return out


def judge_peer(trials: Sequence[Trial], results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    judged = []
    for i, t in enumerate(trials):
        per_rank = [res["trials"][i] for res in results]
        judged.append(
            {
                **asdict(t),
                "effective": any(p["effective"] for p in per_rank),
                "loss_changed": any(p["loss_changed"] for p in per_rank),
                "changed": per_rank[t.rank]["changed"],
                "commit": per_rank[0]["hit"]["commit"],
                "hit": _view(per_rank, "hit"),
                "state": _view(per_rank, "follow"),
            }
        )
    return judged


def judge_shadow(trials: Sequence[Any], results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    workers = results[:SHADOW_WORKERS]
    judged = []
    for i, st in enumerate(trials):
        w0 = workers[0]["trials"][i]
        s = w0["step"]

        def seen(kind: str | tuple[str, ...], step: int) -> tuple[bool, list[int], int | None]:
            wanted = (kind,) if isinstance(kind, str) else kind
            found = [(sus, at) for k, stp, sus, at in w0["incidents"] if k in wanted and stp == step]
            sus = sorted({x for f, _ in found for x in f})
            return bool(found), sus, (min(at for _, at in found) - step) if found else None

        rep = seen(REPLAY_KINDS, s)
        judged.append(
            {
                **asdict(st.trial),
                "sampled": st.sampled,
                "step": s,
                "effective": any(w["trials"][i]["effective"] for w in workers),
                "changed": workers[st.trial.rank]["trials"][i]["changed"],
                "delay": rep[2],
                "hit": {
                    "sdc.every": seen("gradient_replica", s)[:2],
                    "sdc.replay": rep[:2],
                    "sdc.weights": seen("weight_replica", s)[:2],
                },
                "state": {
                    "sdc.every": seen("gradient_replica", s + 1)[:2],
                    "sdc.replay": seen(REPLAY_KINDS, s + SHADOW_WORKERS)[:2],
                    "sdc.weights": seen("weight_replica", s + 1)[:2],
                },
            }
        )
    return judged


# ---------------------------------------------------------------------------------------------- components


def _checks(setting: Setting) -> list[tuple[str, int, bool]]:
    """(check, period, persistent) of a setting."""
    if setting.kind in ("peer", "shadow"):
        replay = SHADOW_WORKERS if setting.kind == "shadow" else setting.replay_every
        checks = [
            ("sdc.every", 1, False),
            ("sdc.replay", replay, False),
            ("sdc.weights", setting.weight_check_every, True),
        ]
        return checks + ([("sdc.checksum", setting.checksum_every, False)] if setting.checksum_every else [])
    if setting.kind == "megatron":
        return [("meg.step", 1, False), ("meg.hash", setting.hash_every, True)]
    return [("same.step", 1, False)]


def later_rates(judged: Sequence[dict[str, Any]]) -> dict[tuple[str, str, str], tuple[float, float]]:
    """Per (target, bits, check): on a step an intermittent fault is active, the share on which the check fired,
    and the share of those firings that named exactly the faulty rank."""
    acc: dict[tuple[str, str, str], list[tuple[bool, bool]]] = defaultdict(list)
    for j in judged:
        if j["timing"] != "intermittent":
            continue
        for check, (fired, sus) in j["hit"].items():
            acc[(j["target"], j["bits"], check)].append((fired, sus == [j["rank"]]))
    out = {}
    for key, v in acc.items():
        fired = [a for f, a in v if f]
        out[key] = (len(fired) / len(v), (sum(fired) / len(fired)) if fired else 1.0)
    return out


def components(
    setting: Setting, j: dict[str, Any], later: dict[tuple[str, str, str], tuple[float, float]], default_delay: int = 0
) -> tuple[Component, ...]:
    """A fault's checks at a setting (``default_delay``: a shadow's verdict delay where this fault's is unknown)."""
    out = []
    for check, period, persistent in _checks(setting):
        hit, hit_sus = j["hit"][check]
        state, state_sus = j["state"][check]
        rate, rate_attr = (0.0, 1.0)
        if j["timing"] == "intermittent":
            rate, rate_attr = later.get((j["target"], j["bits"], check), (0.0, 1.0))
        delay = (j.get("delay") or default_delay) if check == "sdc.replay" else 0
        out.append(
            Component(
                period=period,
                delay=delay,
                hit=hit,
                state=state,
                persistent=persistent,
                later=rate,
                hit_attributed=hit_sus == [j["rank"]],
                state_attributed=state_sus == [j["rank"]],
                later_attributed=rate_attr,
            )
        )
    return tuple(out)


class Curves:
    """Derived detection curves, cached by a fault's components (many faults share them)."""

    def __init__(self, horizon: int = HORIZON) -> None:
        self.horizon = horizon
        self._cache: dict[tuple[tuple[Component, ...], str, int | None], tuple[np.ndarray, np.ndarray]] = {}

    def __call__(
        self, comps: tuple[Component, ...], timing: str, phase: int | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        key = (comps, timing, phase)
        if key not in self._cache:
            self._cache[key] = curves(comps, timing, self.horizon, phase=phase)
        return self._cache[key]


def summarise(rows: list[tuple[np.ndarray, np.ndarray]], horizon: int = HORIZON) -> dict[str, Any]:
    """Within-N detection, attribution, median and maximum steps over faults (equal weight each)."""
    if not rows:
        return {"faults": 0}
    missed = [m for m, _ in rows]
    out: dict[str, Any] = {"faults": len(rows)}
    for n in WITHIN:
        if n <= horizon:
            out[f"within_{n}"] = float(np.mean([within(m, n) for m in missed]))
    out["attributed"] = float(np.mean([a[horizon] for _, a in rows]))
    out["median"] = quantile_steps(missed, 0.5, horizon)
    out["max"] = quantile_steps(missed, 1.0, horizon)
    out["p99"] = quantile_steps(missed, 0.99, horizon)
    return out


def derive(
    setting: Setting,
    judged: Sequence[dict[str, Any]],
    later: dict[Any, Any],
    cache: Curves,
    select: Callable[[dict[str, Any]], bool],
    default_delay: int = 0,
) -> dict[str, Any]:
    rows = [
        cache(components(setting, j, later, default_delay), j["timing"]) for j in judged if j["effective"] and select(j)
    ]
    return summarise(rows, cache.horizon)


# ---------------------------------------------------------------------------------------------- validation


def _first(steps: list[dict[str, Any]], detector: str) -> tuple[int | None, list[int]]:
    for k, st in enumerate(steps):
        if detector == "sdcguard":
            sus = st["sdcguard"]
        elif detector == "megatron":
            sus = sorted(set(st["megatron"]) | set(st["hash"]))
        else:
            sus = st["same_device"]
        if sus:
            return k, sus
    return None, []


def measured_episodes(episodes: Sequence[Any], results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per effective episode and detector: steps to the first detection (1 = the faulty step) and its suspects."""
    out = []
    for i, e in enumerate(episodes):
        per_rank = [res["episodes"][i] for res in results]
        if not any(p["effective"] for p in per_rank):
            continue
        length = len(per_rank[0]["steps"])
        steps = []
        for k in range(length):
            megatron = [r for r, p in enumerate(per_rank) if p["steps"][k]["megatron"]]
            local = [r for r, p in enumerate(per_rank) if p["steps"][k]["same_device"][0]]
            reduced = [r for r, p in enumerate(per_rank) if p["steps"][k]["same_device"][1]]
            steps.append(
                {
                    "sdcguard": per_rank[0]["steps"][k]["sdcguard"],
                    "megatron": megatron,
                    "hash": per_rank[0]["steps"][k]["hash"],
                    "same_device": local or reduced,
                }
            )
        row = {"trial": asdict(e.trial), "phase": e.phase, "start": e.start}
        for d in ("sdcguard", "megatron", "same_device"):
            k, sus = _first(steps, d)
            row[d] = {"steps": None if k is None else k + 1, "attributed": sus == [e.trial.rank]}
        out.append(row)
    return out


def validation(
    episodes_measured: list[dict[str, Any]],
    judged: Sequence[dict[str, Any]],
    later: dict[Any, Any],
    settings: Any,
    checkpoints: Sequence[int],
) -> dict[str, Any]:
    """Measured within-N of the episodes against the derivation at the episode settings and at each episode's own
    phase of the schedule, from the measured steps of the trials of the same fault cell."""
    horizon = settings.length
    cache = Curves(horizon)
    ep_settings = {
        "sdcguard": Setting("ep", "", "peer", settings.replay_every, settings.weight_check_every),
        "megatron": Setting("ep", "", "megatron", hash_every=settings.hash_every),
        "same_device": Setting("ep", "", "same"),
    }
    cells: dict[tuple[str, ...], list[dict[str, Any]]] = defaultdict(list)
    for j in judged:
        if j["effective"]:
            cells[(j["target"], j["bits"], j["timing"])].append(j)
            cells[(j["target"], j["timing"])].append(j)  # where a bit class has no trial (the quick run)
    out: dict[str, Any] = {"episodes": len(episodes_measured), "checkpoints": list(checkpoints), "detectors": {}}
    for d, setting in ep_settings.items():
        derived, measured, attr_m, attr_d = [], [], [], []
        for ep in episodes_measured:
            t = ep["trial"]
            same = cells.get((t["target"], t["bits"], t["timing"])) or cells.get((t["target"], t["timing"]), [])
            if not same:
                continue
            rows = [cache(components(setting, j, later), j["timing"], ep["phase"]) for j in same]
            derived.append([float(np.mean([within(m, n) for m, _ in rows])) for n in checkpoints])
            attr_d.append(float(np.mean([a[horizon] for _, a in rows])))
            k = ep[d]["steps"]
            measured.append([float(k is not None and k <= n) for n in checkpoints])
            attr_m.append(float(k is not None and ep[d]["attributed"]))
        n = len(measured)
        out["detectors"][d] = {
            "compared": n,
            "measured": [float(np.mean(c)) for c in zip(*measured)] if n else [],
            "derived": [float(np.mean(c)) for c in zip(*derived)] if n else [],
            "attributed_measured": float(np.mean(attr_m)) if n else None,
            "attributed_derived": float(np.mean(attr_d)) if n else None,
        }
    return out


# ---------------------------------------------------------------------------------------------- per-step tables


def per_step(
    judged: Sequence[dict[str, Any]], checks: Sequence[str], select: Callable[[dict[str, Any]], bool]
) -> dict[str, Any]:
    rows = [j for j in judged if select(j)]
    out: dict[str, Any] = {"faults": len(rows)}
    for c in checks:
        det = [j for j in rows if j["hit"][c][0]]
        out[c] = (len(det), sum(1 for j in det if j["hit"][c][1] == [j["rank"]]))
    return out


def frameworks(trials: Sequence[Trial], results: list[dict[str, Any]]) -> dict[str, Any]:
    rows = []
    clean_incidents = sum(1 for res in results for r in res["results"] if "clean_incident" in r)
    for i, t in enumerate(trials):
        per = [[r for r in res["results"] if "clean_incident" not in r][i] for res in results]
        own = per[t.rank]
        suspects = sorted({s for _, sus in per[0]["incidents"] for s in sus})
        rows.append(
            {
                **asdict(t),
                "effective": own["effective"],
                "changed": own["changed"],
                "twin_matched": own["twin_matched"],
                "detected": bool(per[0]["incidents"]),
                "attributed": suspects == [t.rank],
                "vetoed": not any(p["commit"] for p in per),
                "agree": all(p["incidents"] == per[0]["incidents"] and p["commit"] == per[0]["commit"] for p in per),
            }
        )
    eff = [r for r in rows if r["effective"]]
    return {
        "faults": len(rows),
        "effective": len(eff),
        "detected": sum(r["detected"] for r in eff),
        "attributed": sum(r["attributed"] for r in eff),
        "vetoed": sum(r["vetoed"] for r in eff),
        "masked_flagged": sum(r["detected"] for r in rows if not r["effective"]),
        "twin_matched": sum(r["twin_matched"] for r in rows if r["changed"]),
        "changed": sum(1 for r in rows if r["changed"]),
        "ranks_agree": all(r["agree"] for r in rows),
        "clean_incidents": clean_incidents,
        "rows": rows,
    }


def pct(x: float | None) -> str:
    if x is None:
        return "–"
    x = min(1.0, max(0.0, x))
    return f"{100 * x:.1f}%" if 0.0005 <= x < 0.1 else f"{100 * x:.0f}%"


def steps_text(v: int | None) -> str:
    return "–" if v is None else f"{v:,}"


__all__ = [
    "SETTINGS",
    "Setting",
    "judge_peer",
    "judge_shadow",
    "later_rates",
    "components",
    "Curves",
    "derive",
    "summarise",
    "measured_episodes",
    "validation",
    "per_step",
    "frameworks",
    "pct",
    "steps_text",
    "TARGETS",
    "TIMINGS",
    "GROUPS",
    "TARGET_LABELS",
    "BIT_CLASSES",
    "WITHIN",
    "HORIZON",
]
