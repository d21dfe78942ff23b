"""Every example runs as its first lines say (``torchrun --standalone --nproc-per-node 2 examples/ddp_loop.py``,
``bash examples/fleet.sh``), from a fresh working directory, on the CPU over gloo, and prints what it promises.

The launch command is read from the file itself: a new example is run here without being listed; what it must print
is listed in :data:`EXPECTED` (an example not listed there must still exit 0)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs.blocks import Block, all_blocks

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(p for p in (ROOT / "examples").iterdir() if p.suffix in (".py", ".sh"))

EXPECTED: dict[str, list[str]] = {
    "ddp_loop.py": [r"rank 0: 20 steps, 0 incidents, last verified step 15", r"rank 1: 20 steps, 0 incidents"],
    "fsdp2.py": [r"rank [01]: FSDP2 over 2 ranks, 12 of 12 steps committed, 0 incidents"],
    "fsdp2_tp.py": [rf"rank {r} \(dp {r // 2}, tp {r % 2}\): 12 of 12 steps committed, 0 incidents" for r in range(4)],
    "moe_ep.py": [rf"rank {r} \(dp {r // 2}, ep {r % 2}\): 12 of 12 steps committed, 0 incidents" for r in range(4)],
    "lightning_ddp.py": [r"rank 0: 15 steps, 0 incidents", r"rank 1: 15 steps, 0 incidents"],
    "hf_trainer.py": [r"rank 0: 15 steps, 0 incidents", r"rank 1: 15 steps, 0 incidents"],
    "fault_drill.py": [
        r"rank 1: OpFaultMode\(rank=1, steps=\[10\].*\) injected 1 corrupted element\(s\) at step\(s\) \[10\]",
        r"rank 2: CorruptingCommHook\(rank=2, steps=\[13\]\) injected 1 corrupted element\(s\) at step\(s\) \[13\]",
        r"step 10: replay, suspect rank\(s\) \[1\]",
        r"step 13: gradient_replica, suspect rank\(s\) \[2\]",
        r"the guard named and vetoed both faults",
    ],
    "checkpoint_scrub.py": [
        r"saved .*step10: step 10, verified True",
        r"scrub: clean +step10",
        r"scrub: corrupt step15 1 tensor\(s\) differ from what was saved: model\.0\.weight",
        r"rank [01]: loaded step10, passing over 1 newer checkpoint\(s\)",
    ],
    "recovery.py": [
        r"rank 3: promoted to a worker at step \d+, data rank 2",
        r"rank 0: finished 14 steps as data rank 0; recovery: \[\(\d+, 'cpu:",
        r"exit codes: \[0, 86, 0, 0\]",
    ],
    "fleet.sh": [
        r"report: \{'cpu:[^']+:0': 'healthy', 'cpu:[^']+:1': 'healthy'\}",
        r"drills: \{'cpu:[^']+:1': 'quarantined'\}",
    ],
}
NEEDS = {"lightning_ddp.py": "lightning", "hf_trainer.py": "transformers"}


def launch_command(path: Path) -> str:
    """The command in an example's first comment line (after a shebang)."""
    for line in path.read_text().splitlines():
        if line.startswith("#!"):
            continue
        assert line.startswith("# "), f"{path.name}: the first line must be its launch command as a comment"
        return line[2:].strip()
    raise AssertionError(f"{path.name} is empty")


def _argv(command: str) -> list[str]:
    """The launch command with this interpreter's torchrun and python, and the example's path in this checkout."""
    words = shlex.split(command)
    head = {"torchrun": [sys.executable, "-m", "torch.distributed.run"], "python": [sys.executable], "bash": ["bash"]}[
        words[0]
    ]
    return head + [str(ROOT / w) if w.startswith("examples/") else w for w in words[1:]]


def test_every_example_says_how_to_launch_it() -> None:
    assert EXAMPLES
    for path in EXAMPLES:
        command = launch_command(path)
        assert f"examples/{path.name}" in command and command.split()[0] in ("torchrun", "python", "bash"), command
    assert set(EXPECTED) <= {p.name for p in EXAMPLES}


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(240)
@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_the_example_runs_as_its_first_line_says(path: Path, tmp_path: Path) -> None:
    if path.name in NEEDS:
        pytest.importorskip(NEEDS[path.name], reason=f"{path.name} needs {NEEDS[path.name]}")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("SDCGUARD_DB", None)
    p = _run(_argv(launch_command(path)), tmp_path, env)
    if _aborted_at_exit(p, path):  # torch's, not the guard's: once more (see _aborted_at_exit), a second abort fails
        p = _run(_argv(launch_command(path)), tmp_path, env)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-4000:]
    missing = [pattern for pattern in EXPECTED.get(path.name, []) if not re.search(pattern, p.stdout)]
    assert not missing, f"not printed: {missing}\n{p.stdout[-4000:]}"
    printed = p.stdout.splitlines()
    for block in _outputs_shown(path):  # what the docs show it printing, it prints
        for line in block.text.splitlines():
            prefix = line[:-3] if line.endswith("...") else line
            assert any(out.startswith(prefix) for out in printed), f"{block.where}: not printed: {line}"


def _run(argv: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, env=env, timeout=110)


def _aborted_at_exit(p: subprocess.CompletedProcess[str], path: Path) -> bool:
    """Whether the example did all its work and printed all it promises, and then a rank aborted in torch's teardown.

    On gloo the process group can outlive ``dist.destroy_process_group()`` (DTensor's caches hold an FSDP2 model's
    ``DeviceMesh``; DDP's constructor imports ``torch.distributed.nn.functional``, which binds the group as a default
    argument), and a gloo worker thread still running at interpreter finalization takes the process down with
    ``terminate called without an active exception`` (pytorch/pytorch#190489; docs/examples.md). It happens only under
    CPU load, about once in fifteen runs of a plain FSDP2 loop without the guard; it is recognized only in full (every
    promised line printed, then exactly that abort), so any other failure, or the same abort twice, still fails."""
    promised = all(re.search(pattern, p.stdout) for pattern in EXPECTED.get(path.name, [r"."]))
    return p.returncode != 0 and promised and "terminate called without an active exception" in p.stderr


def _outputs_shown(path: Path) -> list[Block]:
    return [b for b in all_blocks() if b.mark == "output of" and b.target == f"examples/{path.name}"]


def test_only_torchs_abort_after_all_the_work_is_run_again() -> None:
    path = ROOT / "examples" / "fsdp2.py"
    done = "rank 0: FSDP2 over 2 ranks, 12 of 12 steps committed, 0 incidents\n"
    abort = "terminate called without an active exception\n"

    def ran(rc: int, out: str, err: str) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess([], rc, out, err)

    assert _aborted_at_exit(ran(1, done, abort), path)
    assert not _aborted_at_exit(ran(0, done, ""), path)  # nothing to run again
    assert not _aborted_at_exit(ran(1, done, "Traceback (most recent call last):\n"), path)
    assert not _aborted_at_exit(ran(1, done.replace("12 of 12", "11 of 12"), abort), path)  # the work was not done
    assert not _aborted_at_exit(ran(1, "", abort), ROOT / "examples" / "ddp_loop.py")  # it printed nothing
