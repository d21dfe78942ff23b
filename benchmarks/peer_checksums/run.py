"""One run of the comparison: start both workers, then per dtype the census, the faults, the clean steps, the cost.

Proof that number k is the same op everywhere: each worker runs a clean step under every checker with a
counting-only injector and compares the list of numbered matmuls (op, operand shapes, pass) with a step without a
checker, and the parent compares the two workers' lists (:func:`_census`); every fault's record (op, element, old and
new bits) is compared between the workers too (:func:`_compare_records`). The cost is measured in interleaved
rounds (the workers take turns, and each rotates its configurations), each round's checked steps against the same
round's plain steps (:func:`_cost`).
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.peer_checksums.faults import BITS, CLASSES, TILE_FACTOR, plan_faults
from benchmarks.peer_checksums.processes import Worker, ensure_peer_venv, log
from benchmarks.peer_checksums.report import summarize
from benchmarks.peer_checksums.worker import INJECTOR, ROOT, SIZE, WORKER_CONFIGS, signature

__all__ = ["run"]

_TALLIES = ("steps", "alarm_steps", "alarms", "checked", "run", "skipped_dtype", "unjudged")


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every figure of the comparison and every fault's record (the ``--json`` output)."""
    t_start = time.perf_counter()
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="peer_checksums_"))
    workdir.mkdir(parents=True, exist_ok=True)
    sha = hashlib.sha256(INJECTOR.read_bytes()).hexdigest()
    log(f"work directory {workdir} (the injector module: {INJECTOR}, sha256 {sha[:16]})")
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    res: dict[str, Any] = {
        "settings": {
            "faults": args.faults,
            "clean": args.clean,
            "rounds": args.rounds,
            "round_steps": args.round_steps,
            "dtypes": dtypes,
            "seed": args.seed,
            "size": SIZE,
            "threads": 1,
            "venv": str(args.venv),
            "injector_sha256": sha,
            "workdir": str(workdir),
            "tile_factor": TILE_FACTOR,
            "bits": BITS,
        },
        "dtypes": {d: {"faults": {}, "clean": {}, "census_check": {}, "notes": []} for d in dtypes},
    }
    workers: dict[str, Worker] = {}
    try:
        _start_workers(args, workdir, res, workers)
        setups = {}
        for k, w in workers.items():
            log(f"{k}: setup and census (one clean step under each checker, counting the model's matmuls)")
            setups[k] = w.call("setup", dtypes=dtypes)
            res[f"{k}_info"] = setups[k]["info"]
            if setups[k]["info"]["injector_sha256"] != sha:
                raise RuntimeError(f"{k} loaded a different injector")
        for dtype in dtypes:
            d = res["dtypes"][dtype]
            _census(d, setups, dtype)
            plan = plan_faults(d["census"], args.faults, args.seed, dtype)
            _faults(d, workers, plan, dtype)
            if "peer" in workers and args.faults:
                _compare_records(d)
            _clean(d, workers, dtype, args.clean)
            times, per_round = _timing(d, workers, dtype, args.rounds, args.round_steps)
            d["cost"] = _cost(res, workers, times, per_round)
            _peer_notes(d, res, workers, dtype)
            d["notes"].append(
                "matmuls per step (plain census): "
                + ", ".join(f"{k} {v}" for k, v in sorted(d["matmuls_per_step"].items()))
                + "; bmm = attention (q k^T, att v and their gradients), which protect() does not see"
            )
    finally:
        for w in workers.values():
            w.close()
    summarize(res)
    res["seconds"] = round(time.perf_counter() - t_start, 1)
    return res


def _start_workers(args: argparse.Namespace, workdir: Path, res: dict[str, Any], workers: dict[str, Worker]) -> None:
    """Ours from the project's virtualenv; the peer from its own (created or reused), unless ``--no-peer``."""
    ours_python = args.ours_python or str(ROOT / ".venv" / "bin" / "python")
    workers["ours"] = Worker("ours", ours_python, args.seed, workdir)
    if args.no_peer:
        res["peer_error"] = "--no-peer"
        return
    t0 = time.perf_counter()
    peer_python, why = ensure_peer_venv(Path(args.venv), args.torch_spec, args.peer_spec, workdir)
    res["peer_venv"] = {"result": why, "seconds": round(time.perf_counter() - t0, 1)}
    log(f"peer virtualenv: {why}")
    if peer_python is None:
        res["peer_error"] = why
        return
    try:
        workers["peer"] = Worker("peer", peer_python, args.seed, workdir)
    except RuntimeError as e:
        res["peer_error"] = str(e)
        log(str(e))


