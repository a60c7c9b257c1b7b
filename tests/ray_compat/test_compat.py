"""The Ray names ray_compat relies on still exist in the installed Ray, and behave as compat assumes.

These fail on a Ray that renamed or moved one of them: the signal to update compat, before a user's `ray up` does.
"""
from __future__ import annotations

import ast
import importlib
import inspect
import sys
import time
from pathlib import Path

import pytest

from ray_nodeless import ray_compat as compat
from ray_nodeless.ray_compat import aws_bootstrap, gcs, process
from tests import REPO_ROOT


def _ray_names() -> list[tuple[str, str, str]]:
    out = []
    for name in compat.MODULES:
        module = importlib.import_module(f"ray_nodeless.ray_compat.{name}")
        out += [(name, m, a) for m, a in module.RAY_NAMES]
    return out


def test_every_compat_module_lists_its_ray_names():
    # Guards the test below: a module left out of MODULES (or with an empty list) would be checked vacuously.
    files = sorted(p.stem for p in Path(compat.__file__).parent.glob("*.py") if p.stem != "__init__")
    assert sorted(compat.MODULES) == files
    for name in compat.MODULES:
        assert importlib.import_module(f"ray_nodeless.ray_compat.{name}").RAY_NAMES, name


@pytest.mark.parametrize(("compat_module", "ray_module", "attribute"), _ray_names(),
                         ids=[f"{c}:{m}.{a}" for c, m, a in _ray_names()])
def test_ray_still_has(compat_module: str, ray_module: str, attribute: str):
    module = importlib.import_module(ray_module)
    assert hasattr(module, attribute), f"{ray_module}.{attribute} is gone: update ray_compat/{compat_module}.py"


def test_teardown_is_found_on_the_stack_of_rays_teardown_cluster():
    # in_teardown matches the function by name and module: a frame of that name in that module.
    assert not process.in_teardown()
    code = compile("def teardown_cluster(f):\n    return f()\n", "<ray>", "exec")
    namespace = {"__name__": process._TEARDOWN_MODULE}
    exec(code, namespace)
    assert namespace["teardown_cluster"](process.in_teardown) is True


def _argparse_flags(module: str) -> set[str]:
    """The flags the installed Ray's monitor script declares (`parser.add_argument("--x", ...)`, read with ast:
    the parser is built under `if __name__ == "__main__"`)."""
    source = Path(importlib.import_module(module).__file__).read_text()
    flags = set()
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument"
                and node.args and isinstance(node.args[0], ast.Constant)):
            flags.add(node.args[0].value)
    return flags


@pytest.mark.parametrize("module", process.MONITOR_MODULES)
def test_the_monitor_flags_read_are_the_installed_rays(module: str):
    assert set(process.MONITOR_FLAGS) <= _argparse_flags(module), module


def _rays_monitor_command(monkeypatch: pytest.MonkeyPatch, **kwargs) -> list[str]:
    """The command line the installed Ray starts its monitor with (services.start_monitor, the process not
    started)."""
    from ray._private import services

    seen: list[list[str]] = []
    monkeypatch.setattr(services, "start_ray_process", lambda command, *a, **k: seen.append(list(command)))
    services.start_monitor(**kwargs)
    [command] = seen
    return command


@pytest.mark.parametrize("v2", [False, True], ids=["v1", "v2"])
def test_rays_own_monitor_command_line_is_detected(monkeypatch: pytest.MonkeyPatch, v2: bool):
    command = _rays_monitor_command(monkeypatch, gcs_address="10.0.0.1:6379", logs_dir="/tmp/ray/session_x/logs",
                                    autoscaling_config="/home/ray/ray_bootstrap_config.yaml",
                                    stdout_filepath="/tmp/o", stderr_filepath="/tmp/e", autoscaler_v2=v2)
    assert command[1] == "-u"
    argv = command[2:]          # what sys.argv is in the monitor: python -u <script> <flags>
    assert process.monitor_args(argv) == process.MonitorArgs(
        gcs_address="10.0.0.1:6379", config_path="/home/ray/ray_bootstrap_config.yaml",
        logs_dir="/tmp/ray/session_x/logs")
    # Without --autoscaling-config (a cluster started by `ray start --head` with autoscaling): still the monitor.
    bare = _rays_monitor_command(monkeypatch, gcs_address="10.0.0.1:6379", logs_dir="/l", autoscaler_v2=v2)
    assert process.monitor_args(bare[2:]) == process.MonitorArgs("10.0.0.1:6379", None, "/l")


def test_other_processes_are_not_the_monitor(monkeypatch: pytest.MonkeyPatch):
    # The flag alone is not the monitor: `ray-nodeless kuberay-autoscaler --gcs-address ...` builds its own context.
    assert process.monitor_args(["/usr/bin/ray-nodeless", "kuberay-autoscaler", "--gcs-address", "h:1"]) is None
    assert process.monitor_args(["/usr/bin/ray", "up", "c.yaml"]) is None
    assert process.monitor_args(["/x/ray/autoscaler/_private/monitor.py"]) is None        # no GCS: not serving one
    assert process.monitor_args(["/x/ray/autoscaler/v2/monitor.py", "--gcs-address", "h:2"]).gcs_address == "h:2"
    monkeypatch.setattr(sys, "argv", ["/x/pytest", "--gcs-address=h:1"])
    assert process.monitor_args() is None


