"""The parent's side of the workers: the peer's virtualenv, starting a worker process, and the pipe to it.

Ours runs in the project's ``.venv``, the peer in a virtualenv of its own (CPU ``torch``, PyPI's ``sdcguard``,
numpy), created here or reused when it already holds the peer. Both packages are imported as ``sdcguard``, so the two
never share a process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.peer_checksums.worker import WORKER

__all__ = ["PEER_SPEC", "TORCH_SPEC", "Worker", "ensure_peer_venv", "log"]

PEER_SPEC = "sdcguard==0.4.0"
TORCH_SPEC = "torch==2.13.0"


def log(msg: str) -> None:
    print(f"[peer_checksums {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class Worker:
    """A worker process (:mod:`benchmarks.peer_checksums.worker`) run by ``python``, and the pipe to it."""

    def __init__(self, kind: str, python: str, seed: int, workdir: Path) -> None:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
        env.update(
            OMP_NUM_THREADS="1",
            MKL_NUM_THREADS="1",
            SDCGUARD_SIGN_SEED=str(seed),
            PYTHONNOUSERSITE="1",
            PYTHONWARNINGS="ignore",
        )
        self.kind = kind
        self.log_path = workdir / f"worker-{kind}.log"
        self._log = open(self.log_path, "w")  # noqa: SIM115  (open for the worker's life)
        # cwd=/ and -P: the repository is on neither worker's path unless the worker puts it there (ours only)
        self.proc = subprocess.Popen(
            [python, "-u", "-P", str(WORKER), "--kind", kind, "--seed", str(seed)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            env=env,
            cwd="/",
        )
        first = self._read()
        if "error" in first:
            raise RuntimeError(f"{kind} worker could not start:\n{first['error']}")

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            tail = self.log_path.read_text()[-3000:]
            raise RuntimeError(f"{self.kind} worker exited (rc {self.proc.wait()}); its log ends:\n{tail}")
        return json.loads(line)

    def call(self, cmd: str, **kw: Any) -> Any:
        """Run one command in the worker; its result (``RuntimeError`` with the worker's traceback if it failed)."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"cmd": cmd, **kw}) + "\n")
        self.proc.stdin.flush()
        reply = self._read()
        if "error" in reply:
            raise RuntimeError(f"{self.kind} worker failed on {cmd}:\n{reply['error']}")
        return reply["ok"]

    def close(self) -> None:
        try:
            if self.proc.poll() is None and self.proc.stdin is not None:
                self.proc.stdin.write(json.dumps({"cmd": "quit"}) + "\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
        self._log.close()


_PROBE = (
    "import json, sdcguard, torch; print(json.dumps({'version': getattr(sdcguard, '__version__', None), "
    "'file': sdcguard.__file__, 'torch': torch.__version__}))"
)


def ensure_peer_venv(venv: Path, torch_spec: str, peer_spec: str, workdir: Path) -> tuple[str | None, str]:
    """The peer's virtualenv (created, or reused when it already has the peer): (its python, what happened)."""
    python = venv / "bin" / "python"
    want = peer_spec.split("==")[1] if "==" in peer_spec else None

    def probe() -> dict[str, Any] | None:
        if not python.exists():
            return None
        r = subprocess.run(
            [str(python), "-c", _PROBE],
            check=False,
            capture_output=True,
            text=True,
            cwd="/",
            env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
        )
        if r.returncode:
            return None
        got = json.loads(r.stdout.strip().splitlines()[-1])
        ok = (want is None or got["version"] == want) and str(venv.resolve()) in str(Path(got["file"]).resolve())
        return got if ok else None

    got = probe()
    if got is not None:
        return str(python), f"reused {venv} (sdcguard {got['version']}, torch {got['torch']})"
    pip_log = workdir / "peer-venv-pip.log"
    with open(pip_log, "w") as fh:
        if not python.exists():
            log(f"creating the peer's virtualenv {venv}")
            base = os.environ.get("PYTHON", "python3")
            r = subprocess.run([base, "-m", "venv", str(venv)], check=False, stdout=fh, stderr=subprocess.STDOUT)
            if r.returncode:
                return None, f"`{base} -m venv {venv}` failed (rc {r.returncode}); see {pip_log}"
        log(f"installing {torch_spec} {peer_spec} numpy into {venv} (pip's output: {pip_log})")
        r = subprocess.run(
            [str(python), "-m", "pip", "install", "--disable-pip-version-check", torch_spec, peer_spec, "numpy"],
            check=False,
            stdout=fh,
            stderr=subprocess.STDOUT,
            cwd="/",
        )
    if r.returncode:
        tail = pip_log.read_text()[-1500:]
        return None, f"pip install {torch_spec} {peer_spec} failed (rc {r.returncode}):\n{tail}"
    got = probe()
    if got is None:
        return None, f"installed, but `import sdcguard` in {venv} is not the peer {peer_spec} (see {pip_log})"
    return str(python), f"created {venv} (sdcguard {got['version']}, torch {got['torch']})"
