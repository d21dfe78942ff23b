"""lm-resiliency 0.2.0's fault kit, its gradient cases, against the guard over gloo (DDP), scored by the kit's own
scorer. Not run in CI; lm-resiliency is not a dependency (``pip install lm-resiliency==0.2.0`` into a virtual
environment first).

    python benchmarks/kit_gradient.py [defaults | REPLAY_EVERY] [WORLD] [MICRO_BATCHES]

Every gradient fault the kit injects on CPU (``tensor_corruption`` by single and multi bit flip, set value, scale,
noise and sign flip; ``drop``; ``reorder``; ``stale_state``; ``duplicate``), one-off (one matching call) and sticky
(three iterations), on ``blocks.0.fc1.weight`` of rank 1 of a tiny transformer under DDP, five steps apart. The kit
registers its ``param.register_hook`` after the guard's (``enable_fault_injection`` after ``SDCGuard``); its
iteration is the optimizer step, called on vetoed steps too (their gradients are None: the weights do not move).
Each occurrence is scored by ``FaultInjectionSession.evaluate`` with the guard's incidents from its onset step to
three steps after as one ``LocalizationResult`` (``kind="sdc"``, the kit's category for a corruption). Prints one
line per occurrence and the totals."""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path[:0] = [str(Path(__file__).resolve().parents[1])]

from sdcguard import SDCGuard  # noqa: E402
from sdcguard.testing import run_ranks  # noqa: E402
from sdcguard.testing.models import TinyTransformer, lm_loss, make_batch  # noqa: E402

SEQ = 4
FAULTY = 1
SPACING = 5
KINDS: list[tuple[str, dict[str, Any]]] = [
    ("tensor_corruption", {"operation": "single_bitflip"}),
    ("tensor_corruption", {"operation": "multi_bitflip"}),
    ("tensor_corruption", {"operation": "set_value", "value": 7.0}),
    ("tensor_corruption", {"operation": "scale", "factor": 2.0}),
    ("tensor_corruption", {"operation": "noise"}),
    ("tensor_corruption", {"operation": "sign_flip"}),
    ("drop", {}),
    ("reorder", {}),
    ("stale_state", {}),
    ("duplicate", {}),
]


def _campaign(param: str) -> Any:
    from lm_resiliency.fault_injection import (
        FaultCampaign,
        FaultIncident,
        FaultSpec,
        FaultTarget,
        IncidentLifetime,
        IncidentTrigger,
    )

    incidents = []
    at = 3
    for timing in ("oneoff", "sticky"):
        for kind, params in KINDS:
            name = f"{kind}-{params.get('operation', '')}-{timing}".replace("--", "-")
            lifetime = IncidentLifetime(matching_calls=1) if timing == "oneoff" else IncidentLifetime(iterations=3)
            incidents.append(
                FaultIncident(
                    incident_id=name,
                    trigger=IncidentTrigger(at=(at,)),
                    lifetime=lifetime,
                    faults=(
                        FaultSpec(
                            fault_id=name,
                            type=kind,
                            target=FaultTarget(surface="gradient", rank=FAULTY, module_path=param.rpartition(".")[0]),
                            parameters={**params, "parameter": param.rpartition(".")[2]},
                        ),
                    ),
                )
            )
            at += SPACING
    return FaultCampaign(name="sdcguard-gradient", incidents=tuple(incidents), seed=0), at + 2


def job(rank: int, world: int, replay_every: int | None, micro: int) -> dict[str, Any]:
    from lm_resiliency.fault_injection import enable_fault_injection

    warnings.filterwarnings("ignore")
    torch.manual_seed(0)
    model = TinyTransformer(d=8, heads=2, seq=SEQ, layers=1)
    param = "blocks.0.fc1.weight"
    guard = SDCGuard(DDP(model), lm_loss, replay_every=replay_every, escalate="off", slow=None)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    campaign, steps = _campaign(param)
    session = enable_fault_injection(model, opt, campaign=campaign)  # registers its hooks after the guard's
    torch.manual_seed(100 + rank)
    found: list[tuple[int, str, tuple[int, ...], bool]] = []
    commits = []
    for step in range(steps):
        report = guard.step(step, micro_batches=[make_batch(step, rank * micro + i, seq=SEQ) for i in range(micro)])
        commits.append(report.commit)
        found += [(i.step, i.kind, tuple(i.suspect_ranks), report.commit) for i in report.incidents]
        opt.step()  # a vetoed step's gradients are None: the kit's iteration advances, the weights do not
        opt.zero_grad(set_to_none=True)
        found += [(i.step, i.kind, tuple(i.suspect_ranks), True) for i in guard.after_optimizer_step()]
    guard.close()
    results = []
    records = [r for r in session.records if r.execution_rank == rank]
    by_occurrence: dict[str, list[int]] = {}
    for r in records:
        by_occurrence.setdefault(r.occurrence_id, []).append(r.iteration - 1)  # the kit counts from 1
    for occurrence, its_steps in by_occurrence.items():
        onset = min(its_steps)
        seen = [f for f in found if onset <= f[0] <= onset + 3]
        results.append(
            {
                "occurrence_id": occurrence,
                "detected": bool(seen),
                "failed_ranks": sorted({r for f in seen for r in f[2]}),
                "kind": ("straggler" if seen[0][1] == "slow" else "sdc") if seen else None,  # the kit's categories
                "metadata": {
                    "steps_to_detection": seen[0][0] - onset if seen else None,
                    "guard_kinds": sorted({f[1] for f in seen}),
                },
            }
        )
    out: dict[str, Any] = {"rank": rank}
    if records:
        report = session.evaluate(results)
        evals = {e.occurrence_id: e for e in report.evaluations}
        rows = []
        for r in records:
            e = evals[r.occurrence_id]
            res = next(x for x in results if x["occurrence_id"] == r.occurrence_id)
            vetoed = not commits[r.iteration - 1]
            rows.append(
                (
                    r.incident_id,
                    r.iteration - 1,
                    r.status.value,
                    e.injection_succeeded,
                    e.detected,
                    e.localized,
                    e.reported_ranks,
                    res["metadata"]["steps_to_detection"],
                    vetoed,
                    res["metadata"]["guard_kinds"],
                )
            )
        out["rows"] = rows
    session.close()
    return out


if __name__ == "__main__":
    every = None if sys.argv[1] == "defaults" else int(sys.argv[1])
    world = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    micro = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    res = run_ranks(job, world, every, micro, timeout=1200)
    rows = res[FAULTY]["rows"]
    print(f"lm-resiliency 0.2.0 gradient cases, {world} ranks, {micro} micro-batch(es), replay_every={sys.argv[1]}")
    print("occurrence | onset step | injection | detected | localized | named | steps to detection | vetoed | kinds")
    for r in rows:
        print(" | ".join(str(x) for x in (r[0], r[1], r[2], r[4], r[5], r[6], r[7], r[8], ",".join(r[9]))))
    total = len(rows)
    print(
        f"injected {sum(r[3] for r in rows)}/{total}, detected {sum(r[4] for r in rows)}/{total}, localized (the "
        f"kit's scorer) {sum(r[5] for r in rows)}/{total}, vetoed {sum(r[8] for r in rows)}/{total}"
    )
    print(json.dumps(rows, default=str))