def test_teardown_cluster_of_the_installed_ray_bootstraps_then_builds_the_provider():
    # What in_teardown relies on: teardown_cluster is the function on the stack when Ray calls our bootstrap_config
    # and then lists through the provider it builds, and no argument of those calls says "teardown".
    from ray.autoscaler._private import commands

    source = inspect.getsource(commands.teardown_cluster)
    assert "_bootstrap_config(" in source and "_get_node_provider(" in source
    assert commands.__name__ == process._TEARDOWN_MODULE


def test_rays_aws_resources_take_credentials_and_endpoint_from_the_config():
    # What providers/aws/bootstrap.py relies on instead of replacing Ray's _resource: every keyword of
    # provider.aws_credentials reaches boto3.resource, endpoint_url included.
    creds = {"aws_access_key_id": "AKIDCOMPAT", "aws_secret_access_key": "s", "endpoint_url": "http://127.0.0.1:9"}
    with aws_bootstrap.ray_aws_steps() as steps:
        ec2 = steps.resource("ec2", {"provider": {"region": "us-west-2", "aws_credentials": creds}})
    assert ec2.meta.client.meta.endpoint_url == "http://127.0.0.1:9"
    assert ec2.meta.client.meta.region_name == "us-west-2"
    assert ec2.meta.client._request_signer._credentials.access_key == "AKIDCOMPAT"
    assert ec2.meta.client.meta.config.retries["total_max_attempts"] == aws_bootstrap.boto_max_retries() + 1


def test_rays_steps_take_one_config():
    with aws_bootstrap.ray_aws_steps() as steps:
        for field in ("launch_template", "network_interfaces", "iam_role", "key_pair", "subnet", "security_group",
                      "check_ami"):
            assert list(inspect.signature(getattr(steps, field)).parameters) == ["config"], field


def test_iam_propagation_wait_is_rays_time_sleep_and_is_replaced_only_inside_the_block():
    from ray.autoscaler._private.aws import config as rc

    # The wait this replaces is still Ray's `time.sleep(...)` in _configure_iam_role, through the module global.
    assert "time.sleep(" in inspect.getsource(rc._configure_iam_role)
    assert rc.time is time
    with aws_bootstrap.ray_aws_steps(wait_for_iam_propagation=False):
        started = time.monotonic()
        rc.time.sleep(15)
        assert time.monotonic() - started < 1
        assert rc.time.time is time.time
    assert rc.time is time
    with aws_bootstrap.ray_aws_steps(wait_for_iam_propagation=True):
        assert rc.time is time


def test_rays_aborts_are_what_the_steps_raise():
    from ray.autoscaler._private.cli_logger import cli_logger

    with pytest.raises(aws_bootstrap.aborts()):
        cli_logger.abort("no {}", "subnet")
    with pytest.raises(aws_bootstrap.aborts()):
        cli_logger.doassert(False, "no key pair")


def test_gcs_node_states_of_rays_protos():
    from ray.core.generated import gcs_pb2

    dead = gcs_pb2.GcsNodeInfo(state=gcs_pb2.GcsNodeInfo.DEAD)
    draining = gcs_pb2.GcsNodeInfo(state=gcs_pb2.GcsNodeInfo.ALIVE)
    draining.state_snapshot.state = gcs_pb2.NodeSnapshot.DRAINING
    alive = gcs_pb2.GcsNodeInfo(state=gcs_pb2.GcsNodeInfo.ALIVE)
    assert [gcs.node_state(i) for i in (dead, draining, alive)] == [gcs.DEAD, gcs.DRAINING, gcs.ALIVE]
    assert gcs.preemption_reason() != 0      # not DRAIN_NODE_REASON_UNSPECIFIED


def test_compat_imports_ray_only_when_called():
    """`ray-nodeless plan` may go through compat (Ray's default AMIs) and must not load Ray; only command_runner,
    whose one caller subclasses Ray's CommandRunnerInterface anyway, imports Ray when imported."""
    import json
    import subprocess

    lazy = [m for m in compat.MODULES if m != "command_runner"]
    code = ("import json, sys\n"
            + "".join(f"import ray_nodeless.ray_compat.{m}\n" for m in lazy)
            + "print(json.dumps(sorted(m for m in sys.modules if m == 'ray' or m.startswith('ray.'))))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
                         check=True)
    assert json.loads(out.stdout) == []


def test_rays_tag_keys_named_once_for_the_layers_without_ray_match_rays():
    from ray.autoscaler import tags

    from ray_nodeless.providers.base import TAG_RAY_NODE_KIND, TAG_RAY_USER_NODE_TYPE

    assert (TAG_RAY_NODE_KIND, TAG_RAY_USER_NODE_TYPE) == (tags.TAG_RAY_NODE_KIND, tags.TAG_RAY_USER_NODE_TYPE)
