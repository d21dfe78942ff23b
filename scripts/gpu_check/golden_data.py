"""Section ``golden-data``: the golden data the GPU is judged against is intact, through the user's own command.

No GPU is needed, so a dry run runs it for real: ``sdcguard golden verify`` (manifest, every file's sha256, every
reference output recomputed) and the per-architecture goldens recorded so far.
"""

from __future__ import annotations

from .context import Context, run_command
from .results import SectionReport

__all__ = ["run"]


def run(ctx: Context, rep: SectionReport) -> str:
    rc, out, err = run_command(["-m", "sdcguard", "golden", "verify"], timeout=ctx.left())
    said = (out.strip() or err.strip()).splitlines()
    rep.check("sdcguard golden verify exits 0", rc == 0, said[-1] if said else f"exit {rc}")
    from sdcguard.golden import PORTABLE_CASES, load_suite

    suite = load_suite()
    rep.check(
        "every portable case has a golden",
        len(suite.cases) == len(PORTABLE_CASES),
        f"{len(suite.cases)} of {len(PORTABLE_CASES)}",
    )
    arch = sorted(f"{cid}@{a}" for cid, a in suite.arch_entries)
    rep.measure("portable_cases", len(suite.cases))
    rep.measure("arch_goldens", arch)
    return (
        f"{len(suite.cases)} portable cases verified; per-architecture goldens recorded: "
        f"{', '.join(arch) or 'none yet'}"
    )
