"""Ray's GCP bootstrap helpers (`ray.autoscaler._private.util`, `ray.autoscaler._private.gcp.config`): the SSH key
names and files Ray's `_configure_key_pair` uses, and its `_configure_iam_role` for the head's service account."""
from __future__ import annotations

from typing import Any

_UTIL = "ray.autoscaler._private.util"
_GCP_CONFIG = "ray.autoscaler._private.gcp.config"
RAY_NAMES = ((_UTIL, "generate_rsa_key_pair"), (_UTIL, "generate_ssh_key_name"), (_UTIL, "generate_ssh_key_paths"),
             (_GCP_CONFIG, "_configure_iam_role"))


def generate_rsa_key_pair() -> tuple[str, str]:
    """(public key, private key) as Ray generates them for a cluster's SSH key."""
    from ray.autoscaler._private.util import generate_rsa_key_pair as ray_generate

    return ray_generate()


def ssh_key_name(provider: str, index: int, region: str, project_id: str, ssh_user: str) -> str:
    from ray.autoscaler._private.util import generate_ssh_key_name

    return generate_ssh_key_name(provider, index, region, project_id, ssh_user)


def ssh_key_paths(key_name: str) -> tuple[str, str]:
    """(public key path, private key path) of `key_name`, where Ray keeps them (~/.ssh)."""
    from ray.autoscaler._private.util import generate_ssh_key_paths

    return generate_ssh_key_paths(key_name)


def configure_iam_role(config: dict[str, Any], crm: Any, iam: Any) -> dict[str, Any]:
    """Ray's `_configure_iam_role(config, crm, iam)`: the head's service account (head_node.serviceAccounts),
    created with its roles when missing, through the given Resource Manager and IAM discovery clients."""
    from ray.autoscaler._private.gcp import config as rc

    return rc._configure_iam_role(config, crm, iam)
