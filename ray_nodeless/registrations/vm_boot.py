"""The worker boot script for `disable_node_updaters: true` on a cloud: the machine starts Ray itself.

With node updaters disabled, nothing SSHes from the head to a new worker, so its user data (EC2) or startup
script (GCE) must run the worker's setup commands and `ray start --address=<head>` with the variables that Ray's
own installer would set. v2 matches a Ray node to its cloud instance by `RAY_CLOUD_INSTANCE_ID`, which is not known
before the launch: the script reads it from the instance metadata service (IMDSv2 on EC2, the metadata server on
GCE, whose instance name is our machine id).

On a spot machine the script also starts the interruption watcher (`ray_nodeless.interruptions.watch`) before
`ray start`, so a reclaimed machine drains its Ray node on the cloud's notice (off with
`provider.interruption_watcher: false`). It runs under the interpreter of the `ray` script when that interpreter
has ray_nodeless, else `python3`; a worker image without ray_nodeless boots as before, with a line in its log.
"""
from __future__ import annotations

import json
import shlex
from typing import Any

from ray_nodeless.providers import backend_config
from ray_nodeless.providers.base import LaunchSpec

BOOT_KEY = "worker_boot"     # filled by bootstrap_config: {"setup": [...], "start": [...]}

DEFAULT_START = "ray start --address=$RAY_HEAD_IP:{port}"
# Where the watcher's log and pid go (`RAY_NODELESS_RUN_DIR` overrides, for tests).
WATCHER_RUN_DIR = "${RAY_NODELESS_RUN_DIR:-/tmp}"
WATCHER_MODULE = "ray_nodeless.interruptions.watch"


def instance_id_snippet(cloud: str, var: str) -> str | None:
    """Bash lines setting `var` to the booting machine's id, from the backend's own hook
    (`BackendConfig.instance_id_snippet`: IMDSv2 on EC2, the metadata server on GCE); None when its machines cannot
    tell. The one source of it for every boot script (this one, the Kubernetes join user data)."""
    return backend_config(cloud).instance_id_snippet(var)


def boots_itself(cloud: str) -> bool:
    """Whether machines of `cloud` can run a boot script we write (they can read their own id)."""
    return instance_id_snippet(cloud, "RAY_CLOUD_INSTANCE_ID") is not None


def watcher_lines(cloud: str, gcs_port: int) -> list[str]:
    """Start the interruption watcher in the background, before `ray start` (a start command with --block would
    never return; the watcher finds its Ray node only when a notice comes). Without ray_nodeless next to Ray it
    says so and the boot goes on."""
    return [
        "# Spot interruption watcher: on the cloud's notice, drain this node in Ray (ray_nodeless.interruptions).",
        "RNL_STARTED=",
        'for RNL_PY in "$(sed -n \'1s/^#!//p\' "$(command -v ray || echo /dev/null)" 2>/dev/null || true)" python3; do',
        f"  if [ -n \"$RNL_PY\" ] && $RNL_PY -c 'import {WATCHER_MODULE}' 2>/dev/null; then",
        f"    nohup $RNL_PY -m {WATCHER_MODULE} --cloud {cloud} --gcs-address \"$RAY_HEAD_IP:{gcs_port}\" \\",
        f"      >\"{WATCHER_RUN_DIR}/ray-nodeless-watch.log\" 2>&1 </dev/null &",
        f"    echo $! >\"{WATCHER_RUN_DIR}/ray-nodeless-watch.pid\"",
        "    RNL_STARTED=1",
        "    break",
        "  fi",
        "done",
        '[ -n "$RNL_STARTED" ] || echo "ray_nodeless is not installed next to Ray: no spot interruption watcher" >&2',
    ]


def worker_boot_script(cloud: str, spec: LaunchSpec, head_ip: str, gcs_port: int,
                       boot: dict[str, Any] | None, interruption_watcher: bool = True) -> str:
    """A bash script that joins this machine to the cluster at head_ip:gcs_port as node type spec.node_type (and,
    on spot capacity with `interruption_watcher`, watches for the interruption notice)."""
    instance_id = instance_id_snippet(cloud, "RAY_CLOUD_INSTANCE_ID")
    if instance_id is None:
        raise ValueError(f"no boot script for cloud {cloud!r}: its machines cannot read their own id")
    boot = boot or {}
    setup = [str(c) for c in boot.get("setup") or []]
    start = [str(c) for c in boot.get("start") or []] or [DEFAULT_START.format(port=gcs_port)]
    resources = {k: v for k, v in sorted(spec.resources.items()) if k != "object_store_memory"}
    lines = [
        "#!/bin/bash",
        "# Written by ray_nodeless (disable_node_updaters: true): join the Ray cluster without SSH from the head.",
        "set -eu",
        instance_id,
        "export RAY_CLOUD_INSTANCE_ID",
        f"export RAY_NODE_TYPE_NAME={shlex.quote(spec.node_type)}",
        f"export RAY_CLOUD_INSTANCE_TYPE_NAME={shlex.quote(spec.offering.instance_type.name)}",
        f"export RAY_HEAD_IP={shlex.quote(head_ip)}",
        f"export RAY_OVERRIDE_RESOURCES={shlex.quote(json.dumps(resources, sort_keys=True))}",
    ]
    if spec.labels:
        lines.append(f"export RAY_OVERRIDE_LABELS={shlex.quote(json.dumps(spec.labels, sort_keys=True))}")
    lines += setup
    if interruption_watcher and spec.offering.capacity == "spot":
        lines += watcher_lines(cloud, gcs_port)
    lines += start
    return "\n".join(lines) + "\n"
