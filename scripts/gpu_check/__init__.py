"""The one prepared run of every CUDA path of sdcguard (``scripts/gpu_check.sh`` is its entry point).

Each *section* checks one part on the GPU and ends PASS, FAIL or SKIP with a reason; the shell script runs every
section in its own process under its own timeout, then prints a summary. Everything a run measured lands in one
folder (``$OUT``, or ``--out``): ``results.json`` (one entry per section: status, reason, checks, measurements),
``gpu_check.log`` (everything printed) and ``intrinsics-<arch>.json`` (the per-architecture golden candidates).

Modules: :mod:`.sections` (the list, order and time limits), :mod:`.results` (outcomes and the results file),
:mod:`.context` (what a section is given: output folder, dry run, deadline, CUDA availability), one module per
section (:mod:`.golden_data`, :mod:`.nvml_check`, :mod:`.golden_suite`, :mod:`.intrinsics`, :mod:`.fingerprint_check`,
:mod:`.training`, :mod:`.fleet`, :mod:`.gpu_tests`), and :mod:`.__main__` (the command line the shell script calls).

``scripts/`` must be on ``sys.path`` (the shell script puts it there): the import name is ``gpu_check``.
"""

from __future__ import annotations

from .context import Context, Skip
from .results import Outcome, SectionReport, Status
from .sections import SECTIONS, Section, section_by_name

__all__ = ["Context", "Skip", "Outcome", "SectionReport", "Status", "SECTIONS", "Section", "section_by_name"]
