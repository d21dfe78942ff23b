"""``sdcguard policy``: apply the quarantine policy to a store (the merge job, on the merged fleet store)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import click

from ..errors import BadInput
from .common import actions_option, config_option, load_config, load_policy, open_store, parse_actions

if TYPE_CHECKING:
    from ..fleet.policy import PolicyScope

__all__ = ["policy"]


@click.command("policy")
@config_option
@actions_option
@click.option("--scope", type=click.Choice(["fleet", "node"]), default="fleet", show_default=True,
              help="fleet: every rule (the merged store sees every host); node: only what one node's store can "
                   "decide alone.")
@click.pass_context
def policy(ctx: click.Context, config_path: Path | None, actions: Sequence[str], scope: PolicyScope) -> None:
    """Apply the quarantine policy to the store and run the actions for newly quarantined devices.

    Run it after `sdcguard merge`, on the merged store: the rate rule, the circuit breakers across hosts and
    the training incidents need the whole fleet's data. Exit codes: 0 nothing new quarantined; 1 devices
    quarantined in this run; 2 a circuit breaker of the scanner tripped (the suite or software is suspect).

    \b
    Example (the merge job):
      sdcguard merge /stores/fleet.db /stores/nodes/*.db
      sdcguard --db /stores/fleet.db policy --config /etc/sdcguard/sdcguard.toml --action kubernetes-taint
    """
    from ..fleet.policy import apply_policy

    config = load_config(config_path)
    unknown = set(config.get("scan", {})) - {"budget", "retests", "only_idle", "actions", "lock_dir", "golden_dir",
                                             "idle_window", "gpu_util_max", "cpu_busy_max", "devices",
                                             "policy_scope"}
    if unknown:
        raise BadInput(f"[scan]: unknown key(s) {sorted(unknown)}")
    rules = load_policy(config)
    templates = parse_actions(actions, dict(config.get("scan", {})))
    with open_store() as store:
        out = apply_policy(store, rules, actions=templates, scope=scope)
    for line in out.reasons:
        click.echo(line)
    click.echo(
        f"policy ({scope}): {len(out.quarantined)} quarantined, {len(out.released)} released from probation, "
        f"{out.reaped} stale scans interrupted" + ("; circuit breaker tripped" if out.breaker_tripped else "")
    )
    ctx.exit(2 if out.breaker_tripped else 1 if out.quarantined else 0)
