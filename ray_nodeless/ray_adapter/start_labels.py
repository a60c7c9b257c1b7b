"""The command runner Ray's updater starts Ray through, so that a machine's `ray.io/` labels are its facts.

Why: where Ray's updater starts Ray on a machine (VMs without `disable_node_updaters`, the head of every `ray up`,
under autoscaler v1 and v2 alike), it passes the node type's *declared* `labels` as `RAY_OVERRIDE_LABELS`
(ray/autoscaler/_private/updater.py, the ray start commands), and nothing else: a node type declaring
`ray.io/accelerator-type: H100` started a CPU machine under that label, and a declared type's machines had no zone
or market-type label at all, although the machine launched is a known offering. The runner the provider hands Ray
(`NodeProvider.get_command_runner`, ours to give) sets the labels of that start step to what the launcher's own
boot path sets (launch/launcher.machine_labels): the declared ones, with Ray's default `ray.io/` keys
(`core.demand.PROMISABLE`) always the machine's facts.

The start step is the one whose environment carries `RAY_OVERRIDE_RESOURCES` (Ray sets it for every node type with
resources, which Ray's schema requires; the head's `ray up` too). Every other call, and a machine whose offering is
unknown (no decision tags, another catalog), passes through as Ray made it.
"""
from __future__ import annotations

import json
import logging
from typing import Any, Callable, Mapping

from ray.autoscaler.command_runner import CommandRunnerInterface   # Ray's API for custom node providers

logger = logging.getLogger(__name__)

LABELS_ENV = "RAY_OVERRIDE_LABELS"          # ray._private.ray_constants.LABELS_ENVIRONMENT_VARIABLE
RESOURCES_ENV = "RAY_OVERRIDE_RESOURCES"    # ray._private.ray_constants.RESOURCES_ENVIRONMENT_VARIABLE


def declared_labels(value: object) -> dict[str, str]:
    """The labels Ray put in the environment: a mapping (the updater's), or its JSON text."""
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else {}
        except ValueError:
            return {}
    return {str(k): str(v) for k, v in value.items()} if isinstance(value, Mapping) else {}


class FactLabelsRunner(CommandRunnerInterface):
    """Ray's CommandRunnerInterface around `inner`; `labels_for(declared)` gives the start step's labels, or None
    to leave it as Ray made it. Everything else is `inner`'s (the interface's methods, and any attribute of the
    runner Ray built)."""

    def __init__(self, inner: Any, labels_for: Callable[[dict[str, str]], dict[str, str] | None]):
        self.inner = inner
        self._labels_for = labels_for

    def run(self, cmd: str | None = None, timeout: int = 120, exit_on_fail: bool = False,
            port_forward: Any = None, with_output: bool = False,
            environment_variables: dict[str, object] | None = None, run_env: str = "auto",
            ssh_options_override_ssh_key: str = "", shutdown_after_run: bool = False, **kwargs: Any) -> Any:
        env = environment_variables
        if env is not None and RESOURCES_ENV in env:
            declared = declared_labels(env.get(LABELS_ENV))
            labels = self._labels_for(declared)
            if labels is not None:
                env = {k: v for k, v in env.items() if k != LABELS_ENV}
                if labels:
                    env[LABELS_ENV] = dict(sorted(labels.items()))
                if labels != declared:
                    logger.info("starting Ray with the machine's labels %s (declared %s)", labels, declared)
        return self.inner.run(cmd, timeout=timeout, exit_on_fail=exit_on_fail, port_forward=port_forward,
                               with_output=with_output, environment_variables=env, run_env=run_env,
                               ssh_options_override_ssh_key=ssh_options_override_ssh_key,
                               shutdown_after_run=shutdown_after_run, **kwargs)

    def run_rsync_up(self, source: str, target: str, options: Any = None) -> None:
        self.inner.run_rsync_up(source, target, options)

    def run_rsync_down(self, source: str, target: str, options: Any = None) -> None:
        self.inner.run_rsync_down(source, target, options)

    def remote_shell_command_str(self) -> str:
        return str(self.inner.remote_shell_command_str())

    def run_init(self, *, as_head: bool, file_mounts: dict[str, str], sync_run_yet: bool) -> Any:
        return self.inner.run_init(as_head=as_head, file_mounts=file_mounts, sync_run_yet=sync_run_yet)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)
