"""What Ray 2.60's `ray up` does to a cluster YAML before it imports any node provider, and the shapes it crashes
on there, named by key for `ray-nodeless plan`.

`create_or_update_cluster` reads `config["provider"]["type"]` and `config["cluster_name"]`, then `_bootstrap_config`
runs `prepare_config` (`fillout_defaults` with the external provider's MINIMAL_EXTERNAL_CONFIG,
`merge_setup_commands`, `validate_docker_config`, `fill_node_type_min_max_workers`) and hashes the prepared config
for its cache with `json.dumps([config], sort_keys=True)`; only then does it import `provider.module`. A KeyError,
TypeError or AttributeError in those steps is Ray's traceback under `ray up`, before a line of ray_nodeless runs, so
no plugin code can name it there. `plan` runs `check_ray_preparation` first (operate/config.py
`prepare_like_ray_up`) and names the key instead; tests/config/test_ray_preparation.py checks each shape against
the installed Ray's own crash.

Pure checks: nothing is imported from Ray (a cold `plan` stays fast) and the config is not changed. Where Ray's
steps go another way than modelled here (a provider type other than `external`, Ray's legacy head_node /
worker_nodes merge), the checks stop and the rest of `plan`'s validation answers.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ray_nodeless.errors import ConfigError

# ray/autoscaler/_private/providers.py MINIMAL_EXTERNAL_CONFIG: what fillout_defaults merges under a `type:
# external` config (it fills no setup commands and no max_workers).
EXTERNAL_DEFAULTS: dict[str, Any] = {"available_node_types": {"ray.head.default": {}, "ray.worker.default": {}},
                                     "head_node_type": "ray.head.default", "head_node": {}, "worker_nodes": {}}
SETUP_KEYS = ("setup_commands", "head_setup_commands", "worker_setup_commands")
# What `prepare_config` requires of a `type: external` YAML (KeyError / AssertionError in Ray without them).
RAY_REQUIRED_KEYS = (*SETUP_KEYS, "max_workers")
JSON_SCALARS = (str, int, float, bool, type(None))
_MISSING_TOP_KEY = ("missing: `ray up` needs this top-level key for `type: external` providers (Ray fills it only "
                    "for its own clouds); `ray-nodeless convert` writes a complete YAML")


def _kind(value: object) -> str:
    return {dict: "a mapping", list: "a list", str: "a string", type(None): "null"}.get(type(value),
                                                                                        type(value).__name__)


def check_ray_preparation(config: object) -> None:
    """ConfigError naming the key where Ray 2.60's `ray up` would crash on `config` before importing the provider
    (see the module docstring); returns when Ray's steps get through, or go a way not modelled here."""
    if not isinstance(config, Mapping):
        raise ConfigError("cluster", f"the file must hold a mapping of cluster keys, got {_kind(config)}")
    if "provider" not in config:
        raise ConfigError("provider", "missing (e.g. `provider: {type: external, module: "
                                      "ray_nodeless.NodelessProvider, ...}`)")
    provider = config["provider"]
    if not isinstance(provider, Mapping):
        raise ConfigError("provider", f"must be a mapping, got {_kind(provider)}")
    if "type" not in provider:
        # Ray picks the provider with config["provider"]["type"]: a KeyError before anything else.
        raise ConfigError("provider.type", "missing (`type: external` with `module: ray_nodeless.NodelessProvider`)")
    try:
        hash(provider["type"])
    except TypeError:
        raise ConfigError("provider.type", f"must be a string, got {_kind(provider['type'])}") from None
    if "cluster_name" not in config:
        raise ConfigError("cluster_name", "missing: Ray's `ray up` reads it before anything else (a KeyError in "
                                          "Ray unless `ray up --cluster-name NAME` gives it)")
    if provider["type"] != "external":
        return                   # Ray's own clouds' defaults: not modelled (prepare_like_ray_up refuses the type)
    if "available_node_types" not in config and ("head_node" in config or "worker_nodes" in config):
        return                   # Ray's legacy merge: not modelled
    merged = {**EXTERNAL_DEFAULTS, **config}
    merged.pop("min_workers", None)
    for k in ("head_node", "worker_nodes"):
        if k in merged and not merged[k]:
            del merged[k]
    _check_setup_commands(merged)
    if "docker" in merged:
        _check_docker(merged)
    if "max_workers" not in merged:
        raise ConfigError("max_workers", _MISSING_TOP_KEY)
    _check_node_types(merged["available_node_types"])
    found = json_fault(config)
    if found is not None:
        raise ConfigError(*found)