def _census(d: dict[str, Any], setups: dict[str, Any], dtype: str) -> None:
    """The plain step's numbered matmuls, and whether every checker's step (and the other worker's) numbers the same."""
    census = setups["ours"]["census"][dtype]
    d["census"] = census
    for k, s in setups.items():
        d["census_check"].update({c: v for c, v in s["census_check"][dtype].items() if c != "plain"})
        d["census_check"][f"plain ({k})"] = s["census_check"][dtype]["plain"]
    if "peer" in setups:
        same = [signature(o) for o in setups["peer"]["census"][dtype]] == [signature(o) for o in census]
        d["census_same_across_workers"] = same
        if not same:
            d["notes"].append(
                "the two workers' plain steps numbered different matmuls: the faults are "
                "NOT the same ops (see census_check in the JSON)"
            )
    d["notes"].append(
        "the model's matmuls numbered alike (op, operand shapes, pass, layer) under "
        + ", ".join(f"{c}: {'yes' if v['same_as_plain'] else 'NO'}" for c, v in d["census_check"].items())
        + (
            f"; both workers' plain steps alike: {'yes' if d['census_same_across_workers'] else 'NO'}"
            if "peer" in setups
            else ""
        )
    )
    for c, v in d["census_check"].items():
        if not v["same_as_plain"]:
            d["notes"].append(f"{c}: its step's model matmuls differ from a plain step's: {v['first_difference']}")
    counts: dict[str, int] = {}
    for o in census:
        key = f"{o['pass']} {o['kind']}"
        counts[key] = counts.get(key, 0) + 1
    d["matmuls_per_step"] = counts


def _faults(d: dict[str, Any], workers: dict[str, Worker], plan: dict[str, list[dict[str, Any]]], dtype: str) -> None:
    """Every planned fault, one step each, under every configuration of every worker."""
    for k, w in workers.items():
        for config in WORKER_CONFIGS[k]:
            rows: list[dict[str, Any]] = []
            t0 = time.perf_counter()
            for cls in CLASSES:
                rows += w.call("faults", dtype=dtype, config=config, faults=plan[cls])
                s = [r for r in rows if r["cls"] == cls]
                log(f"{dtype} {config} {cls}: {sum(1 for r in s if r['alarms'])}/{len(s)} detected")
            d["faults"][config] = rows
            d.setdefault("seconds", {})[f"faults {config}"] = round(time.perf_counter() - t0, 1)


def _compare_records(d: dict[str, Any]) -> None:
    """The same faults on both sides: op, element and bits of every record."""
    mism = 0
    ref = {(r["cls"], r["i"]): r["record"] for r in d["faults"]["ours"]}
    keys = ("index", "op", "out", "element", "old_bits", "new_bits", "tile", "changed")
    for config in WORKER_CONFIGS["peer"]:
        for r in d["faults"][config]:
            a, b = ref[(r["cls"], r["i"])], r["record"]
            if any(a.get(x) != b.get(x) for x in keys) or (a.get("fault") != b.get("fault")):
                mism += 1
    d["records_differing_between_workers"] = mism
    total = len(d["faults"]["ours"]) * 2
    d["notes"].append(
        f"identical faults on both sides: {total - mism} of {total} peer fault records equal ours (op, element, "
        "old and new bits)"
        if mism
        else f"identical faults on both sides: all {total} peer fault records equal ours (op number, element, old "
        "and new bits)"
    )


def _clean(d: dict[str, Any], workers: dict[str, Worker], dtype: str, steps: int) -> None:
    """False alarms: ``steps`` clean training steps under every configuration, in chunks of 50."""
    for k, w in workers.items():
        for config in WORKER_CONFIGS[k]:
            t0 = time.perf_counter()
            total: dict[str, Any] | None = None
            left = steps
            while left > 0:
                chunk = min(50, left)
                part = w.call("clean", dtype=dtype, config=config, steps=chunk)
                left -= chunk
                if total is None:
                    total = part
                else:
                    for x in _TALLIES:
                        total[x] += part[x]
                    total["first_alarms"] = (total["first_alarms"] + part["first_alarms"])[:5]
                    for x in ("max_z_seen", "warnings"):
                        if x in part:
                            total[x] = part[x]
                log(f"{dtype} {config} clean: {total['steps']} steps, {total['alarm_steps']} with alarms")
            d["clean"][config] = total
            d.setdefault("seconds", {})[f"clean {config}"] = round(time.perf_counter() - t0, 1)


