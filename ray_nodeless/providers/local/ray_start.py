"""The `ray start --block` command line and environment of one local worker node.

Log monitor: Ray starts one per node, and each publishes to every driver the files of *its node's* logs directory,
from their first line (`_private/log_monitor.py`: workers' output, and the autoscaler's `monitor.log` under v1 or
`events/event_AUTOSCALER.log` under v2). A local worker node joins the head's session on the same host, so its logs
directory *is* the head's (`<temp dir>/session_*/logs`, inherited through the GCS): with a log monitor of its own,
every node would publish the head's autoscaler log again, each new node replaying it from the start (one run: 92 % of
a driver's lines were such replays). Ray's own rule is one log monitor per physical host (`ray start
--include-log-monitor`); the head's publishes every file of the shared directory, the workers' output included,
once. A node given a temp dir of its own (`local_ray_start_args: [--temp-dir=...]`) has its own logs directory and
keeps its log monitor; so does one whose arguments set `--include-log-monitor` themselves.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any, Mapping

from ray_nodeless.errors import BackendError
from ray_nodeless.providers.base import LaunchSpec

# What `ray start` prints once the node runs: the node counts as started (its machine as running) from then on.
READY_MARKER = "Ray runtime started"
# Set in every node's environment (and so inherited by every Ray process of the node): lets a process be
# attributed to one node of one state dir, even after its group leader is gone and its pgid is reused.
MARKER_ENV = "NODELESS_LOCAL_NODE"

# Variables a parent process may carry that would change what the child `ray start` does. The head's monitor, for
# instance, inherits RAY_OVERRIDE_RESOURCES and RAY_CLOUD_INSTANCE_ID of the *head* from `ray up`.
SCRUBBED_ENV = (
    "RAY_ADDRESS", "RAY_OVERRIDE_RESOURCES", "RAY_OVERRIDE_LABELS", "RAY_CLOUD_INSTANCE_ID", "RAY_NODE_TYPE_NAME",
    "RAY_CLOUD_INSTANCE_TYPE_NAME", "RAY_OVERRIDE_NODE_ID_FOR_TESTING", "RAY_NODE_IP_ADDRESS",
)


# Arguments of `local_ray_start_args` after which the node keeps its own log monitor (see the module docstring).
OWN_LOG_DIR_ARGS = ("--temp-dir", "--include-log-monitor")


def ray_executable() -> str:
    """The `ray` script of the running interpreter's environment (the monitor and CLI run in the venv)."""
    candidate = Path(sys.executable).parent / "ray"
    if candidate.exists():
        return str(candidate)
    found = shutil.which("ray")
    if not found:
        raise BackendError("cannot find the `ray` executable next to the interpreter or on PATH")
    return found


def clean_environ() -> dict[str, str]:
    """This process's environment without what would steer a child `ray start` (SCRUBBED_ENV)."""
    return {k: v for k, v in os.environ.items() if k not in SCRUBBED_ENV}


def node_env(machine_id: str, node_type: str, marker: str, extra_env: Mapping[str, Any]) -> dict[str, str]:
    env = clean_environ()
    env.update({str(k): str(v) for k, v in extra_env.items()})
    # What autoscaler v2 matches a Ray node to its instance by (and what ThreadedRayInstaller would export).
    env["RAY_CLOUD_INSTANCE_ID"] = machine_id
    env["RAY_NODE_TYPE_NAME"] = node_type
    env[MARKER_ENV] = marker
    return env


def instance_env(spec: LaunchSpec) -> dict[str, str]:
    """Extra env of a node process: what ThreadedRayInstaller would export beside the instance id and type."""
    name = spec.offering.instance_type.name
    return {"RAY_CLOUD_INSTANCE_TYPE_NAME": name} if name else {}


def check_resources(machine_id: str, resources: Mapping[str, float]) -> None:
    for k in ("CPU", "GPU"):
        if k in resources and not float(resources[k]).is_integer():
            raise BackendError(f"local node {machine_id}: {k}={resources[k]} must be a whole number for `ray start`")


def ray_start_command(*, gcs_address: str, ip: str, ports: Mapping[str, int], resources: Mapping[str, float],
                      object_store_memory: int, labels_file: Path | None, extra_args: list[str]) -> list[str]:
    res = dict(resources)
    cpus = res.pop("CPU", 0)
    gpus = res.pop("GPU", 0)   # explicit 0: never let Ray autodetect the host's GPUs for an emulated VM
    memory = res.pop("memory", None)
    osm = res.pop("object_store_memory", None) or object_store_memory
    p = ports
    cmd = [
        ray_executable(), "start", "--block", "--disable-usage-stats",
        f"--address={gcs_address}",
        f"--node-ip-address={ip}",
        f"--num-cpus={int(cpus)}",
        f"--num-gpus={int(gpus)}",
        f"--object-store-memory={int(osm)}",
        f"--resources={json.dumps(res, separators=(',', ':'))}",
        f"--node-manager-port={p['node_manager']}",
        f"--object-manager-port={p['object_manager']}",
        f"--dashboard-agent-listen-port={p['dashboard_agent_listen']}",
        f"--dashboard-agent-grpc-port={p['dashboard_agent_grpc']}",
        f"--runtime-env-agent-port={p['runtime_env_agent']}",
        f"--metrics-export-port={p['metrics_export']}",
        f"--min-worker-port={p['min_worker']}",
        f"--max-worker-port={p['max_worker']}",
    ]
    if memory is not None:
        cmd.append(f"--memory={int(memory)}")
    if not any(a.split("=", 1)[0] in OWN_LOG_DIR_ARGS for a in extra_args):
        cmd.append("--include-log-monitor=False")    # the head's log monitor publishes this node's logs (above)
    if labels_file is not None:
        # JSON is YAML: --labels-file spares us quoting a "k=v,k=v" list. Ray validates keys and values itself
        # (Kubernetes-style); a bad label fails the start with its message in the log tail.
        cmd.append(f"--labels-file={labels_file}")
    return cmd + list(extra_args)