def _check_setup_commands(merged: Mapping[str, Any]) -> None:
    """merge_setup_commands: `setup_commands + head_setup_commands` and `+ worker_setup_commands`."""
    for k in SETUP_KEYS:
        if k not in merged:
            raise ConfigError(k, _MISSING_TOP_KEY)
    for k in SETUP_KEYS[1:]:
        try:
            _ = merged["setup_commands"] + merged[k]      # what Ray does: two strings add up too, and pass here
        except TypeError:
            bad = "setup_commands" if not isinstance(merged["setup_commands"], list) else k
            raise ConfigError(bad, f"must be a list of commands, got {_kind(merged[bad])} {merged[bad]!r}"[:300]
                              ) from None


def _check_docker(merged: Mapping[str, Any]) -> None:
    """validate_docker_config: every file_mounts source is tested as a path, then image and container name."""
    mounts = merged.get("file_mounts", {})
    if not isinstance(mounts, Mapping):
        raise ConfigError("file_mounts", f"must be a mapping of remote path to local path, got {_kind(mounts)}")
    for remote in mounts:
        if not isinstance(mounts[remote], str):
            raise ConfigError(f"file_mounts.{remote}", f"must be a local path (a string), got {_kind(mounts[remote])}")
    docker = merged["docker"]
    if not isinstance(docker, Mapping):
        raise ConfigError("docker", f"must be a mapping (image, container_name, ...), got {_kind(docker)}")
    image = docker.get("image")
    cname = docker.get("container_name")
    present = image or (docker.get("head_image", image) and docker.get("worker_image", image))
    if (cname or present) and not (cname and present):
        if not cname:
            raise ConfigError("docker.container_name", "missing: Ray needs a container name with a docker image")
        raise ConfigError("docker.image", "missing: Ray needs an image (or head_image and worker_image) with "
                                          "container_name")


def _check_node_types(types: object) -> None:
    """fill_node_type_min_max_workers: each node type gets setdefault('min_workers', 0)."""
    if isinstance(types, Mapping):
        for name in types:
            if not isinstance(types[name], Mapping):
                raise ConfigError(f"available_node_types.{name}", f"must be a mapping (node_config, resources, ...), "
                                                                  f"got {_kind(types[name])}")
    elif not (isinstance(types, (list, str)) and not types):       # Ray iterates over an empty list or string
        raise ConfigError("available_node_types", f"must be a mapping of node type name to node type, got "
                                                  f"{_kind(types)}")


def json_fault(value: object) -> tuple[str, str] | None:
    """(key, what) for the first place in `value` (in file order) where `json.dumps(..., sort_keys=True)` fails,
    or None. Iterative, and each mapping or list is visited once however many YAML aliases share it, so a config of
    shared anchors costs its distinct nodes, not its expansion."""
    stack: list[tuple[Any, str] | int] = [(value, "")]
    on_path: set[int] = set()
    done: set[int] = set()
    while stack:
        item = stack.pop()
        if isinstance(item, int):            # leaving a container
            on_path.discard(item)
            done.add(item)
            continue
        v, key = item
        if isinstance(v, (dict, list)):
            if id(v) in on_path:
                return key or "cluster", ("refers to itself (a YAML alias inside its own anchor): Ray's `ray up` "
                                          "cannot write it as JSON")
            if id(v) in done:
                continue
            on_path.add(id(v))
            stack.append(id(v))
            if isinstance(v, dict):
                bad = _key_fault(v, key)
                if bad is not None:
                    return bad
                children = [(v[k], f"{key}.{k}" if key else str(k)) for k in v]
            else:
                children = [(x, f"{key}[{n}]") for n, x in enumerate(v)]
            stack.extend(reversed(children))
        elif not isinstance(v, JSON_SCALARS):
            return key or "cluster", (f"{type(v).__name__} {v!r} cannot be written as JSON, which Ray's `ray up` "
                                      f"does with the whole config (quote it to make it a string)")[:400]
    return None


def _key_fault(mapping: dict[Any, Any], key: str) -> tuple[str, str] | None:
    odd = [k for k in mapping if not isinstance(k, str)]
    if not odd:
        return None
    where = f"{key}.{odd[0]}" if key else str(odd[0])
    try:
        sorted(mapping)
    except TypeError:
        return where, (f"a key must be a string, got {type(odd[0]).__name__} {odd[0]!r} (Ray's `ray up` sorts the "
                       f"keys of every mapping to hash the config; quote it)")
    bad = [k for k in odd if not isinstance(k, JSON_SCALARS)]
    if bad:
        where = f"{key}.{bad[0]}" if key else str(bad[0])
        return where, (f"a key must be a string, got {type(bad[0]).__name__} {bad[0]!r} (Ray's `ray up` writes the "
                       f"config as JSON)")
    return None
