"""The guard on tensor-parallel meshes (``ColwiseParallel``/``RowwiseParallel`` over ``tp``, FSDP2 over ``dp``, HSDP
over ``dp_replicate``), over gloo: clean steps commit and train bit for bit as the unguarded run; a fault is vetoed at
its step on every rank of the mesh; with a third opinion of each shard the faulty rank is named alone, whether the fault
stayed in one TP rank's weight gradient or crossed the TP collectives (the ranks' contributions to them, traced on
sampled steps, show whose went wrong first), never the innocent partner alone; with two replicas of a shard every
incident holds the faulty rank.

CI runs one cell per setup (``test_one_cell_per_setup``); ``pytest -m matrix`` runs the whole matrix.
"""

from __future__ import annotations

from typing import Any

import pytest

from sdcguard.testing import run_ranks
from tests._tensor_parallel import job

pytestmark = pytest.mark.distributed

STEPS, AT, FAULTY = 4, 2, 1
"""Steps per run, the step a fault strikes, the faulty global rank (tp coordinate 1 of the first TP group)."""

SETUPS = {"tp2": (1, 2, False), "dp2_tp2": (2, 2, False), "dp3_tp2": (3, 2, False), "hsdp2x2_tp2": (4, 2, True)}
"""name -> (data-parallel size, tensor-parallel size, HSDP: dp as dp_replicate=dp/2 x dp_shard=2)."""
FAULTS = ("forward-sticky", "forward-once", "dw-sticky", "dw-once", "weight")


def _run(setup: str, fault: str | None, **options: Any) -> list[dict[str, Any]]:
    dp, tp, hsdp = SETUPS[setup]
    spec = None
    if fault is not None:
        kind, _, timing = fault.partition("-")
        spec = {"kind": kind, "rank": FAULTY, "step": AT, "times": 1 if timing == "once" else None}
    return run_ranks(job, dp * tp, dp, tp, True, spec, STEPS, {"hsdp": hsdp, **options}, timeout=280)


def _tp_group(setup: str, rank: int) -> tuple[int, ...]:
    _, tp, _ = SETUPS[setup]
    first = rank - rank % tp
    return tuple(range(first, first + tp))


def _check(setup: str, fault: str, results: list[dict[str, Any]]) -> None:
    dp, tp, _ = SETUPS[setup]
    seen = [r["seen"] for r in results]
    assert all(s == seen[0] for s in seen), "every rank saw the same steps"
    steps = seen[0]
    assert all(e["commit"] and not e["incidents"] and not e["weights"] for e in steps[:AT]), steps
    assert not steps[AT]["commit"], f"the faulty step was committed: {steps[AT]}"
    named = [i for e in steps for i in e["incidents"] + e["weights"] if i[1] == AT]
    assert named, steps
    assert all(FAULTY in suspects for _, _, suspects in named), named  # the faulty rank is in every incident
    if dp >= 3 and fault != "weight":  # a third opinion: that rank alone, in its shard or past the TP collectives
        assert {(k, s) for k, _, s in named} == {("replay", (FAULTY,))}, named
    if fault == "weight":  # its own shard changed in memory: named alone, replicas or not, and never every rank
        assert ("memory", (FAULTY,)) in {(k, s) for k, _, s in named}, named
        assert {s for _, _, s in named} == {(FAULTY,)}, named
    partner = [r for r in _tp_group(setup, FAULTY) if r != FAULTY]
    assert not any(s == tuple(partner) for _, _, s in named), "the innocent TP partner was named alone"


def _clean(setup: str) -> None:
    dp, tp, hsdp = SETUPS[setup]
    guarded = _run(setup, None, checksum_every=1)
    plain = run_ranks(job, dp * tp, dp, tp, False, None, STEPS, {"hsdp": hsdp}, timeout=280)
    for g, p in zip(guarded, plain, strict=True):
        assert all(e["commit"] and not e["incidents"] and not e["weights"] for e in g["seen"]), g["seen"]
        assert all(e["checks"][-2:] == ("replay", "checksum") and e["run"] == e["checked"] > 0 for e in g["seen"])
        assert g["fingerprints"] == p["fingerprints"], "the guarded run trained differently"


