"""The scanner's command line: ``sdcguard scan`` (the cron entry) and ``python -m fleet_scan``, the same command.

Only argument handling lives here; the work is :func:`fleet_scan.runner.run_scan`. Settings come from, in order
of precedence: the command line, the environment (``SDCGUARD_*``), a TOML config file (``--config`` or
``$SDCGUARD_CONFIG``, sections ``[scan]`` and ``[policy]``), the defaults of
:class:`~fleet_scan.options.ScanOptions`. ``python -m fleet_scan`` needs nothing of :mod:`sdcguard.cli`: it ends
by the same rules (:mod:`sdcguard.entry`) on its own.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from sdcguard.entry import SECONDS, SECONDS_OR_ZERO, STORE, OneLineErrors, default_db
from sdcguard.inject.spec import INJECT_SPEC_HELP, InjectSpec

from .config import (
    POLICY_SCOPES,
    actions_option,
    config_option,
    drill_store_option,
    load_config,
    load_policy,
    parse_actions,
)
from .options import DEFAULT_BUDGET_S, ScanOptions, settings

if TYPE_CHECKING:
    from sdcguard.fleet.policy import PolicyScope

__all__ = ["scan", "main"]

_DEFAULTS = {key: f.default for key, f in settings().items()}


def _given(ctx: click.Context) -> dict[str, Any]:
    """The settings given on the command line or in the environment (None: left at click's default)."""
    return {
        key: None if ctx.get_parameter_source(key) in (click.core.ParameterSource.DEFAULT, None) else ctx.params[key]
        for key in _DEFAULTS
    }


@click.command(
    "scan",
    cls=OneLineErrors,
    epilog=INJECT_SPEC_HELP,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 120},
)
@click.option(
    "--db", "db_path", type=STORE, default=None, help="Fleet store (overrides the top-level --db / $SDCGUARD_DB)."
)
@click.option(
    "--device",
    "devices",
    multiple=True,
    metavar="SPEC",
    help="cuda:N, cpu:N, a device id or all (repeatable). Default: every GPU, else every CPU core.",
)
@click.option(
    "--budget",
    type=SECONDS,
    default=None,
    help=f"Wall-clock time per device: seconds, or a number and a unit (90s, 5m) (default {DEFAULT_BUDGET_S:g}s; "
    "config [scan] budget).",
)
@click.option(
    "--only-idle/--all",
    "only_idle",
    default=_DEFAULTS["only_idle"],
    help="Scan only idle devices and stop when a job appears (default), or every device asked for.",
)
@click.option(
    "--inject",
    "inject",
    multiple=True,
    metavar="SPEC",
    help="Fire drill: make devices behave as faulty hardware (grammar below).",
)
@drill_store_option
@click.option("--json", "json_lines", is_flag=True, help="Progress as JSON lines even on a terminal.")
@click.option(
    "--retests",
    type=int,
    default=None,
    help=f"Retests of a failing case in a fresh process (default {_DEFAULTS['retests']}).",
)
@actions_option
@config_option
@click.option(
    "--policy-scope",
    type=click.Choice(POLICY_SCOPES),
    default=None,
    help="Rules applied after the scan: fleet (every rule; this store is the whole fleet's, the default) "
    "or node (only a sticky failure another device of this node passed; the merge job applies the "
    "fleet's rules to the merged store). Config [scan] policy_scope.",
)
@click.option(
    "--lock-dir",
    type=click.Path(file_okay=False, path_type=Path),
    envvar="SDCGUARD_LOCK_DIR",
    default=None,
    help="Directory of per-device lock files ($SDCGUARD_LOCK_DIR; default "
    "$XDG_RUNTIME_DIR/sdcguard-locks or /tmp/sdcguard-locks).",
)
@click.option(
    "--golden-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Golden data directory (default: the one shipped with sdcguard).",
)
@click.option(
    "--idle-window",
    type=SECONDS_OR_ZERO,
    default=None,
    help=f"Window of the idle check: seconds, or a number and a unit (default {_DEFAULTS['idle_window']:g}s).",
)
@click.option(
    "--gpu-util-max",
    type=float,
    default=None,
    metavar="PCT",
    help=f"A GPU above this utilization is busy (default {_DEFAULTS['gpu_util_max']:g}).",
)
@click.option(
    "--cpu-busy-max",
    type=float,
    default=None,
    metavar="PCT",
    help=f"A core kept busier than this by other processes is busy (default {_DEFAULTS['cpu_busy_max']:g}).",
)
@click.pass_context
def scan(
    ctx: click.Context,
    db_path: Path | None,
    devices: Sequence[str],
    budget: float | None,
    only_idle: bool,
    inject: Sequence[str],
    drill_store: Path | None,
    json_lines: bool,
    retests: int | None,
    actions: Sequence[str],
    config_path: Path | None,
    lock_dir: Path | None,
    golden_dir: Path | None,
    idle_window: float | None,
    gpu_util_max: float | None,
    cpu_busy_max: float | None,
    policy_scope: PolicyScope | None,
) -> None:
    """Scan this machine's idle devices with the golden suite, record the results, apply the quarantine policy.

    Each device gets its own process and lock; cases are compared bit-exactly with the golden data, failures are
    retested in a fresh process, and the policy may quarantine devices and run the actions.

    Exit codes: 0 every scanned device passed; 1 corruption found; 2 could not run (bad input, no device, every
    device busy, a device that executed no golden case in its budget, a fire drill that injects nothing, golden
    data suspect, circuit breaker tripped); 130 / 143
    stopped by SIGINT / SIGTERM before it finished (what was done is recorded as interrupted).

    \b
    Example (cron, Slurm drain on quarantine):
      sdcguard --db /var/lib/sdcguard/node.db scan --budget 60 \\
          --action 'scontrol update NodeName={host} State=DRAIN Reason={reason}'
    """
    from .progress import make_reporter
    from .runner import run_scan

    config = load_config(config_path)
    section = dict(config.get("scan", {}))  # every value checked by load_config
    # `sdcguard --db` (or $SDCGUARD_DB) when run as `sdcguard scan`; the same default as `python -m fleet_scan`
    root_db = getattr(ctx.obj, "db", None)
    db = db_path if db_path is not None else root_db if root_db is not None else STORE.convert(default_db(), None, None)
    templates = parse_actions(actions, section)
    policy = load_policy(config)
    scope: PolicyScope = policy_scope or section.get("policy_scope", "fleet")  # both checked: click, load_config
    # The fire drill is parsed here, once: the workers and retests get the parsed spec (BadInput: one line, exit 2).
    drill = InjectSpec.parse(";".join(inject)) if inject else None
    from sdcguard.fleet.store.drills import drill_running, drill_store_for

    drilling = drill is not None or drill_running()
    if drilling:  # a drill never enters the fleet's record (sdcguard.fleet.store.drills)
        db = Path(drill_store_for(str(db), drill_store))
    options = ScanOptions.from_settings(_given(ctx), section, db=str(db), inject=drill, json=json_lines)
    specs = list(devices) or list(section.get("devices", []))
    with make_reporter(json_lines) as reporter:
        outcome = run_scan(options, specs, reporter=reporter, policy=policy, actions=templates, policy_scope=scope)
    if outcome.exit_code:
        click.echo(f"sdcguard: {outcome.message}", err=True)
    if drilling and outcome.exit_code != 2:
        click.echo(
            f"sdcguard: a fire drill: its results are in the drill store {db}, apart from the fleet's record "
            "(`sdcguard report --drills` shows them)",
            err=True,
        )
    ctx.exit(outcome.exit_code)


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m fleet_scan [--db PATH] [scan options]``: the same command as ``sdcguard scan``."""
    scan.main(args=list(sys.argv[1:] if argv is None else argv), prog_name="python -m fleet_scan")
