"""The parts of a KubeRay manifest that `convert` and Ray's derivation of the autoscaling config read, checked for
the types the RayCluster CRD gives them (ray-operator/config/crd/bases/ray.io_rayclusters.yaml: the API server
refuses a RayCluster that breaks them), so that a hostile manifest (a list where a mapping is, a number where a
string is, null) is refused with a ConfigError naming its key instead of ending in a Python traceback inside
convert or Ray. What a group's pod scheduling means is scheduling.py's (which checks the fields it reads itself).
Pure; imports nothing of kuberay/.
"""
from __future__ import annotations

import re
from typing import Any, Mapping

from ray_nodeless.errors import ConfigError

# A group's replica counts and per-group idle timeout: int32 >= 0 in the CRD.
GROUP_INTEGERS = ("replicas", "minReplicas", "maxReplicas", "numOfHosts", "idleTimeoutSeconds")
# Kubernetes' quantity grammar (apimachinery resource.Quantity: a signed decimal number, then a binary-SI, decimal-SI
# or exponent suffix), with the `K` Ray's parser also reads: what Ray's derivation parses a container's resources by.
_QUANTITY = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([KMGTPE]i|[numkKMGTPE]|[eE][+-]?\d+)?$")


def _type(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _mapping(value: Any, key: str, what: str = "a mapping") -> Mapping[str, Any]:
    """`value` when it is a mapping (null or absent: empty), else ConfigError naming `key`."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(key, f"must be {what}, got {_type(value)}")
    return value


def _integer(value: Any, key: str) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise ConfigError(key, f"must be an integer >= 0, got {value!r}")


def _no_null(m: Mapping[str, Any], keys: tuple[str, ...], key: str) -> None:
    """Ray reads these keys with a default for an absent one, and fails on a null: refused naming the key."""
    for k in keys:
        if k in m and m[k] is None:
            raise ConfigError(f"{key}.{k}", "is null: give a value or remove the key")


def check_names(metadata: Mapping[str, Any], key: str) -> None:
    """The metadata's name, generateName and namespace, when set, are non-empty strings (Ray names the cluster by
    the name)."""
    for k in ("name", "generateName", "namespace"):
        if k in metadata and not (isinstance(metadata[k], str) and metadata[k]):
            raise ConfigError(f"{key}.{k}", f"must be a non-empty string, got {metadata[k]!r}")


def _string_map(value: Any, key: str) -> None:
    """A map of strings (rayStartParams, a group's Ray `resources`): a number or boolean written unquoted is read
    as its text, as Ray reads it; a list, mapping or null value is refused."""
    for k, v in _mapping(value, key).items():
        if v is None or isinstance(v, (Mapping, list)):
            raise ConfigError(f'{key}["{k}"]', f"must be a string, got {_type(v)}")


def _quantities(value: Any, key: str) -> None:
    """A container's resource limits or requests: Kubernetes quantities (`4`, `500m`, `16Gi`)."""
    for k, v in _mapping(value, key).items():
        ok = (isinstance(v, (int, float)) and not isinstance(v, bool)) or \
            (isinstance(v, str) and _QUANTITY.match(v) is not None)
        if not ok:
            raise ConfigError(f'{key}["{k}"]', f"must be a Kubernetes quantity (4, 500m, 16Gi), got {v!r}")


def pod_spec(group: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    """A group's pod spec (`template.spec`): its containers a non-empty list of mappings whose resources are
    quantities (Ray reads the first container's); ConfigError naming the key otherwise."""
    template = group.get("template")
    if not isinstance(template, Mapping):
        raise ConfigError(f"{key}.template", f"must be a mapping (the group's pod template), got {_type(template)}")
    pod = template.get("spec")
    if not isinstance(pod, Mapping):
        raise ConfigError(f"{key}.template.spec", f"must be a mapping (the pod spec), got {_type(pod)}")
    ckey = f"{key}.template.spec.containers"
    containers = pod.get("containers")
    if not isinstance(containers, list) or not containers:
        raise ConfigError(ckey, "must be a non-empty list of containers")
    for i, c in enumerate(containers):
        if not isinstance(c, Mapping):
            raise ConfigError(f"{ckey}[{i}]", f"must be a mapping (a container), got {_type(c)}")
        _no_null(c, ("resources",), f"{ckey}[{i}]")
        resources = _mapping(c.get("resources"), f"{ckey}[{i}].resources")
        _no_null(resources, ("limits", "requests"), f"{ckey}[{i}].resources")
        for part in ("limits", "requests"):
            _quantities(resources.get(part), f"{ckey}[{i}].resources.{part}")
    return pod


def _group(g: Any, key: str) -> Mapping[str, Any]:
    """What a head or worker group shares: a mapping, Ray's start parameters and resources maps of strings, a
    valid pod spec."""
    if not isinstance(g, Mapping):
        raise ConfigError(key, f"must be a mapping (a group), got {_type(g)}")
    _no_null(g, ("rayStartParams", "resources", "labels") + GROUP_INTEGERS, key)
    _string_map(g.get("rayStartParams"), f"{key}.rayStartParams")
    _string_map(g.get("resources"), f"{key}.resources")
    pod_spec(g, key)
    return g


def check_group(g: Any, key: str) -> None:
    """A worker group (`workerGroupSpecs[i]` at `key`): a group with a name and counts that are integers."""
    _group(g, key)
    name = g.get("groupName")
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{key}.groupName", f"must be a non-empty string, got {name!r}")
    for k in GROUP_INTEGERS:
        _integer(g.get(k), f"{key}.{k}")


def head_image(spec: Mapping[str, Any], spec_key: str) -> str | None:
    """The head container's image (None: not set); the head group checked as the worker groups are."""
    key = f"{spec_key}.headGroupSpec"
    head = spec.get("headGroupSpec")
    if not isinstance(head, Mapping):
        raise ConfigError(key, f"must be a mapping (the head group), got {_type(head)}")
    image = pod_spec(_group(head, key), key)["containers"][0].get("image")
    if image is not None and not isinstance(image, str):
        raise ConfigError(f"{key}.template.spec.containers[0].image", f"must be a string, got {_type(image)}")
    return image


def check_autoscaler_options(spec: Mapping[str, Any], spec_key: str) -> None:
    """`autoscalerOptions` (convert keeps the user's options beside its own): a mapping, whose idle timeout Ray
    reads as seconds and whose image is a string."""
    key = f"{spec_key}.autoscalerOptions"
    opts = _mapping(spec.get("autoscalerOptions"), key)
    _no_null(opts, ("idleTimeoutSeconds",), key)
    _integer(opts.get("idleTimeoutSeconds"), f"{key}.idleTimeoutSeconds")
    image = opts.get("image")
    if image is not None and not isinstance(image, str):
        raise ConfigError(f"{key}.image", f"must be a string, got {_type(image)}")
