"""A node type's AMI as Ray's AWS bootstrap (`_check_ami`) settles it, before any API call: an explicit ImageId,
else provider.image_id, else Ray's default AMI of the region (its `DEFAULT_AMI` map).

No boto3 and no Ray import (`ray-nodeless plan` runs this): Ray's `DEFAULT_AMI` is read from the installed Ray's own
source (`ray/autoscaler/_private/aws/config.py`, a literal dict) unless that module is already imported, in which
case its live value is used. tests/providers/aws/test_aws_images.py checks both readings agree.
"""
from __future__ import annotations

import ast
import functools
import importlib.util
import logging
import re
import sys
from pathlib import Path
from typing import Any

from ray_nodeless.errors import ConfigError
from ray_nodeless.providers.aws.settings import AwsSettings

logger = logging.getLogger(__name__)

# Ray's special ImageId value meaning "the default Deep Learning AMI of the region".
LATEST_DLAMI = "latest_dlami"
RAY_AWS_CONFIG_MODULE = "ray.autoscaler._private.aws.config"


def ray_default_amis() -> dict[str, str]:
    """The installed Ray's DEFAULT_AMI (region -> AMI)."""
    module = sys.modules.get(RAY_AWS_CONFIG_MODULE)
    if module is not None:
        return dict(module.DEFAULT_AMI)
    return dict(_default_amis_from_source())


@functools.cache
def _default_amis_from_source() -> dict[str, str]:
    spec = importlib.util.find_spec("ray")
    path = Path(spec.origin).parent / "autoscaler" / "_private" / "aws" / "config.py" if spec and spec.origin else None
    try:
        text = path.read_text(encoding="utf-8") if path else ""
        m = re.search(r"^DEFAULT_AMI\s*=\s*(\{.*?^\})", text, re.M | re.S)
        value = ast.literal_eval(m.group(1)) if m else None
    except (OSError, ValueError, SyntaxError):
        value = None
    if not isinstance(value, dict):
        # Not a literal any more (a Ray change): ask Ray itself.
        from ray.autoscaler._private.aws.config import DEFAULT_AMI
        value = DEFAULT_AMI
    return dict(value)


def default_ami(region: str) -> str | None:
    """Ray's default AMI for `region` (its DEFAULT_AMI map), or None."""
    return ray_default_amis().get(region)


def fill_default_images(config: dict[str, Any], settings: AwsSettings) -> None:
    """Settle every node type's AMI without an API call, as Ray's `_check_ami` does: an empty ImageId or
    `latest_dlami` becomes provider.image_id (when set) or Ray's default AMI of the region; with neither it is a
    ConfigError naming the key. Node types with a LaunchTemplate are settled after the template is read."""
    region = settings.region
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
        if not ami and settings.image_id:
            continue                        # the backend uses provider.image_id for it
        fallback = (settings.image_id if ami.lower() != LATEST_DLAMI else None) or default_ami(region)
        if not fallback:
            raise ConfigError(
                f"available_node_types.{name}.node_config.ImageId",
                f"no AMI: {'latest_dlami' if ami else 'no ImageId'} and Ray has no default AMI for region "
                f"{region!r} (it has one for {sorted(ray_default_amis())}); set node_config.ImageId (or "
                "provider.image_id) to an AMI of that region")
        nc["ImageId"] = fallback
        logger.info("%s: ImageId %s (Ray's default AMI for %s)", name, fallback, region)
