"""``sdcguard policy``: apply the quarantine policy to a store (the merge job, on the merged fleet store)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import click

from fleet_scan.config import POLICY_SCOPES, actions_option, config_option, load_config, load_policy, parse_actions

from ..exit_codes import EXIT_CANNOT_RUN, EXIT_CORRUPTION, EXIT_OK
from .common import open_store

if TYPE_CHECKING:
    from ..fleet.policy import PolicyScope

__all__ = ["policy"]


@click.command("policy")
@config_option
@actions_option
@click.option(
    "--scope",
    type=click.Choice(POLICY_SCOPES),
    default="fleet",
    show_default=True,
    help="fleet: every rule (the merged store sees every host); node: only what one node's store can decide alone.",
)
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

    config = load_config(config_path)  # [scan] keys checked there
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
    ctx.exit(EXIT_CANNOT_RUN if out.breaker_tripped else EXIT_CORRUPTION if out.quarantined else EXIT_OK)
