"""`ray-nodeless`: plan, catalog, status, sweep, simulate, trace. Keep these interfaces stable: other tools build on
them.

Every `--json` output is one JSON document (keys documented in docs/, per command). Errors follow `cli.errors`: one line
naming the offending key, exit status 2 (bad input) or 1 (anything else). Each command group lives in its own
module here; this one only assembles them, and imports a command's module only when that command runs (or
`--help` lists it): a cold `ray-nodeless plan` must not pay for simulate's, trace's or convert's imports.
"""
from __future__ import annotations

import logging
from collections.abc import Iterator, MutableMapping
from typing import Any

import click

COMMANDS = ("plan", "convert", "catalog", "status", "sweep", "simulate", "trace", "kuberay-autoscaler")


def load_command(name: str) -> click.Command | None:
    """The command object of `name`, its module imported now."""
    if name == "plan":
        from ray_nodeless.cli.plan import plan_command
        return plan_command
    if name == "convert":
        from ray_nodeless.cli.convert import convert_command
        return convert_command
    if name == "catalog":
        from ray_nodeless.cli.catalog import catalog_group
        return catalog_group
    if name == "status":
        from ray_nodeless.cli.status import status_command
        return status_command
    if name == "sweep":
        from ray_nodeless.cli.sweep import sweep_command
        return sweep_command
    if name == "simulate":
        from ray_nodeless.cli.simulate import simulate_command
        return simulate_command
    if name == "trace":
        from ray_nodeless.cli.trace import trace_group
        return trace_group
    if name == "kuberay-autoscaler":
        from ray_nodeless.cli.kuberay import kuberay_autoscaler_command
        return kuberay_autoscaler_command
    return None


class _LazyCommands(MutableMapping):
    """`Group.commands` whose values are imported on first access: names (and `in`) cost nothing."""

    def __init__(self, names: tuple[str, ...]):
        self._names = list(names)
        self._loaded: dict[str, click.Command] = {}

    def __getitem__(self, name: str) -> click.Command:
        if name not in self._loaded:
            command = load_command(name) if name in self._names else None
            if command is None:
                raise KeyError(name)
            self._loaded[name] = command
        return self._loaded[name]

    def __setitem__(self, name: str, command: click.Command) -> None:
        if name not in self._names:
            self._names.append(name)
        self._loaded[name] = command

    def __delitem__(self, name: str) -> None:
        self._names.remove(name)
        self._loaded.pop(name, None)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._names))

    def __len__(self) -> int:
        return len(self._names)

    def __contains__(self, name: object) -> bool:
        return name in self._names


class LazyGroup(click.Group):
    """A group whose subcommands are imported on first use."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.commands = _LazyCommands(COMMANDS)


@click.group(cls=LazyGroup)
@click.option("-v", "--verbose", is_flag=True, help="Log debug messages.")
def main(verbose: bool) -> None:
    """ray_nodeless: cheapest-fit instances for Ray clusters, under ordered rules."""
    logging.basicConfig(level=logging.DEBUG if verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")


if __name__ == "__main__":  # pragma: no cover
    main()
