"""A node type's AMI as Ray's AWS bootstrap (`_check_ami`) settles it, before any API call: an explicit ImageId,
else provider.image_id, else Ray's default AMI of the region (its `DEFAULT_AMI` map, read without importing Ray:
ray_compat/aws_amis.py). No boto3 and no Ray import (`ray-nodeless plan` runs this).
"""
from __future__ import annotations

import logging
from typing import Any

from ray_nodeless.errors import ConfigError
from ray_nodeless.ray_compat.aws_amis import default_ami, ray_default_amis  # noqa: F401 (API)

logger = logging.getLogger(__name__)

# Ray's special ImageId value meaning "the default Deep Learning AMI of the region".
LATEST_DLAMI = "latest_dlami"


def fill_default_images(config: dict[str, Any], region: str, image_id: str | None) -> None:
    """Settle every node type's AMI without an API call, as Ray's `_check_ami` does: an empty ImageId or
    `latest_dlami` becomes `image_id` (provider.image_id, when set) or Ray's default AMI of `region`; with neither
    it is a ConfigError naming the key. Node types with a LaunchTemplate are settled after the template is read.
    Plain values, not AwsSettings: settings.py's AwsConfig calls this (no import cycle)."""
    types_ = config.get("available_node_types")
    if not isinstance(types_, dict):
        return                              # the config checks name the key
    for name, nt in types_.items():
        nc = nt.setdefault("node_config", {}) if isinstance(nt, dict) else None
        if not isinstance(nc, dict):
            continue
        ami = str(nc.get("ImageId") or "").strip()
        if ami and ami.lower() != LATEST_DLAMI:
            continue
        if not ami and "LaunchTemplate" in nc:
            continue
        if not ami and image_id:
            continue                        # the backend uses provider.image_id for it
        fallback = (image_id if ami.lower() != LATEST_DLAMI else None) or default_ami(region)
        if not fallback:
            raise ConfigError(
                f"available_node_types.{name}.node_config.ImageId",
                f"no AMI: {'latest_dlami' if ami else 'no ImageId'} and Ray has no default AMI for region "
                f"{region!r} (it has one for {sorted(ray_default_amis())}); set node_config.ImageId (or "
                "provider.image_id) to an AMI of that region")
        nc["ImageId"] = fallback
        logger.info("%s: ImageId %s (Ray's default AMI for %s)", name, fallback, region)
