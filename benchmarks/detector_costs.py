"""What each detector of the detection campaign costs the workers: sdcguard at the campaign's settings, Megatron-LM's
shipped checks and same-device replay, next to the same DDP step without any, measured in one run (the table of
``docs/detection.md``; ``benchmarks/replay_overhead.py`` is the guard's own cost study: adapters, FSDP2, a
communication-bound model).

One launch (``--workers`` DDP workers + 1 dedicated shadow, gloo, CPU), configurations interleaved in rounds so
machine noise hits them alike:

- ``plain``: DDP forward + backward + SGD step, nothing else (the baseline);
- ``fwd+bwd``: forward and backward alone, no communication (the unit of a replay);
- ``checks``: ``SDCGuard(replay_every=0)``: the every-step cross-replica gradient check alone;
- ``peer10`` / ``peer1``: ``SDCGuard(replay_every=10)`` and ``SDCGuard(replay_every=1, weight_check_every=1)``;
- ``sum1``: ``SDCGuard(replay_every=0, checksum_every=1)``: the matmul checksum checks on every step (the cost of a
  checked step); every other guard here runs with ``checksum_every=0``, so each check's cost stands apart, and the
  defaults' checksum share (one checked step in ``checksum_every``) is derived from ``sum1`` and ``checks``;
- ``shadow1``: continuous verification: ``SDCGuard(replay_every=1, shadows=[the last rank])``; and, in a second
  phase against its own no-guard steps, ``shadow10`` (``replay_every=10``);
- ``megatron``: Megatron-LM's per-step checks (local loss NaN/Inf and spike, each DDP bucket's local gradient norm
  NaN/Inf and spike, through a comm hook) and its weight hash (sha1 of every parameter on the host, all-gathered),
  timed on its own and amortized over its interval;
- ``same_device``: the whole step run a second time on the same device and compared.

Guarded steps are driven by the guard's four public calls, so the time inside the guard's own work (``end_step``:
checks, replays, exchanges; ``after_optimizer_step``: the weight check) is read from the outside. Sampled-step
costs are linear in ``1 / replay_every``: the default ``replay_every=50`` is derived from ``checks`` and ``peer1``
(the extra cost of a sampled step, over 50) and printed as such; ``peer10`` is measured and is also derived the same
way, as a check of that derivation. Run::

    python benchmarks/detector_costs.py [--workers 2] [--rounds 6] [--steps 10] [--json FILE]
    python benchmarks/detector_costs.py --render FILE.json [--json FILE]   # summarise a saved run again

The default model (d=256, 4 layers, 128 tokens, ~0.5 s steps here) is sized so that the step is long against a
collective's latency (a small gloo collective takes 1-2 ms on a 2-core VM running 3 processes). On a machine with
fewer cores than processes the shadow competes with the workers for CPU (it runs at the lowest priority here); on a
real cluster it has its own device.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from sdcguard.training.config import DEFAULT_CHECKSUM_EVERY  # noqa: E402

NAMES = ("plain", "fwd+bwd", "checks", "peer10", "peer1", "sum1", "shadow1", "megatron", "same_device")
SECOND = ("plain2", "shadow10")
"""A second phase (the shadow serves one guard at a time): a dedicated shadow sampling one step in ten, against
its own no-guard steps."""
HASH_INTERVAL = 20_000


class _Rank:
    def __init__(self, rank: int, args: argparse.Namespace, roles: Any) -> None:
        import torch
        from torch.nn.parallel import DistributedDataParallel as DDP

        from benchmarks.campaign.baselines import BucketTap, MegatronChecks
        from sdcguard import SDCGuard
        from sdcguard.testing.models import TinyTransformer, lm_loss

        self.rank, self.args, self.group, self.loss_fn = rank, args, roles.dp_group, lm_loss
        size = {"d": args.d, "heads": 4, "layers": args.layers, "seq": args.seq, "p": 0.1}

        def fresh() -> Any:
            torch.manual_seed(0)
            return TinyTransformer(**size)

        self.modules = {n: fresh() for n in (*NAMES, *SECOND)}
        self.roles = roles
        group = self.group
        self.guards = {
            "shadow1": SDCGuard(
                DDP(self.modules["shadow1"], process_group=group),
                lm_loss,
                group=group,
                replay_every=1,
                shadows=list(roles.shadows),
                checksum_every=0,
            ),
            "checks": SDCGuard(
                DDP(self.modules["checks"], process_group=group), lm_loss, group=group, replay_every=0, checksum_every=0
            ),
            "peer10": SDCGuard(
                DDP(self.modules["peer10"], process_group=group),
                lm_loss,
                group=group,
                replay_every=10,
                checksum_every=0,
            ),
            "peer1": SDCGuard(
                DDP(self.modules["peer1"], process_group=group),
                lm_loss,
                group=group,
                replay_every=1,
                weight_check_every=1,
                checksum_every=0,
            ),
            "sum1": SDCGuard(
                DDP(self.modules["sum1"], process_group=group), lm_loss, group=group, replay_every=0, checksum_every=1
            ),
        }
        self.ddp = {
            n: DDP(self.modules[n], process_group=group) for n in ("plain", "plain2", "megatron", "same_device")
        }
        self.taps = {n: BucketTap() for n in ("megatron", "same_device")}
        for n, tap in self.taps.items():
            self.ddp[n].register_comm_hook(group, tap)
        self.megatron = MegatronChecks()
        self.opts = {n: torch.optim.SGD(m.parameters(), lr=1e-3) for n, m in self.modules.items()}
        self.inside = {n: {"end_step": 0.0, "after_optimizer_step": 0.0, "checks": 0.0} for n in (*NAMES, *SECOND)}
        self.matmuls: dict[str, list[int]] = {}
        """Configuration -> its last checked step's matmuls: checked, unverifiable, run."""
        self.timing = False

    def second_phase(self) -> None:
        """Close the continuous shadow's guard (the shadow then serves the next one) and build the second."""
        from torch.nn.parallel import DistributedDataParallel as DDP

        from sdcguard import SDCGuard

        self.guards.pop("shadow1").close()
        self.guards["shadow10"] = SDCGuard(
            DDP(self.modules["shadow10"], process_group=self.group),
            self.loss_fn,
            group=self.group,
            replay_every=10,
            shadows=list(self.roles.shadows),
            checksum_every=0,
        )

    def _timed(self, name: str, part: str, fn: Any, *a: Any, **k: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            if self.timing:
                self.inside[name][part] += time.perf_counter() - t0

    def run(self, name: str, step: int) -> None:
        import torch

        from benchmarks.campaign.baselines import bucket_norms, rerun_step
        from sdcguard.testing.models import make_batch

        batch = make_batch(step, self.rank, batch=self.args.batch, seq=self.args.seq)
        if name == "fwd+bwd":
            loss = self.loss_fn(self.modules[name], batch)
            torch.autograd.grad(loss, list(self.modules[name].parameters()))
            return
        if name in self.guards:
            g = self.guards[name]
            g.begin_step(step)
            g.before_forward(batch)
            loss = self.loss_fn(g.model, batch)
            g.observe_loss(loss)
            loss.backward()
            report = self._timed(name, "end_step", g.end_step, loss=loss.detach())
            if not report.commit:
                raise RuntimeError(f"{name}: unexpected veto at step {step}: {report.incidents}")
            if "checksum" in report.checks:  # what a checked step covered: checked, unverifiable, run
                self.matmuls[name] = [report.matmuls_checked, report.matmuls_unverifiable, report.matmuls_run]
        else:
            tap = self.taps.get(name)
            rng = torch.get_rng_state()
            if tap is not None:
                tap.keep = True
            loss = self.loss_fn(self.ddp[name], batch)
            loss.backward()
            if name == "megatron":
                local = tap.take()
                self._timed(name, "checks", self.megatron.check, float(loss.detach()), bucket_norms(local))
            elif name == "same_device":
                local = tap.take()
                params = list(self.modules[name].parameters())
                reduced = [p.grad.clone() for p in params]
                self._timed(
                    name,
                    "checks",
                    rerun_step,
                    self.ddp[name],
                    params,
                    self.loss_fn,
                    batch,
                    rng,
                    tap,
                    loss=loss,
                    local=local,
                    reduced=reduced,
                )
        self.opts[name].step()
        self.opts[name].zero_grad(set_to_none=True)
        if name in self.guards:
            self._timed(name, "after_optimizer_step", self.guards[name].after_optimizer_step)

    def hash_seconds(self) -> float:
        """One Megatron weight-hash check (sha1 of every parameter on the host, all-gathered), in seconds."""
        import torch.distributed as dist

        from benchmarks.campaign.baselines import param_hash_mismatch

        dist.barrier(group=self.group)
        t0 = time.perf_counter()
        param_hash_mismatch(self.modules["megatron"], self.group)
        return time.perf_counter() - t0


def _rank_main(rank: int, world: int, store_path: str, args: argparse.Namespace, queue: Any) -> None:
    import torch
    import torch.distributed as dist

    from sdcguard import SDCGuard, plan_roles
    from sdcguard.testing.models import TinyTransformer, lm_loss

    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=rank, world_size=world)
    roles = plan_roles(1)
    if roles.role == "shadow":
        os.nice(19)  # spare cycles only: on a real cluster the shadow has a device of its own
        for every in (1, 10):  # one guard per phase, built collectively with the workers' guard
            torch.manual_seed(0)
            model = TinyTransformer(d=args.d, heads=4, layers=args.layers, seq=args.seq, p=0.1)
            SDCGuard(
                model, lm_loss, group=roles.dp_group, replay_every=every, shadows=list(roles.shadows), checksum_every=0
            ).serve()
        dist.destroy_process_group()
        return
    r = _Rank(rank, args, roles)
    times: dict[str, list[float]] = {n: [] for n in (*NAMES, *SECOND)}
    step = dict.fromkeys((*NAMES, *SECOND), 0)
    first = tuple(n for n in NAMES if n in args.configs)
    for names in (first, SECOND):
        if names is SECOND:
            r.second_phase()
        for rnd in range(args.rounds + 1):  # round 0 warms up
            r.timing = rnd > 0
            for name in names:
                dist.barrier(group=r.group)
                t0 = time.perf_counter()
                for _ in range(args.steps):
                    r.run(name, step[name])
                    step[name] += 1
                dist.barrier(group=r.group)
                if rnd:
                    times[name].append((time.perf_counter() - t0) / args.steps)
    hashes = [r.hash_seconds() for _ in range(3)]
    r.guards["shadow10"].close()
    if rank == 0:
        steps = args.rounds * args.steps
        inside = {n: {k: v / steps for k, v in d.items()} for n, d in r.inside.items()}
        queue.put({"times": times, "inside": inside, "hash_s": statistics.median(hashes), "matmuls": r.matmuls})
    dist.destroy_process_group()


