"""The registration contract's command-runner hook (registrations/base.py `Registration.command_runner`): declared on
the base with Ray's `get_command_runner` arguments, None by default (Ray's SSH runner), and asked by the provider
when the backend has no runner of its own."""
from __future__ import annotations

import subprocess

from ray.autoscaler.command_runner import CommandRunnerInterface

from ray_nodeless.ray_adapter.provider import NodelessProvider
from ray_nodeless.ray_adapter.start_labels import FactLabelsRunner
from ray_nodeless.registrations.vm import BareVM
from ray_nodeless.testing import fake_backend
from tests.ray_adapter.test_provider import PROVIDER

AUTH = {"ssh_user": "ubuntu", "ssh_private_key": "/dev/null"}


class _Runner(CommandRunnerInterface):
    def __init__(self, node_id: str) -> None:
        self.node_id = node_id


class _RunnerRegistration(BareVM):
    """A registration that reaches its machines other than by SSH."""

    def command_runner(self, log_prefix, node_id, auth_config, cluster_name, process_runner, use_internal_ip,
                       docker_config=None):
        return _Runner(node_id)


def _provider() -> NodelessProvider:
    fake_backend.reset()
    return NodelessProvider(dict(PROVIDER), "c1")


def test_the_default_is_none_and_the_provider_uses_rays_ssh_runner():
    provider = _provider()
    assert isinstance(provider.registration, BareVM)
    assert provider.registration.command_runner("", "i-1", AUTH, "c1", subprocess, True) is None
    assert provider.backend.command_runner("", "i-1", AUTH, "c1", subprocess, True) is None
    runner = provider.get_command_runner("", "i-1", AUTH, "c1", subprocess, True)
    # Ray's runner, in the one that starts Ray with the machine's facts as labels (ray_adapter/start_labels.py)
    assert isinstance(runner, FactLabelsRunner) and isinstance(runner.inner, CommandRunnerInterface)
    assert type(runner.inner).__name__ == "SSHCommandRunner"


def test_a_registrations_runner_is_used_when_the_backend_has_none():
    provider = _provider()
    r = provider.registration
    provider.registration = _RunnerRegistration(r.settings, r.cluster_name, r.core)
    runner = provider.get_command_runner("", "i-1", AUTH, "c1", subprocess, True)
    assert isinstance(runner, FactLabelsRunner) and isinstance(runner.inner, _Runner) and runner.node_id == "i-1"
