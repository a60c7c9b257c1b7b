"""The worker boot script for `disable_node_updaters: true` on a cloud: the machine starts Ray itself.

With node updaters disabled, nothing SSHes from the head to a new worker, so its user data (EC2) or startup
script (GCE) must run the worker's setup commands and `ray start --address=<head>` with the variables that Ray's
own installer would set. v2 matches a Ray node to its cloud instance by `RAY_CLOUD_INSTANCE_ID`, which is not known
before the launch: the script reads it from the instance metadata service (IMDSv2 on EC2, the metadata server on
GCE, whose instance name is our machine id).
"""
from __future__ import annotations

import json
import shlex
from typing import Any

from ray_nodeless.providers.base import LaunchSpec

BOOT_KEY = "worker_boot"     # filled by bootstrap_config: {"setup": [...], "start": [...]}

_INSTANCE_ID = {
    "aws": ('TOKEN=$(curl -sf -X PUT http://169.254.169.254/latest/api/token '
            '-H "X-aws-ec2-metadata-token-ttl-seconds: 300")\n'
            'RAY_CLOUD_INSTANCE_ID=$(curl -sf -H "X-aws-ec2-metadata-token: $TOKEN" '
            'http://169.254.169.254/latest/meta-data/instance-id)'),
    "gcp": ('RAY_CLOUD_INSTANCE_ID=$(curl -sf -H "Metadata-Flavor: Google" '
            'http://metadata.google.internal/computeMetadata/v1/instance/name)'),
}
DEFAULT_START = "ray start --address=$RAY_HEAD_IP:{port}"


def worker_boot_script(cloud: str, spec: LaunchSpec, head_ip: str, gcs_port: int,
                       boot: dict[str, Any] | None) -> str:
    """A bash script that joins this machine to the cluster at head_ip:gcs_port as node type spec.node_type."""
    if cloud not in _INSTANCE_ID:
        raise ValueError(f"no boot script for cloud {cloud!r}")
    boot = boot or {}
    setup = [str(c) for c in boot.get("setup") or []]
    start = [str(c) for c in boot.get("start") or []] or [DEFAULT_START.format(port=gcs_port)]
    resources = {k: v for k, v in sorted(spec.resources.items()) if k != "object_store_memory"}
    lines = [
        "#!/bin/bash",
        "# Written by ray_nodeless (disable_node_updaters: true): join the Ray cluster without SSH from the head.",
        "set -eu",
        _INSTANCE_ID[cloud],
        "export RAY_CLOUD_INSTANCE_ID",
        f"export RAY_NODE_TYPE_NAME={shlex.quote(spec.node_type)}",
        f"export RAY_CLOUD_INSTANCE_TYPE_NAME={shlex.quote(spec.offering.instance_type.name)}",
        f"export RAY_HEAD_IP={shlex.quote(head_ip)}",
        f"export RAY_OVERRIDE_RESOURCES={shlex.quote(json.dumps(resources, sort_keys=True))}",
    ]
    if spec.labels:
        lines.append(f"export RAY_OVERRIDE_LABELS={shlex.quote(json.dumps(spec.labels, sort_keys=True))}")
    lines += setup + start
    return "\n".join(lines) + "\n"
