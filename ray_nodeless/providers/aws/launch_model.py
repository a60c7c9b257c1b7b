"""node_config's RunInstances keys checked against EC2's own request model, before `ray up` creates anything.

botocore validates a request only when it is sent: a `BlockDeviceMappings` that is a mapping, a `UserData: 5` or an
`ImageId: 123` would pass every config check, then fail inside `create_node` (botocore's ParamValidationError, or
a raw TypeError from its UserData encoding) after `ray up` has started, or crash Ray's own AMI check. Here the same
model botocore uses (the RunInstances input shape: every nested structure, list and scalar type, the required
members) is walked over the node_config, and the first mismatch is a ConfigError naming the nested key
(`available_node_types.gpu.node_config.BlockDeviceMappings[0].Ebs.VolumeSize`).

The model comes from providers/aws/run_instances_keys.py (written by scripts/vendor_cloud_schemas.py, so a check
needs no botocore import) when the installed botocore is its version, else from botocore itself. On top of the
types, the ranges EC2 enforces and the model does not state (volume sizes, IOPS, UserData's 16 KB).
"""
from __future__ import annotations

import datetime
import functools
import importlib.util
import os
import re
from typing import Any, Mapping

from ray_nodeless.errors import ConfigError

# EC2's limits the botocore model does not carry (EC2 refuses these only at launch).
EBS_VOLUME_GIB = (1, 65536)           # io2 Block Express allows 64 TiB; gp3/gp2 16 TiB (EC2 checks per type)
USER_DATA_MAX_BYTES = 16 * 1024       # before base64 encoding
_POSITIVE_EBS = ("Iops", "Throughput")

_PYTHON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,), "integer": (int,), "long": (int,), "boolean": (bool,), "double": (int, float),
    "float": (int, float), "timestamp": (str, datetime.datetime), "blob": (str, bytes),
}


@functools.cache
def request_model() -> tuple[str, dict[str, tuple]]:
    """(root shape name, shapes) of RunInstances: vendored when it matches the installed botocore."""
    from ray_nodeless.providers.aws import run_instances_keys as vendored

    if installed_botocore_version() == vendored.BOTOCORE_VERSION and not _other_ec2_models():
        return vendored.RUN_INSTANCES_ROOT, vendored.RUN_INSTANCES_SHAPES
    import botocore.session

    root = botocore.session.get_session().get_service_model("ec2").operation_model("RunInstances").input_shape
    shapes: dict[str, tuple] = {}

    def walk(shape) -> None:
        if shape.name in shapes:
            return
        if shape.type_name == "structure":
            shapes[shape.name] = ("structure", {n: m.name for n, m in shape.members.items()},
                                  tuple(shape.required_members))
            for m in shape.members.values():
                walk(m)
        elif shape.type_name in ("list", "map"):
            inner = shape.member if shape.type_name == "list" else shape.value
            shapes[shape.name] = (shape.type_name, inner.name, ())
            walk(inner)
        else:
            shapes[shape.name] = (shape.type_name, "", ())

    walk(root)
    return root.name, shapes


def _type_name(v: Any) -> str:
    return type(v).__name__


def check_value(shapes: Mapping[str, tuple], shape: str, value: Any, key: str, top: bool = False) -> None:
    """ConfigError naming the nested key where `value` does not fit `shape` (botocore's own checks: types,
    unknown and missing members). At the top level, missing members are left to the caller (it sets them)."""
    kind, inner, required = shapes[shape]
    if kind == "structure":
        if not isinstance(value, Mapping):
            raise ConfigError(key, f"must be a mapping (EC2 {shape}), got {_type_name(value)} {value!r}")
        for name, v in value.items():
            if name not in inner:
                raise ConfigError(f"{key}.{name}", f"unknown key of EC2 {shape}; it takes "
                                                   f"{', '.join(sorted(inner))}")
            check_value(shapes, inner[name], v, f"{key}.{name}")
        if not top:
            for name in required:
                if name not in value:
                    raise ConfigError(f"{key}.{name}", f"missing: EC2 requires it in {shape}")
    elif kind == "list":
        if not isinstance(value, (list, tuple)):
            raise ConfigError(key, f"must be a list, got {_type_name(value)} {value!r}")
        for i, v in enumerate(value):
            check_value(shapes, inner, v, f"{key}[{i}]")
    elif kind == "map":
        if not isinstance(value, Mapping):
            raise ConfigError(key, f"must be a mapping, got {_type_name(value)} {value!r}")
        for k, v in value.items():
            check_value(shapes, inner, v, f"{key}.{k}")
    else:
        allowed = _PYTHON_TYPES.get(kind, (object,))
        if isinstance(value, bool) and bool not in allowed or not isinstance(value, allowed):
            raise ConfigError(key, f"must be {'an' if kind[0] in 'aeiou' else 'a'} {kind}, got "
                                   f"{_type_name(value)} {value!r}")


def check_launch_keys(params: Mapping[str, Any], key: str) -> None:
    """`params` (node_config's RunInstances keys) against the model and EC2's ranges; errors name `key`.<path>."""
    root, shapes = request_model()
    check_value(shapes, root, dict(params), key, top=True)
    for i, bdm in enumerate(params.get("BlockDeviceMappings") or []):
        ebs = bdm.get("Ebs") if isinstance(bdm, Mapping) else None
        if not isinstance(ebs, Mapping):
            continue
        where = f"{key}.BlockDeviceMappings[{i}].Ebs"
        size = ebs.get("VolumeSize")
        lo, hi = EBS_VOLUME_GIB
        if size is not None and not lo <= size <= hi:
            raise ConfigError(f"{where}.VolumeSize", f"{size} GiB: an EBS volume is {lo} to {hi} GiB")
        for name in _POSITIVE_EBS:
            if ebs.get(name) is not None and ebs[name] <= 0:
                raise ConfigError(f"{where}.{name}", f"must be > 0, got {ebs[name]}")
    for name in ("MinCount", "MaxCount", "Ipv6AddressCount"):
        if isinstance(params.get(name), int) and params[name] < 0:
            raise ConfigError(f"{key}.{name}", f"must be >= 0, got {params[name]}")
    data = params.get("UserData")
    if isinstance(data, str) and len(data.encode("utf-8", "surrogatepass")) > USER_DATA_MAX_BYTES:
        raise ConfigError(f"{key}.UserData", f"{len(data.encode('utf-8', 'surrogatepass'))} bytes; EC2 takes at "
                                             f"most {USER_DATA_MAX_BYTES} bytes of user data")


def installed_botocore_version() -> str | None:
    """botocore's version as installed (its __init__.py), read without importing it."""
    spec = importlib.util.find_spec("botocore")
    if spec is None or not spec.origin:
        return None
    try:
        with open(spec.origin, encoding="utf-8") as f:
            m = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)", f.read(), re.M)
    except OSError:
        return None
    return m.group(1) if m else None


def _other_ec2_models() -> bool:
    """Would botocore's loader find an EC2 model outside its own data directory (its search path: ~/.aws/models,
    then AWS_DATA_PATH's entries, then botocore/data)?"""
    paths = [os.path.expanduser(os.path.join("~", ".aws", "models"))]
    paths += [os.path.expanduser(p) for p in os.environ.get("AWS_DATA_PATH", "").split(os.pathsep) if p]
    return any(os.path.isdir(os.path.join(p, "ec2")) for p in paths)
