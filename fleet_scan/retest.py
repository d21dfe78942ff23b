"""``python -m fleet_scan.retest``: re-run one golden case N times on one device in a fresh process.

Input (stdin, JSON): ``{"target": ScanTarget, "case": id, "n": N, "inject": spec|null, "golden_dir": dir|null}``.
Output (stdout, JSON): the N results (``attempt`` 1..N). The fresh interpreter re-loads and re-verifies the suite
and rebuilds the backend, so nothing the first run left behind in memory can make the retest agree with it.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

from sdcguard.errors import SdcguardError

from .discovery import ScanTarget
from .worker import make_backend, make_hook, result_to_json

__all__ = ["main"]


def main() -> None:
    payload = json.loads(sys.stdin.read())
    target = ScanTarget.from_json(payload["target"])
    from sdcguard.golden import load_suite

    golden_dir = payload.get("golden_dir")
    suite = load_suite(Path(golden_dir) if golden_dir else None)
    backend = make_backend(target, suite)
    cases = {c.id: c for c in backend.cases()}
    case = cases.get(payload["case"])
    if case is None:
        raise SdcguardError(f"retest: case {payload['case']!r} is not in the golden suite")
    hook = make_hook(payload.get("inject"), target)
    out = []
    for attempt in range(1, int(payload["n"]) + 1):
        r = backend.run(case, output_hook=hook)
        out.append(result_to_json(dataclasses.replace(r, attempt=attempt)))
    sys.stdout.write(json.dumps(out))


if __name__ == "__main__":
    try:
        main()
    except SdcguardError as e:
        print(f"retest: {e}", file=sys.stderr)
        sys.exit(2)
