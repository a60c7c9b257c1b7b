"""Ray's default AMI per region (`DEFAULT_AMI` of `ray.autoscaler._private.aws.config`), which its `_check_ami`
gives a node type without ImageId.

Read without importing Ray (`ray-nodeless plan` must stay fast): from the installed Ray's own source file, a literal
dict, unless that module is already imported, in which case its live value is used; if the source stops being a
literal, Ray is asked. tests/providers/test_vendored_schemas.py checks both readings agree.
"""
from __future__ import annotations

import ast
import functools
import importlib.util
import re
import sys
from pathlib import Path

RAY_AWS_CONFIG_MODULE = "ray.autoscaler._private.aws.config"
RAY_NAMES = ((RAY_AWS_CONFIG_MODULE, "DEFAULT_AMI"),)


def ray_default_amis() -> dict[str, str]:
    """The installed Ray's DEFAULT_AMI (region -> AMI)."""
    module = sys.modules.get(RAY_AWS_CONFIG_MODULE)
    if module is not None:
        return dict(module.DEFAULT_AMI)
    return dict(default_amis_from_source())


@functools.cache
def default_amis_from_source() -> dict[str, str]:
    """DEFAULT_AMI as written in the installed Ray's source (Ray imported only if it is not a literal there)."""
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
    """Ray's default AMI for `region`, or None."""
    return ray_default_amis().get(region)