@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    ("setup", "fault"),
    [("tp2", None), ("dp2_tp2", "dw-sticky"), ("dp3_tp2", "forward-sticky"), ("hsdp2x2_tp2", "weight")],
)
def test_one_cell_per_setup(setup: str, fault: str | None) -> None:
    if fault is None:
        _clean(setup)
    else:
        _check(setup, fault, _run(setup, fault))


@pytest.mark.slow
@pytest.mark.matrix
@pytest.mark.timeout(600)
@pytest.mark.parametrize("setup", [s for s in SETUPS if s != "tp2"])
def test_clean_steps_commit_and_train_as_unguarded(setup: str) -> None:
    _clean(setup)


@pytest.mark.slow
@pytest.mark.matrix
@pytest.mark.timeout(600)
@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("setup", [s for s in SETUPS if s != "tp2"])
def test_a_fault_is_vetoed_everywhere_and_the_faulty_rank_is_in_every_incident(setup: str, fault: str) -> None:
    _check(setup, fault, _run(setup, fault))


@pytest.mark.timeout(300)
def test_tensor_parallel_alone_the_checksums_name_the_rank_of_a_sticky_matmul_fault() -> None:
    """TP=2 with no data parallelism: no other replica of a shard, so a replay is a same-device rerun (it sees
    one-off faults only: the injector strikes the step's first forward, so the rerun differs and its TP group is
    unresolved); the matmul checksums are local, so they name the rank whose matmul failed."""
    steps = _run("tp2", "forward-sticky", checksum_every=1)[0]["seen"]
    assert not steps[AT]["commit"]
    named = [(k, s) for k, st, s in steps[AT]["incidents"] if st == AT]
    assert ("checksum", (FAULTY,)) in named and all(FAULTY in s for _, s in named), named


def _without_fsdp(rank: int, world: int) -> str:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    from sdcguard import SDCGuard
    from sdcguard.errors import BadInput
    from tests._tensor_parallel import TPNet, loss_fn

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    model = TPNet()
    parallelize_module(model, mesh["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel()})
    try:
        SDCGuard(model, loss_fn)
    except BadInput as e:
        return str(e)
    return "accepted"


@pytest.mark.timeout(200)
def test_a_tensor_parallel_model_with_data_parallelism_but_no_fsdp_is_refused_in_one_line() -> None:
    """The guard used to wrap it in DDP, which cannot broadcast DTensor parameters: refused on every rank alike."""
    said = run_ranks(_without_fsdp, 4, timeout=180)
    assert len(set(said)) == 1 and "needs FSDP2 over the data-parallel dimension" in said[0] and "\n" not in said[0]


@pytest.mark.timeout(300)
def test_sequence_parallel_norms_and_loss_parallel_train_as_unguarded_and_a_fault_names_its_rank() -> None:
    """torchtitan's block plan (SequenceParallel norms, a vocabulary-parallel head under ``loss_parallel``): with
    ``train_context=loss_parallel`` the replays run where the step does; the norms' gradients stay ``Partial`` until
    the optimizer reduces them, so they are left to replay; clean steps commit, bit-identical to the unguarded run,
    and a one-off fault in rank 1's forward is vetoed, naming rank 1 alone: it crossed the TP collectives, and the
    traces of the original and the reruns show rank 1's contribution differed first."""
    from tests._tensor_parallel import sequence_parallel_job

    guarded = run_ranks(sequence_parallel_job, 2, True, None, 3, timeout=280)
    plain = run_ranks(sequence_parallel_job, 2, False, None, 3, timeout=280)
    assert all(commit and checked and not incidents for r in guarded for commit, _, checked, incidents in r["seen"])
    assert [r["fingerprints"] for r in guarded] == [r["fingerprints"] for r in plain]
    faulty = run_ranks(sequence_parallel_job, 2, True, 1, 3, timeout=280)
    assert faulty[0]["seen"] == faulty[1]["seen"]
    commit, _, _, incidents = faulty[0]["seen"][1]
    assert not commit and incidents and all(s == (1,) for _, _, s in incidents), incidents
