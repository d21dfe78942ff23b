"""Where each rule runs (a node's own store, the fleet's merged one), a bad golden file against a batch of devices
sharing one defect, and training incidents that name no device by majority (issue 17)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sdcguard.fleet.merge import merge_stores
from sdcguard.fleet.policy import apply_policy
from sdcguard.fleet.store.store import Store
from sdcguard.records import Incident
from tests._fleet import NOW, clean, result, scan

ROOT = Path(__file__).resolve().parents[2]
CASE = "alu.u32.chain"


@pytest.fixture()
def store(tmp_path: Path) -> Store:
    s = Store.open(tmp_path / "fleet.db")
    yield s
    s.close()


def _fleet(store: Store, n: int, failing: dict[str, dict], *, host: str = "node", first: int = 0) -> None:
    """``n`` devices (``sim:first`` on) each run ``CASE`` 200 times (all pass); ``failing[device]`` adds one
    failure with those keywords."""
    for i in range(first, first + n):
        d = f"sim:{i}"
        rows = clean(d, 200, t=NOW - 7200)
        rows = [r.__class__(**{**r.__dict__, "case": CASE, "family": "alu", "output_digest": "good"}) for r in rows]
        if d in failing:
            rows.append(result(d, passed=False, case=CASE, family="alu", t=NOW - 60, **failing[d]))
        scan(store, d, rows, host=host)


# ---------------------------------------------------------------------------------------------- node scope
def test_the_node_quarantines_a_sticky_failure_its_other_devices_passed(store: Store) -> None:
    _fleet(store, 4, {"sim:2": {"sticky": True}})
    out = apply_policy(store, now=NOW, scope="node")
    assert out.quarantined == ["sim:2"] and not out.breaker_tripped
    assert "sim:0 on the same node passed it" in out.reasons[0]


def test_the_node_leaves_what_it_cannot_judge_to_the_fleet(store: Store) -> None:
    # every device of the node fails the case identically and reproducibly: a bad golden file, or a node full
    # of one bad batch; the node cannot tell, so it neither quarantines nor trips anything
    _fleet(store, 4, {f"sim:{i}": {"sticky": True, "digest": "w" * 64} for i in range(4)})
    out = apply_policy(store, now=NOW, scope="node")
    assert out.quarantined == [] and not out.breaker_tripped and out.decisions == []
    # a device failing often but never reproducibly: the rate rule is the fleet's
    store2 = Store.open(store.path.with_name("other.db"))
    rows = [*clean("sim:9", 300, t=NOW - 7200), *[result("sim:9", passed=False, t=NOW - 10 - i) for i in range(5)]]
    scan(store2, "sim:9", rows)
    assert apply_policy(store2, now=NOW, scope="node").quarantined == []
    assert apply_policy(store2, now=NOW, scope="fleet").quarantined == ["sim:9"]
    store2.close()


def test_a_single_device_node_defers_a_sticky_failure_and_the_fleet_decides(tmp_path: Path) -> None:
    nodes = []
    for n in range(5):  # one device per node; node 0's fails reproducibly
        path = tmp_path / f"node{n}.db"
        with Store.open(path) as s:
            _fleet(s, 1, {"sim:0": {"sticky": True}}, host=f"node{n}", first=n)
            assert apply_policy(s, now=NOW, scope="node").quarantined == []  # no peer on the node
        nodes.append(path)
    merge_stores(tmp_path / "fleet.db", nodes)
    with Store.open(tmp_path / "fleet.db") as fleet:
        out = apply_policy(fleet, now=NOW, scope="fleet")
        assert out.quarantined == ["sim:0"] and "sticky" in out.reasons[0] and not out.breaker_tripped


# ---------------------------------------------------------------------------------------------- the fleet's breaker
def test_a_batch_sharing_one_defect_is_quarantined_not_frozen(store: Store) -> None:
    # 3 of 40 devices (a bad batch) give the same wrong output for one case, reproducibly; 37 others pass it
    bad = {f"sim:{i}": {"sticky": True, "digest": "d" * 64} for i in (3, 17, 30)}
    _fleet(store, 40, bad)
    out = apply_policy(store, now=NOW)
    assert not out.breaker_tripped
    assert sorted(out.quarantined) == sorted(bad)
    assert all("a defect they share, not the suite" in r and "37 others passed" in r for r in out.reasons)


def test_a_bad_golden_file_everywhere_trips_the_breaker(store: Store) -> None:
    _fleet(store, 10, {f"sim:{i}": {"sticky": True, "digest": "g" * 64} for i in range(10)})
    out = apply_policy(store, now=NOW)
    assert out.breaker_tripped and out.quarantined == []
    assert "same wrong output" in out.reasons[0] and "100% of the devices that ran it" in out.reasons[0]


def test_a_bad_golden_file_on_a_few_hosts_trips_the_breaker(store: Store) -> None:
    # a staged roll-out: 5 of 30 devices got the bad file. They compute the right answer, which their file calls
    # wrong: their "wrong" output is the very output the 25 others pass the case with. Share alone (17%) would
    # have judged them a shared defect.
    _fleet(store, 30, {f"sim:{i}": {"sticky": True, "digest": "good"} for i in range(5)})
    out = apply_policy(store, now=NOW)
    assert out.breaker_tripped and out.quarantined == []
    assert "the very output other devices pass it with" in out.reasons[0]


# ---------------------------------------------------------------------------------------------- training incidents
def _incident(ranks: tuple[int, ...], *, step: int, kind: str = "replay", job: str = "job-1") -> Incident:
    devices = tuple(f"sim:{r}" for r in ranks)
    return Incident(
        kind=kind,
        step=step,
        suspect_ranks=ranks,
        device=devices[0],
        detail="local grads differ",
        devices=devices,
        hosts=tuple("node" for _ in ranks),
        job=job,
        time=NOW - 600 + step,
    )


def test_incidents_naming_two_of_three_devices_quarantine_nobody(store: Store) -> None:
    """Issue 17: a nondeterministic model; every replay mismatch named two ranks, rotating over all three."""
    pairs = [(2, 0), (0, 1), (1, 2)]
    for step in range(24):
        store.training.record_incident(_incident(pairs[step % 3], step=step))
    out = apply_policy(store, now=NOW)
    assert out.quarantined == []
    assert out.training_breaker_jobs == ["job-1"]
    (note,) = [d for d in out.decisions if d.decision == "training_breaker"]
    assert "named 3 distinct devices" in note.reason and "nobody quarantined" in note.reason
    assert [d.decision for d in store.quarantine.decisions()] == ["training_breaker"]


def test_a_device_named_alone_again_and_again_is_quarantined(store: Store) -> None:
    """The control: the same job shape, but the replays single out one device by majority."""
    for step in range(24):
        store.training.record_incident(_incident((1,), step=step, job="job-2"))
    out = apply_policy(store, now=NOW)
    assert out.quarantined == ["sim:1"] and out.training_breaker_jobs == []
    assert "24 training incidents named it alone" in out.reasons[0]


def test_unattributed_and_nondeterministic_incidents_never_count(store: Store) -> None:
    for step in range(5):
        store.training.record_incident(_incident((0, 1), step=step, job="a"))  # two suspects: no majority
        store.training.record_incident(_incident((0,), step=step, kind="nondeterministic", job="b"))
        store.training.record_incident(_incident((2,), step=step, kind="nonfinite", job="d"))  # a NaN: many causes
        store.training.record_incident(_incident((2,), step=step, kind="reduction", job="e"))  # a hook, most often
        store.training.record_incident(
            Incident(kind="replay", step=step, suspect_ranks=(0,), device=None, detail="x", job="c", time=NOW - 100)
        )
    assert apply_policy(store, now=NOW).quarantined == []


def test_one_job_naming_three_devices_alone_trips_its_breaker_only(store: Store) -> None:
    for step in range(6):
        store.training.record_incident(_incident((step % 3,), step=step, job="flaky"))  # 3 devices, each alone, twice
        store.training.record_incident(_incident((7,), step=step, job="steady"))  # another job: one device
    out = apply_policy(store, now=NOW)
    assert out.training_breaker_jobs == ["flaky"] and out.quarantined == ["sim:7"]


# ---------------------------------------------------------------------------------------------- deploy/
def test_deploy_runs_each_rule_where_its_data_is() -> None:
    k8s = (ROOT / "deploy" / "kubernetes" / "sdcguard-scan.yaml").read_text()
    scan_job, merge_job = k8s.split("name: sdcguard-merge")
    assert re.search(r"scan .*--policy-scope node", scan_job.replace("\n", " "))
    merge_cmd = " ".join(merge_job.split())
    assert re.search(r"sdcguard merge /stores/fleet.db /stores/nodes /stores/jobs", merge_cmd)  # + job spools
    assert re.search(r"sdcguard --db /stores/fleet.db policy .*--action kubernetes-taint", merge_cmd)
    steps = ("sdcguard merge ", "fleet.db policy ", "fleet.db prune ", "export prometheus")
    order = [merge_cmd.index(x) for x in steps]
    assert order == sorted(order)
    slurm = (ROOT / "deploy" / "slurm" / "sdcguard-scan.sbatch").read_text()
    assert "--policy-scope node" in slurm and "policy" in (ROOT / "deploy" / "slurm" / "sdcguard-merge.sh").read_text()
    systemd = (ROOT / "deploy" / "systemd" / "sdcguard-scan.service").read_text()
    (start,) = [line for line in systemd.splitlines() if line.startswith("ExecStart=")]
    assert "--policy-scope" not in start  # one machine, one store: it is the fleet


def test_the_policy_command_says_what_it_decided_in_its_exit_code(tmp_path: Path) -> None:
    import time

    from click.testing import CliRunner

    from sdcguard.cli import cli

    now = time.time()
    db = tmp_path / "fleet.db"
    with Store.open(db) as s:
        scan(
            s,
            "sim:1",
            [*clean("sim:1", 10, t=now - 600), result("sim:1", passed=False, sticky=True, t=now - 60)],
            t=now - 600,
        )
        scan(s, "sim:2", clean("sim:2", 10, t=now - 600), t=now - 600)
    run = CliRunner().invoke(cli, ["--db", str(db), "policy"])
    assert run.exit_code == 1 and "sim:1: sticky failure" in run.stdout and "1 quarantined" in run.stdout
    run = CliRunner().invoke(cli, ["--db", str(db), "policy"])
    assert run.exit_code == 0 and "0 quarantined" in run.stdout  # nothing new
    bad = tmp_path / "bad.toml"
    bad.write_text("[policy]\nbreaker_share = 7\n")
    run = CliRunner().invoke(cli, ["--db", str(db), "policy", "--config", str(bad)])
    assert run.exit_code == 2 and "breaker_share" in run.stderr and run.stderr.count("\n") == 1
    with Store.open(db) as s:  # the same wrong output on two devices, and nobody passes the case: the breaker
        for d in ("sim:3", "sim:4"):
            scan(s, d, [result(d, passed=False, sticky=True, case="x.y", digest="e" * 64, t=now - 30)], t=now - 30)
    run = CliRunner().invoke(cli, ["--db", str(db), "policy"])
    assert run.exit_code == 2 and "circuit breaker" in run.stdout


def test_an_unresolved_incident_shows_every_suspect_as_suspect_and_quarantines_nobody(store: Store) -> None:
    """Two devices disagree and nothing decides: neither is counted alone, both show as suspects in the report."""
    store.training.record_incident(_incident((0, 1), step=3, kind="unresolved"))
    store.training.record_incident(_incident((2,), step=4, kind="nondeterministic"))
    statuses = store.quarantine.statuses(suspect_since=NOW - 86400)
    assert statuses["sim:0"] == statuses["sim:1"] == "suspect"
    assert statuses.get("sim:2", "healthy") == "healthy"
    assert apply_policy(store, now=NOW).quarantined == []
