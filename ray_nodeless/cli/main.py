"""`ray-nodeless`: plan, catalog, status, sweep, simulate, trace. Keep these interfaces stable: other tools build on them.

Every `--json` output is one JSON document (keys documented in README.md). Errors follow `cli.errors`: one line
naming the offending key, exit status 2 (bad input) or 1 (anything else). Each command group lives in its own
module here; this one only assembles them.
"""
from __future__ import annotations

import logging

import click

from ray_nodeless.cli.catalog import catalog_group
from ray_nodeless.cli.convert import convert_command
from ray_nodeless.cli.plan import plan_command
from ray_nodeless.cli.simulate import simulate_command
from ray_nodeless.cli.status import status_command
from ray_nodeless.cli.sweep import sweep_command
from ray_nodeless.cli.trace import trace_group


@click.group()
@click.option("-v", "--verbose", is_flag=True, help="Log debug messages.")
def main(verbose: bool) -> None:
    """ray_nodeless: cheapest-fit instances for Ray clusters, under ordered rules."""
    logging.basicConfig(level=logging.DEBUG if verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")


for _command in (plan_command, convert_command, catalog_group, status_command, sweep_command, simulate_command,
                 trace_group):
    main.add_command(_command)

if __name__ == "__main__":  # pragma: no cover
    main()
