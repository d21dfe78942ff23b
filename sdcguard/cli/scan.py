"""``sdcguard scan``: the fleet scanner's cron entry (also ``python -m fleet_scan``).

Only argument handling lives here; the work is :func:`fleet_scan.runner.run_scan`. Settings come from, in order
of precedence: the command line, the environment (``SDCGUARD_*``), a TOML config file (``--config`` or
``$SDCGUARD_CONFIG``, sections ``[scan]`` and ``[policy]``), the defaults.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from ..inject.spec import INJECT_SPEC_HELP
from .common import actions_option, config_option, load_config, load_policy, parse_actions

if TYPE_CHECKING:
    from ..fleet.policy import PolicyScope

__all__ = ["scan"]

def _pick(ctx: click.Context, name: str, value: Any, config: dict[str, Any], key: str | None = None) -> Any:
    """The CLI/env value unless it is click's default and the config has one."""
    source = ctx.get_parameter_source(name)
    if source in (click.core.ParameterSource.DEFAULT, None) and (key or name) in config:
        return config[key or name]
    return value


@click.command(
    "scan",
    epilog=INJECT_SPEC_HELP,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 120},
)
@click.option("--db", "db_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Fleet store (overrides the top-level --db / $SDCGUARD_DB).")
@click.option("--device", "devices", multiple=True, metavar="SPEC",
              help="cuda:N, cpu:N, a device id or all (repeatable). Default: every GPU, else every CPU core.")
@click.option("--budget", type=float, default=None, metavar="SECONDS",
              help="Wall-clock seconds per device (default 60; config [scan] budget).")
@click.option("--only-idle/--all", "only_idle", default=True,
              help="Scan only idle devices and stop when a job appears (default), or every device asked for.")
@click.option("--inject", "inject", multiple=True, metavar="SPEC",
              help="Fire drill: make devices behave as faulty hardware (grammar below).")
@click.option("--json", "json_lines", is_flag=True, help="Progress as JSON lines even on a terminal.")
@click.option("--retests", type=int, default=None, help="Retests of a failing case in a fresh process (default 3).")
@actions_option
@config_option
@click.option("--policy-scope", type=click.Choice(["fleet", "node"]), default=None,
              help="Rules applied after the scan: fleet (every rule; this store is the whole fleet's, the default) "
                   "or node (only a sticky failure another device of this node passed; the merge job applies the "
                   "fleet's rules to the merged store). Config [scan] policy_scope.")
@click.option("--lock-dir", type=click.Path(file_okay=False, path_type=Path), envvar="SDCGUARD_LOCK_DIR",
              default=None, help="Directory of per-device lock files ($SDCGUARD_LOCK_DIR; default "
                                 "$XDG_RUNTIME_DIR/sdcguard-locks or /tmp/sdcguard-locks).")
@click.option("--golden-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Golden data directory (default: the one shipped with sdcguard).")
@click.option("--idle-window", type=float, default=None, metavar="SECONDS",
              help="Window of the idle check (default 1).")
@click.option("--gpu-util-max", type=float, default=None, metavar="PCT",
              help="A GPU above this utilization is busy (default 5).")
@click.option("--cpu-busy-max", type=float, default=None, metavar="PCT",
              help="A core kept busier than this by other processes is busy (default 50).")
@click.pass_context
def scan(
    ctx: click.Context,
    db_path: Path | None,
    devices: Sequence[str],
    budget: float | None,
    only_idle: bool,
    inject: Sequence[str],
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
    from fleet_scan.options import DEFAULT_BUDGET_S, DEFAULT_RETESTS, ScanOptions
    from fleet_scan.progress import make_reporter
    from fleet_scan.runner import run_scan

    config = load_config(config_path)
    section = dict(config.get("scan", {}))  # every value checked by load_config
    db = db_path if db_path is not None else ctx.obj.db if ctx.obj is not None else Path("sdcguard.db")
    only_idle = _pick(ctx, "only_idle", only_idle, section)
    templates = parse_actions(actions, section)
    policy = load_policy(config)
    scope: PolicyScope = policy_scope or section.get("policy_scope", "fleet")  # both checked: click, load_config
    options = ScanOptions(
        db=str(db),
        budget_s=float(budget if budget is not None else section.get("budget", DEFAULT_BUDGET_S)),
        retests=int(retests if retests is not None else section.get("retests", DEFAULT_RETESTS)),
        inject=";".join(inject) or None,
        only_idle=bool(only_idle),
        idle_window_s=float(idle_window if idle_window is not None else section.get("idle_window", 1.0)),
        gpu_util_max=float(gpu_util_max if gpu_util_max is not None else section.get("gpu_util_max", 5.0)),
        cpu_busy_max=float(cpu_busy_max if cpu_busy_max is not None else section.get("cpu_busy_max", 50.0)),
        lock_dir=str(lock_dir) if lock_dir else section.get("lock_dir"),
        golden_dir=str(golden_dir) if golden_dir else section.get("golden_dir"),
        json=json_lines,
    )
    specs = list(devices) or list(section.get("devices", []))
    with make_reporter(json_lines) as reporter:
        outcome = run_scan(options, specs, reporter=reporter, policy=policy, actions=templates, policy_scope=scope)
    if outcome.exit_code:
        click.echo(f"sdcguard: {outcome.message}", err=True)
    ctx.exit(outcome.exit_code)


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m fleet_scan [--db PATH] [scan options]``: the same command as ``sdcguard scan``."""
    from . import cli

    cli.main(args=["scan", *(sys.argv[1:] if argv is None else argv)], prog_name="python -m fleet_scan")
