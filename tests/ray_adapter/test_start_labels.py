"""Where Ray's updater starts Ray on a machine (VMs with updaters, every `ray up` head; autoscaler v1 and v2), the
labels it passes are the node type's declared ones: the runner the provider hands Ray makes the `ray.io/` keys the
machine's facts (ray_adapter/start_labels.py). Ray's own NodeUpdater drives it here, its start step as Ray runs
it, through a runner that records what would reach the machine (Ray's SSH runner needs one). The local cluster's
head through `ray up` is in tests/e2e/test_nodeless_demands.py (`test_autoscaler_v1_serves_every_shape_demand`)."""
from __future__ import annotations

import json
import subprocess
from typing import Any

from ray.autoscaler.command_runner import CommandRunnerInterface

from ray_nodeless.providers.base import TAG_CAPACITY, TAG_ZONE
from ray_nodeless.ray_adapter.provider import NodelessProvider
from ray_nodeless.ray_adapter.start_labels import LABELS_ENV, RESOURCES_ENV, FactLabelsRunner, declared_labels
from ray_nodeless.registrations.vm import BareVM
from ray_nodeless.testing import fake_backend
from tests.ray_adapter.test_provider import PROVIDER, WORKER_TAGS

AUTH = {"ssh_user": "ubuntu", "ssh_private_key": "/dev/null"}
LIE = {"ray.io/accelerator-type": "H100", "ray.io/market-type": "spot", "team": "ml"}


class Recording(CommandRunnerInterface):
    """What a machine would be asked to run: each command with its environment."""

    def __init__(self) -> None:
        self.calls: list[tuple[str | None, dict[str, object] | None]] = []

    def run(self, cmd=None, timeout=120, exit_on_fail=False, port_forward=None, with_output=False,
            environment_variables=None, run_env="auto", ssh_options_override_ssh_key="", shutdown_after_run=False):
        self.calls.append((cmd, environment_variables))
        return ""

    def remote_shell_command_str(self) -> str:
        return "ssh machine"


class Reaching(BareVM):
    def command_runner(self, *args: Any, **kw: Any) -> Recording:
        return self.runner

    runner = Recording()


def provider_with_a_cpu_machine() -> tuple[NodelessProvider, str, Recording]:
    fake_backend.reset()
    p = NodelessProvider(dict(PROVIDER), "c1")
    r = p.registration
    p.registration = Reaching(r.settings, r.cluster_name, r.core)
    p.registration.runner = Recording()
    tags = dict(WORKER_TAGS, **{"ray-user-node-type": "cpu_worker", "ray-launch-request": "r1"})
    [mid] = p.create_node_with_resources_and_labels({}, tags, 1, {"CPU": 2}, dict(LIE))
    return p, mid, p.registration.runner


def test_rays_updater_starts_a_machine_with_its_facts_as_labels():
    """Ray's own NodeUpdater, whole (wait for the machine, setup, start), as v1 and v2 run it per new node."""
    from ray.autoscaler._private.updater import NodeUpdater

    p, mid, rec = provider_with_a_cpu_machine()
    m = p.view.known(mid)
    assert m is not None
    updater = NodeUpdater(mid, dict(PROVIDER), p, AUTH, "c1", file_mounts={}, initialization_commands=[],
                          setup_commands=["echo setup"], ray_start_commands=["ray start --address=x"],
                          runtime_hash="h", file_mounts_contents_hash="", is_head_node=False,
                          node_resources={"CPU": 2}, node_labels=dict(LIE))
    assert isinstance(updater.cmd_runner, FactLabelsRunner)
    updater.run()
    assert p.node_tags(mid).get("ray-node-status") == "up-to-date", p.node_tags(mid)
    [(_, env)] = [(c, e) for c, e in rec.calls if c == "ray start --address=x"]
    assert env is not None and env[RESOURCES_ENV] == {"CPU": 2}
    labels = env[LABELS_ENV]
    assert isinstance(labels, dict)
    # the declared lies are gone: the machine is a CPU on-demand one in its zone; the user's own label stays
    assert "ray.io/accelerator-type" not in labels and labels["team"] == "ml"
    assert labels["ray.io/market-type"] == m.tags[TAG_CAPACITY] == "on-demand"
    assert labels["ray.io/availability-zone"] == m.tags[TAG_ZONE]
    assert labels["ray.io/availability-region"] == "us-west-2"
    # every other command ran as Ray made it: the wait for the machine and the setup command
    assert [(c, e) for c, e in rec.calls if c != "ray start --address=x"] == [("uptime", None), ("echo setup", None)]


def test_a_node_type_without_labels_gets_its_facts_too():
    p, mid, rec = provider_with_a_cpu_machine()
    runner = p.get_command_runner("", mid, AUTH, "c1", subprocess, True)
    runner.run("ray start", environment_variables={RESOURCES_ENV: {"CPU": 2}}, run_env="auto")
    [(_, env)] = rec.calls
    assert env is not None and set(env[LABELS_ENV]) == {  # type: ignore[arg-type]
        "ray.io/market-type", "ray.io/availability-zone", "ray.io/availability-region"}


def test_other_commands_and_unknown_machines_pass_as_ray_made_them():
    p, mid, rec = provider_with_a_cpu_machine()
    runner = p.get_command_runner("", mid, AUTH, "c1", subprocess, True)
    runner.run("pip install x", environment_variables=None)
    runner.run("echo", environment_variables={"A": 1})
    unknown = p.get_command_runner("", "fake-nobody", AUTH, "c1", subprocess, True)
    given = {RESOURCES_ENV: {"CPU": 1}, LABELS_ENV: {"ray.io/accelerator-type": "H100"}}
    unknown.run("ray start", environment_variables=dict(given))
    assert rec.calls == [("pip install x", None), ("echo", {"A": 1}), ("ray start", given)]
    assert runner.remote_shell_command_str() == "ssh machine"


def test_declared_labels_read_as_ray_passes_them():
    assert declared_labels({"a": 1}) == {"a": "1"}
    assert declared_labels(json.dumps({"a": "b"})) == {"a": "b"}
    assert declared_labels("") == declared_labels("not json") == declared_labels(None) == {}