def _timing(
    d: dict[str, Any], workers: dict[str, Worker], dtype: str, rounds: int, round_steps: int
) -> tuple[dict[str, dict[str, list[float]]], dict[str, list[dict[str, float]]]]:
    """Interleaved rounds of step times: (every step time per worker and configuration, each round's medians)."""
    times: dict[str, dict[str, list[float]]] = {k: {} for k in workers}
    per_round: dict[str, list[dict[str, float]]] = {k: [] for k in workers}
    t0 = time.perf_counter()
    for r in range(rounds):
        order = list(workers)
        if r % 2:
            order.reverse()
        for k in order:
            got = workers[k].call("time", dtype=dtype, steps=round_steps, rotate=r)
            per_round[k].append({c: _median(v) for c, v in got.items()})
            for c, v in got.items():
                times[k].setdefault(c, []).extend(v)
        log(
            f"{dtype} timing round {r + 1}/{rounds}: "
            + "; ".join(f"{c} {1000 * m:.0f} ms" for k in order for c, m in per_round[k][-1].items())
        )
    d.setdefault("seconds", {})["timing"] = round(time.perf_counter() - t0, 1)
    d["step_times_s"] = times
    return times, per_round


def _cost(
    res: dict[str, Any],
    workers: dict[str, Worker],
    times: dict[str, dict[str, list[float]]],
    per_round: dict[str, list[dict[str, float]]],
) -> dict[str, Any]:
    """Each configuration's cost against the same worker's plain steps, every step and at its default sampling."""
    cost: dict[str, Any] = {}
    for k in workers:
        plain = _median(times[k]["plain"])
        every = res[f"{k}_info"]["defaults"]["every" if k == "peer" else "checksum_every"]
        for config in WORKER_CONFIGS[k]:
            checked = _median(times[k][config])
            idle_of = "peer-linear-idle" if config == "peer-linear" else "plain"
            idle = _median(times[k][idle_of])
            # paired: each round's checked steps against the same round's plain steps (the load on a shared
            # machine moves between rounds more than within one)
            rounds = [pr[config] / pr["plain"] for pr in per_round[k]]
            cost_idle = _median([pr[idle_of] / pr["plain"] for pr in per_round[k]])
            defaults = [(pr[config] + (every - 1) * pr[idle_of]) / every / pr["plain"] for pr in per_round[k]]
            cost[config] = {
                "ms": 1000 * checked,
                "plain_ms": 1000 * plain,
                "ratio": _median(rounds),
                "rounds": rounds,
                "round_min": min(rounds),
                "round_max": max(rounds),
                "idle_ms": 1000 * idle,
                "idle_ratio": cost_idle,
                "default_every": every,
                "default_ratio": _median(defaults),
                "default_label": f"{'checksum_every' if k == 'ours' else 'every'}={every}"
                + (f"; an unchecked protected step {cost_idle:.2f}x" if config == "peer-linear" else ""),
            }
    return cost


def _peer_notes(d: dict[str, Any], res: dict[str, Any], workers: dict[str, Worker], dtype: str) -> None:
    """What the peer checked (nothing in fp32) and which of its own matmuls were left unnumbered."""
    if "peer" not in workers:
        return
    cc = d["census_check"]
    for c in WORKER_CONFIGS["peer"]:
        ch = cc[c]["checks"]
        if not ch.get("checked"):
            what = (
                f"its dispatch mode saw {ch.get('run')} matmuls and skipped {ch.get('skipped_dtype')} for their dtype"
                if c == "peer-all"
                else "protect() ran every layer's plain forward (its fast mode takes over bf16/fp16 "
                "layers only: `dt not in UNIT_ROUNDOFF`, 'fp32/TF32: not checked')"
            )
            d["notes"].append(
                f"{c} in {dtype}: checked 0 matmuls per step: the peer checks bf16/fp16 outputs only "
                f"(checksum.UNIT_ROUNDOFF = {res['peer_info'].get('checked_dtypes')}); {what}. It runs "
                "on the CPU without error (no Triton: its torch fallback), it just has nothing to check."
            )
    if cc.get("peer-linear", {}).get("foreign"):
        d["notes"].append(
            f"peer-linear: {cc['peer-linear']['foreign']} matmuls per step issued by the "
            "peer's own checks at the model's level were left unnumbered (skip_files); "
            "the numbered list equals a plain step's: "
            f"{cc['peer-linear']['same_as_plain']}"
        )
