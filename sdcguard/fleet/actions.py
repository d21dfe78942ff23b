"""Quarantine actions: command templates (Slurm drain, Kubernetes cordon, anything) run as argument lists.

A template is a tuple of arguments with placeholders ``{device}``, ``{host}`` and ``{reason}``. It is rendered
argument by argument and run with :func:`subprocess.run` *without a shell*, so a reason such as
``"; rm -rf /"`` stays one harmless argument. Each run has a timeout; a failure is returned, never raised, so
one broken action never stops the others (the policy records it and retries it on its next run).
"""

from __future__ import annotations

import hashlib
import shlex
import string
import subprocess
from dataclasses import dataclass
from pathlib import PurePath

from ..errors import BadInput

__all__ = ["ActionTemplate", "ActionResult", "PLACEHOLDERS", "run_action"]

PLACEHOLDERS = frozenset({"device", "host", "reason"})


@dataclass(frozen=True, kw_only=True)
class ActionTemplate:
    """A command run once for every device the policy quarantines (retried until it succeeds)."""

    name: str
    """Stable name: the store remembers per (device, quarantine, name) whether the action succeeded."""
    argv: tuple[str, ...]
    """Program and arguments; placeholders ``{device}``, ``{host}``, ``{reason}`` (``{{`` for a brace)."""
    timeout_s: float = 60.0
    """A run longer than this is killed and counts as failed."""

    def __post_init__(self) -> None:
        if not self.name.strip():
            raise BadInput("an action needs a name")
        if not self.argv or not self.argv[0]:
            raise BadInput(f"action {self.name!r}: argv must name a program")
        if isinstance(self.argv, str):
            raise BadInput(f"action {self.name!r}: argv is a list of arguments, not a shell string")
        if self.timeout_s <= 0:
            raise BadInput(f"action {self.name!r}: timeout_s must be > 0")
        for arg in self.argv:
            try:
                fields = {f for _, f, _, _ in string.Formatter().parse(arg) if f is not None}
            except ValueError as e:
                raise BadInput(f"action {self.name!r}: bad template {arg!r}: {e}") from None
            unknown = fields - PLACEHOLDERS
            if unknown:
                raise BadInput(
                    f"action {self.name!r}: unknown placeholder(s) {sorted(unknown)} in {arg!r}; "
                    f"use {sorted(PLACEHOLDERS)}"
                )

    def render(self, *, device: str, host: str, reason: str) -> list[str]:
        """The argument list for one device."""
        values = {"device": device, "host": host, "reason": reason}
        return [arg.format_map(values) for arg in self.argv]

    @classmethod
    def slurm_drain(cls) -> ActionTemplate:
        """``scontrol update NodeName={host} State=DRAIN Reason=...``: Slurm stops scheduling on the node."""
        return cls(
            name="slurm-drain",
            argv=("scontrol", "update", "NodeName={host}", "State=DRAIN", "Reason=sdcguard {device}: {reason}"),
        )

    @classmethod
    def kubernetes_taint(cls) -> ActionTemplate:
        """``kubectl taint nodes {host} sdcguard.io/sdc=quarantined:NoSchedule``: no new pods on the node."""
        return cls(
            name="kubernetes-taint",
            argv=("kubectl", "taint", "nodes", "{host}", "sdcguard.io/sdc=quarantined:NoSchedule", "--overwrite"),
        )

    @classmethod
    def from_text(cls, text: str) -> ActionTemplate:
        """A template from a command line (``--action``, a config file), split with shlex, never run by a shell.

        ``slurm-drain`` and ``kubernetes-taint`` name the built-in templates. The name of any other template is its
        program plus a hash of the whole text: stable across runs, so the store knows whether it already ran.
        """
        text = text.strip()
        if text == "slurm-drain":
            return cls.slurm_drain()
        if text == "kubernetes-taint":
            return cls.kubernetes_taint()
        try:
            argv = tuple(shlex.split(text))
        except ValueError as e:
            raise BadInput(f"bad --action {text!r}: {e}") from None
        if not argv:
            raise BadInput("empty --action: give a command line, e.g. 'scontrol update NodeName={host} State=DRAIN'")
        name = f"{PurePath(argv[0]).name}-{hashlib.sha256(text.encode()).hexdigest()[:8]}"
        return cls(name=name, argv=argv)


@dataclass(frozen=True, kw_only=True)
class ActionResult:
    """What one run of an action did."""

    argv: tuple[str, ...]
    ok: bool
    returncode: int | None
    """None when the program could not start or timed out."""
    output: str
    """The tail of stdout and stderr, or why it could not run."""


def run_action(template: ActionTemplate, *, device: str, host: str, reason: str) -> ActionResult:
    """Run a template for one device; never raises for a failing command."""
    argv = template.render(device=device, host=host, reason=reason)
    try:
        proc = subprocess.run(
            argv, shell=False, capture_output=True, text=True, timeout=template.timeout_s, stdin=subprocess.DEVNULL
        )
    except subprocess.TimeoutExpired:
        return ActionResult(
            argv=tuple(argv), ok=False, returncode=None, output=f"timed out after {template.timeout_s} s"
        )
    except OSError as e:  # not found, not executable
        return ActionResult(
            argv=tuple(argv), ok=False, returncode=None, output=f"cannot run {argv[0]!r}: {e.strerror or e}"
        )
    output = (proc.stdout + proc.stderr)[-2000:]
    return ActionResult(argv=tuple(argv), ok=proc.returncode == 0, returncode=proc.returncode, output=output)
