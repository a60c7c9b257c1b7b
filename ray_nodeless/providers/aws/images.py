"""A node type's AMI as Ray's AWS bootstrap (`_check_ami`) settles it, before any API call: an explicit ImageId,
else provider.image_id, else Ray's default AMI of the region (its `DEFAULT_AMI` map, read without importing Ray:
ray_compat/aws_amis.py). No boto3 and no Ray import (`ray-nodeless plan` runs this).
"""
from __future__ import annotations

import logging
from typing import Any

from ray_nodeless.core.requirements import OPEN_SHAPE_KEY
from ray_nodeless.errors import ConfigError
from ray_nodeless.ray_compat.aws_amis import default_ami, ray_default_amis  # noqa: F401 (API)

logger = logging.getLogger(__name__)

# Ray's special ImageId value meaning "the default Deep Learning AMI of the region".
LATEST_DLAMI = "latest_dlami"


def fill_default_images(config: dict[str, Any], region: str, image_id: str | None) -> None:
    """Settle every node type's AMI without an API call, as Ray's `_check_ami` does: an empty ImageId or
    `latest_dlami` becomes `image_id` (provider.image_id, when set) or Ray's default AMI of `region`; with neither
    it is a ConfigError naming the key. Node types with a LaunchTemplate are settled after the template is read.
    A shape-open cluster's template of generated types (`provider.open.node_config`) is settled the same way, so
    a generated type boots what a declared one would (a KubeRay cluster's groups get theirs here too).
    Plain values, not AwsSettings: settings.py's AwsConfig calls this (no import cycle)."""
    types_ = config.get("available_node_types")
    if not isinstance(types_, dict):
        return                              # the config checks name the key
    for name, nt in types_.items():
        nc = nt.setdefault("node_config", {}) if isinstance(nt, dict) else None
        if isinstance(nc, dict):
            _settle(nc, f"available_node_types.{name}.node_config.ImageId", name, region, image_id)
    template = _open_template(config, types_)
    if template is not None:
        _settle(template[0], template[1], "shape-open node types", region, image_id)


def _open_template(config: dict[str, Any], types_: dict[str, Any]) -> tuple[dict[str, Any], str] | None:
    """(the generated types' node_config, its key) of a shape-open cluster, made when absent; None otherwise."""
    provider = config.get("provider")
    if not isinstance(provider, dict):
        return None
    nested = provider.get("open")
    if isinstance(nested, dict):
        enabled, nc, key = nested.get("enabled"), nested.get("node_config"), "provider.open.node_config"
    else:
        enabled, nc, key = provider.get("open_shapes"), provider.get("open_node_config"), "provider.open_node_config"
    head = config.get("head_node_type")
    declared = [n for n, t in types_.items() if n != head and not (isinstance(t, dict) and
                                                                    OPEN_SHAPE_KEY in (t.get("node_config") or {}))]
    if enabled is False or (enabled is not True and declared):
        return None
    if nc is None:
        nc = {}
        if isinstance(nested, dict):
            nested["node_config"] = nc
        else:
            provider["open_node_config"] = nc
    return (nc, f"{key}.ImageId") if isinstance(nc, dict) else None


def _settle(nc: dict[str, Any], key: str, what: str, region: str, image_id: str | None) -> None:
    ami = str(nc.get("ImageId") or "").strip()
    if ami and ami.lower() != LATEST_DLAMI:
        return
    if not ami and "LaunchTemplate" in nc:
        return
    if not ami and image_id:
        return                              # the backend uses provider.image_id for it
    fallback = (image_id if ami.lower() != LATEST_DLAMI else None) or default_ami(region)
    if not fallback:
        raise ConfigError(
            key, f"no AMI: {'latest_dlami' if ami else 'no ImageId'} and Ray has no default AMI for region "
                 f"{region!r} (it has one for {sorted(ray_default_amis())}); set node_config.ImageId (or "
                 "provider.image_id) to an AMI of that region")
    nc["ImageId"] = fallback
    logger.info("%s: ImageId %s (Ray's default AMI for %s)", what, fallback, region)
