"""Ray's AWS bootstrap steps (`ray.autoscaler._private.aws.config`), called with what they need.

Each step is `fn(config) -> config` on a Ray-shaped cluster config. Ray builds its boto3 resources from that
config alone (`_resource(name, config)`: `provider.region` and `provider.aws_credentials`, any keyword arguments of
`boto3.resource`, `endpoint_url` included), so the caller hands its credentials and endpoint in the config; nothing
of Ray's is replaced for that. Ray aborts a step with `cli_logger.abort` (a click.ClickException) or `doassert`
(an AssertionError): `ABORTS` lists them for the caller to catch.

One module global of Ray's is replaced, and only against a custom endpoint (moto, a proxy: there is no IAM
propagation to wait for): Ray's `time`, whose `sleep(15)` `_configure_iam_role` calls twice after creating the
instance profile and role. Ray offers no setting for that wait. The replacement lasts for one `ray_aws_steps`
block, under a lock; tests/ray_compat/test_compat.py checks the names it relies on still exist in the installed
Ray.
"""
from __future__ import annotations

import contextlib
import threading
import time
import types
from dataclasses import dataclass
from typing import Any, Callable, Iterator

RAY_AWS_CONFIG_MODULE = "ray.autoscaler._private.aws.config"
STEP_NAMES = ("_configure_from_launch_template", "_configure_from_network_interfaces", "_configure_iam_role",
              "_configure_key_pair", "_configure_subnet", "_configure_security_group", "_check_ami")
RAY_NAMES = tuple((RAY_AWS_CONFIG_MODULE, n) for n in STEP_NAMES + ("_resource", "_get_subnets_or_die", "time")) + (
    ("ray.autoscaler._private.aws.utils", "resource_cache"), ("ray.autoscaler._private.constants", "BOTO_MAX_RETRIES"))

_TIME_LOCK = threading.Lock()       # Ray's `time` global is replaced for the duration of one bootstrap

Step = Callable[[dict[str, Any]], dict[str, Any]]


@dataclass(frozen=True)
class RayAwsSteps:
    """The installed Ray's AWS bootstrap steps (see the module docstring)."""

    launch_template: Step           # reads node_config.LaunchTemplate into the node_config
    network_interfaces: Step        # subnets and security groups from node_config.NetworkInterfaces
    iam_role: Step                  # the head's instance profile and role (head_node.IamInstanceProfile)
    key_pair: Step                  # node_config.KeyName, auth.ssh_private_key
    subnet: Step                    # node_config.SubnetIds
    security_group: Step            # node_config.SecurityGroupIds
    check_ami: Callable[[dict[str, Any]], None]     # node_config.ImageId: Ray's default AMI of the region
    resource: Callable[[str, dict[str, Any]], Any]  # the boto3 resource Ray's steps use for this config


def aborts() -> tuple[type[BaseException], ...]:
    """What Ray's steps raise when they refuse a config (cli_logger.abort, cli_logger.doassert)."""
    import click

    return (click.ClickException, AssertionError)


def boto_max_retries() -> int:
    """The retries Ray's bootstrap resources make (its BOTO_MAX_RETRIES)."""
    from ray.autoscaler._private.constants import BOTO_MAX_RETRIES

    return int(BOTO_MAX_RETRIES)


@contextlib.contextmanager
def ray_aws_steps(wait_for_iam_propagation: bool = True) -> Iterator[RayAwsSteps]:
    """Ray's AWS bootstrap steps; with `wait_for_iam_propagation=False`, `_configure_iam_role` does not sleep."""
    from ray.autoscaler._private.aws import config as rc

    steps = RayAwsSteps(
        launch_template=rc._configure_from_launch_template, network_interfaces=rc._configure_from_network_interfaces,
        iam_role=rc._configure_iam_role, key_pair=rc._configure_key_pair, subnet=rc._configure_subnet,
        security_group=rc._configure_security_group, check_ami=rc._check_ami, resource=rc._resource)
    with contextlib.ExitStack() as stack:
        if not wait_for_iam_propagation:
            stack.enter_context(_TIME_LOCK)
            saved = rc.time
            # A stand-in for the `time` module Ray's config module imported: its IAM waits become no-ops.
            rc.time = types.SimpleNamespace(  # type: ignore[assignment]
                sleep=lambda _s: None, time=time.time, monotonic=time.monotonic)
            stack.callback(setattr, rc, "time", saved)
        # Ray caches subnet descriptions per resource for the process's lifetime: each bootstrap reads afresh.
        stack.callback(rc._get_subnets_or_die.cache_clear)
        yield steps
