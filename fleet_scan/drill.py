"""The fire drill's sanity check: every ``--inject`` rule must touch a device this scan scans and a case it runs.

A drill that matches nothing (``cpu:5`` on a 2-core machine, ``case=nomatch*``) would otherwise scan, pass and
exit 0: the operator would believe the pipeline was proven end to end when nothing was injected. It is refused
before any device is touched, with the devices and cases it could have named.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sdcguard.errors import BadInput

from .devices.discovery import ScanTarget

__all__ = ["check_drill"]


def _runnable(case: Any, target: ScanTarget) -> bool:
    # The numpy backend skips GPU-only cases; a GPU may lack units some cases need, which only its backend knows,
    # so every case counts for a GPU here.
    return target.kind != "cpu" or not getattr(case, "gpu_only", False)


def check_drill(rules: Sequence[Any], targets: Sequence[ScanTarget], cases: Sequence[Any]) -> None:
    """Raise :class:`BadInput` unless every rule names at least one target and, on it, at least one case."""
    for rule in rules:
        named = [t for t in targets if rule.matches(t.device, cuda_index=t.index if t.kind == "gpu" else None)]
        label = rule.text or "--inject"
        if getattr(rule, "slowdown", 1.0) > 1.0 and any(t.kind != "cpu" for t in named):
            raise BadInput(f"fire drill {label!r}: the slow drill burns cycles on CPU cores only; name cpu:N devices")
        if not named:
            scanned = ", ".join(t.device for t in targets[:4]) + (" ..." if len(targets) > 4 else "")
            raise BadInput(
                f"fire drill {label!r} names no device this scan scans ({scanned}): nothing would be injected; "
                "name one of those devices (or all)"
            )
        if not any(rule.matches_case(c.id) for t in named for c in cases if _runnable(c, t)):
            families = sorted({str(getattr(c, "family", c.id.split(".")[0])) for c in cases})
            raise BadInput(
                f"fire drill {label!r}: case={rule.cases} matches no golden case these devices run "
                f"(case ids look like alu.u32.chain; families: {', '.join(families)}); nothing would be injected"
            )
