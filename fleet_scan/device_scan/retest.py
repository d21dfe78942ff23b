"""``python -m fleet_scan.device_scan.retest``: re-run one golden case N times on one device in a fresh process.

Input (stdin, JSON): ``{"target": ScanTarget, "case": id, "n": N, "options": ScanOptions, "references": dir|null}``.
Output (stdout, JSON): the N results (``attempt`` 1..N). The fresh interpreter re-reads the references the
scanner's parent built off this device and rebuilds the backend, so nothing the first run left behind in memory
can make the retest agree with it.
"""

from __future__ import annotations

import dataclasses
import json
import sys

from sdcguard.errors import SdcguardError
from sdcguard.exit_codes import EXIT_CANNOT_RUN

from ..devices.discovery import ScanTarget
from ..options import ScanOptions
from .worker import load_worker_suite, make_backend, make_hook, result_to_json

__all__ = ["main"]


def main() -> None:
    payload = json.loads(sys.stdin.read())
    target = ScanTarget.from_json(payload["target"])
    options = ScanOptions.from_json(payload["options"])
    suite = load_worker_suite(options, payload.get("references"))
    backend = make_backend(target, suite)
    cases = {c.id: c for c in backend.cases()}
    case = cases.get(payload["case"])
    if case is None:
        raise SdcguardError(f"retest: case {payload['case']!r} is not in the golden suite")
    hook = make_hook(options.inject, target)
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
        sys.exit(EXIT_CANNOT_RUN)
