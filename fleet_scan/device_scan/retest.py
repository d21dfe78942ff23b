"""``python -m fleet_scan.device_scan.retest``: re-run one golden case N times on one device in a fresh process.

Input (stdin): a :class:`~fleet_scan.device_scan.requests.RetestRequest` as JSON (the target, the options with the
fire drill already parsed, the case, N, the references). Output (stdout): the N results
(:func:`~fleet_scan.device_scan.requests.results_to_json`, ``attempt`` 1..N). The fresh interpreter re-reads the
references the scanner's parent built off this device and rebuilds the backend and the drill hook
(:mod:`fleet_scan.device_scan.backend`, as the worker does), so nothing the first run left behind in memory can make
the retest agree with it.
"""

from __future__ import annotations

import dataclasses
import json
import sys

from sdcguard.errors import SdcguardError
from sdcguard.exit_codes import EXIT_CANNOT_RUN

from .backend import load_worker_suite, make_backend, make_hook
from .requests import RetestRequest, results_to_json

__all__ = ["main"]


def main() -> None:
    request = RetestRequest.from_json(json.loads(sys.stdin.read()))
    backend = make_backend(request.target, load_worker_suite(request.options, request.references))
    cases = {c.id: c for c in backend.cases()}
    case = cases.get(request.case)
    if case is None:
        raise SdcguardError(f"retest: case {request.case!r} is not in the golden suite")
    hook = make_hook(request.options.inject, request.target)
    out = [dataclasses.replace(backend.run(case, output_hook=hook), attempt=a) for a in range(1, request.n + 1)]
    sys.stdout.write(json.dumps(results_to_json(out)))


if __name__ == "__main__":
    try:
        main()
    except SdcguardError as e:
        print(f"retest: {e}", file=sys.stderr)
        sys.exit(EXIT_CANNOT_RUN)