def _ratio(times: dict[str, list[float]], name: str, ref: str = "plain") -> tuple[float, float, float]:
    """Median and quartiles over rounds of (name / ref - 1), paired per round (the machine's load drifts)."""
    r = sorted(a / b - 1 for a, b in zip(times[name], times[ref]))
    q = statistics.quantiles(r, n=4) if len(r) > 1 else [r[0], r[0], r[0]]
    return statistics.median(r), q[0], q[2]


def summarise(res: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    times, inside = res["times"], res["inside"]
    base = statistics.median(times["plain"])
    ran = [n for n in NAMES if times[n]]
    own = {n: sum(inside[n].values()) / base for n in (*ran, *SECOND)}
    step = {n: _ratio(times, n) for n in ran if n != "plain"}
    step["shadow10"] = _ratio(times, "shadow10", "plain2")
    hash_share = res["hash_s"] / base
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    out = {
        "config": config,
        "base_step_s": base,
        "step": step,
        "own": own,
        "hash_s": res["hash_s"],
        "hash_share_per_check": hash_share,
        "matmuls": res.get("matmuls", {}),
    }
    if not {"fwd+bwd", "peer1", "peer10", "sum1", "shadow1", "megatron", "same_device"} <= set(ran):
        return out
    out["fwd_bwd_share"] = statistics.median(times["fwd+bwd"]) / base
    # a sampled step's extra cost, linear in 1 / replay_every: from peer1 (every step sampled) and checks (none)
    replay_extra = (inside["peer1"]["end_step"] - inside["checks"]["end_step"]) / base
    weight_check = inside["peer1"]["after_optimizer_step"] / base
    sampled_extra = step["peer1"][0] - step["checks"][0]

    def derived(every: int) -> dict[str, float]:
        return {
            "own": own["checks"] + replay_extra / every + weight_check / 100,
            "step": step["checks"][0] + sampled_extra / every,
        }

    out["derived_50"], out["derived_10"] = derived(50), derived(10)
    out.update(derive_checksums(out))
    out["text"] = texts(out, args.workers)
    return out


def derive_checksums(out: dict[str, Any]) -> dict[str, dict[str, float]]:
    """What one checked step adds over the same guard without checksums (``checksum_step``: every matmul checked),
    and the defaults and ``checksum_every=1`` derived from it and ``derived_50`` (step time and own work)."""
    step, own, d50 = out["step"], out["own"], out["derived_50"]
    every = DEFAULT_CHECKSUM_EVERY
    # the checksums run inside the forward and backward, not inside end_step: their own work is their step time
    sums = {"step": step["sum1"][0] - step["checks"][0]}
    sums["own"] = sums["step"] + own["sum1"] - own["checks"]
    return {
        "checksum_step": sums,
        "derived_defaults": {k: d50[k] + sums[k] / every for k in ("step", "own")},
        "derived_checksum1": {k: d50[k] + sums[k] for k in ("step", "own")},
    }


def texts(out: dict[str, Any], workers: int) -> dict[str, str]:
    """The cost cells of ``docs/detection.md``'s table, from the figures :func:`summarise` measured and
    :func:`derive_checksums` derived (``--render`` re-derives them from a saved ``--json``)."""
    step, own, d50, hash_share = out["step"], out["own"], out["derived_50"], out["hash_share_per_check"]
    every = DEFAULT_CHECKSUM_EVERY
    sums, defaults, checksum1 = out["checksum_step"], out["derived_defaults"], out["derived_checksum1"]
    m = out.get("matmuls", {}).get("sum1")
    counted = f"; of {m[2]} matmuls a step, {m[0]} checked, {m[1]} unverifiable" if m else ""
    return {
        "defaults": f"{defaults['step']:+.1%} step, {defaults['own']:.1%} own work (derived: replay and checks "
        f"{d50['step']:+.1%} step, {d50['own']:.1%} own work; the checksums "
        f"{sums['step'] / every:+.1%} at `checksum_every={every}`, their step time{counted})",
        "replay_only": f"{d50['step']:+.1%} step, {d50['own']:.1%} own work (derived)",
        "checksum1": f"{checksum1['step']:+.1%} step, {checksum1['own']:.1%} own work (derived: a checked step "
        f"{sums['step']:+.1%}{counted})",
        "replay10": f"{step['peer10'][0]:+.1%} step, {own['peer10']:.1%} own work",
        "continuous": f"{step['shadow1'][0]:+.0%} step, {own['shadow1']:.0%} own work, + 1 shadow device per "
        f"{workers} workers (measured here with the shadow on the workers' cores)",
        "every_step": f"{step['peer1'][0]:+.1%} step, {own['peer1']:.1%} own work",
        "megatron": f"{step['megatron'][0]:+.1%} step, {own['megatron']:.1%} own work; hash {hash_share:.0%} of a "
        f"step per check ({hash_share / HASH_INTERVAL:.4%} at 20,000)",
        "megatron10": f"hash {hash_share:.0%} of a step per check: {hash_share / 10:.1%} at 10",
        "same_device": f"{step['same_device'][0]:+.1%} step, {own['same_device']:.0%} own work",
    }


def report(s: dict[str, Any]) -> str:
    c = s["config"]
    lines = [
        f"workers={c['workers']} + 1 shadow, model d={c['d']} layers={c['layers']} seq={c['seq']} "
        f"batch={c['batch']}, threads/process={c['threads']}, {c['rounds']} rounds x {c['steps']} steps; "
        f"no-guard step {s['base_step_s'] * 1e3:.1f} ms",
        f"{'configuration':<14}{'step vs plain (median of rounds, IQR)':>40}{'own work':>12}",
    ]
    for n, (m, lo, hi) in s["step"].items():
        lines.append(f"{n:<14}{m:>+20.1%}  [{lo:+.1%}, {hi:+.1%}]{'':>6}{s['own'].get(n, 0.0):>10.2%}")
    for every in (50, 10):
        d = s.get(f"derived_{every}")
        if d is None:
            continue
        lines.append(
            f"derived replay_every={every:<3} (checks + (peer1 - checks) / {every}): step {d['step']:+.1%}, "
            f"own work {d['own']:.2%}"
        )
    for key, label in (
        ("derived_defaults", f"defaults (replay 50 + checksum_every={DEFAULT_CHECKSUM_EVERY})"),
        ("derived_checksum1", "replay 50 + checksum_every=1"),
    ):
        d = s.get(key)
        if d is not None:
            lines.append(f"derived {label}: step {d['step']:+.1%}, own work {d['own']:.2%}")
    for name, (checked, unverifiable, run) in s.get("matmuls", {}).items():
        lines.append(f"{name}: per checked step {checked} matmuls checked, {unverifiable} unverifiable, {run} run")
    lines.append(
        f"Megatron weight hash: {s['hash_s'] * 1e3:.1f} ms per check = {s['hash_share_per_check']:.1%} of a "
        f"step; amortized over 20,000 iterations {s['hash_share_per_check'] / HASH_INTERVAL:.5%}"
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=10, help="steps per configuration per round (multiple of 10)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    parser.add_argument("--d", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--json", type=Path, help="write the figures as JSON (benchmarks/detection.py --costs)")
    parser.add_argument(
        "--configs",
        default=",".join(NAMES),
        help="configurations of the first phase, comma-separated (plain and checks always run)",
    )
    parser.add_argument(
        "--render",
        type=Path,
        metavar="JSON",
        help="summarise an earlier run's --json again with this code (its raw times), and exit",
    )
    args = parser.parse_args()
    if args.render:
        saved = json.loads(args.render.read_text(encoding="utf-8"))
        s = summarise(saved["raw"], argparse.Namespace(**saved["config"]))
        s["date"], s["raw"] = saved.get("date"), saved["raw"]
        print(report(s))
        if args.json:
            args.json.write_text(json.dumps(s, indent=1) + "\n", encoding="utf-8")
        return
    args.configs = sorted({"plain", "checks", *args.configs.split(",")} & set(NAMES), key=NAMES.index)

    import torch.multiprocessing as mp

    world = args.workers + 1
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        procs = [
            ctx.Process(target=_rank_main, args=(r, world, os.path.join(tmp, "store"), args, queue))
            for r in range(world)
        ]
        for p in procs:
            p.start()
        try:
            res = queue.get(timeout=3600)
        finally:
            for p in procs:
                p.join(60)
                if p.is_alive():
                    p.kill()
    s = summarise(res, args)
    s["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    s["raw"] = res
    print(report(s))
    if args.json:
        args.json.write_text(json.dumps(s, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
