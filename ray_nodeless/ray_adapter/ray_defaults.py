"""The top-level keys Ray reads after the head exists, filled with the installed Ray's own defaults for the cloud.

Ray merges its `aws/defaults.yaml` / `gcp/defaults.yaml` into a `type: aws|gcp` YAML before anything else; for
`type: external` it merges nothing (`_get_default_config` returns a minimal dict). A YAML whose provider block was
swapped by hand then lacks keys that Ray indexes with `config[key]` only after the head instance was launched
(`file_mounts`, `initialization_commands`, `head_start_ray_commands`, ...): `ray up` would die with a KeyError and
leave the head running. `fill_ray_defaults` fills each missing one from Ray's defaults of the same cloud.

What this cannot reach: Ray's `prepare_config` runs *before* any provider code, and for `type: external` it
raises `KeyError: 'setup_commands'` (or `head_setup_commands` / `worker_setup_commands`) when those are missing;
Ray's `validate_config` then raises "Missing 'cluster_synced_files' field ... try updating Ray" (misleading) when
that one is missing, unless the provider's `fillout_available_node_types_resources` (which Ray calls in between)
filled it. There is no hook before `prepare_config`: `ray-nodeless convert RAY_YAML` writes a complete YAML, and
`ray-nodeless plan` reports the missing key with that hint (`MISSING_KEY_HINT`).
"""
from __future__ import annotations

import copy
import logging
from typing import Any

from ray_nodeless.providers import backend_config, backend_names
from ray_nodeless.ray_compat.defaults import default_config

logger = logging.getLogger(__name__)

# Keys Ray reads with config[key] after bootstrap (commands.py, updater, autoscaler): filled when missing.
POST_LAUNCH_KEYS = ("file_mounts", "cluster_synced_files", "initialization_commands", "setup_commands",
                    "head_setup_commands", "worker_setup_commands", "head_start_ray_commands",
                    "worker_start_ray_commands")
MISSING_KEY_HINT = ("missing: `ray up` needs this top-level key for `type: external` providers (Ray fills it only "
                    "for its own clouds, before any provider code runs); `ray-nodeless convert` writes a complete "
                    "YAML")


def ray_defaults(cloud: str) -> dict[str, Any]:
    """The installed Ray's defaults.yaml of the provider Ray has for backend `cloud` (the backend config's
    `ray_provider_type`); {} for a backend Ray has no provider of (local, a test backend) or an unknown name."""
    ray_type = backend_config(cloud).ray_provider_type if cloud in backend_names() else None
    if ray_type is None:
        return {}
    return default_config({"type": ray_type})


def fill_ray_defaults(config: dict[str, Any]) -> list[str]:
    """Fill the missing POST_LAUNCH_KEYS and `auth` keys of `config` (in place) with Ray's defaults of the
    provider's cloud; for a cloud Ray has no defaults for, with empty values. Returns the keys filled."""
    raw_provider = config.get("provider")
    provider: dict[str, Any] = raw_provider if isinstance(raw_provider, dict) else {}
    cloud = provider.get("cloud", "local")
    defaults = ray_defaults(cloud)
    filled: list[str] = []
    for key in POST_LAUNCH_KEYS:
        if config.get(key) is not None:
            continue
        if key in defaults:
            value = copy.deepcopy(defaults[key])
        else:
            value = {} if key == "file_mounts" else []
        config[key] = value
        filled.append(key)
    auth = config.get("auth")
    if not isinstance(auth, dict):
        auth = config["auth"] = {}
        filled.append("auth")
    for k, v in (defaults.get("auth") or {}).items():
        if k not in auth:
            auth[k] = copy.deepcopy(v)
            filled.append(f"auth.{k}")
    if filled:
        logger.warning("filled %s from Ray's %s defaults (the YAML did not set them; `ray-nodeless convert` writes "
                       "a complete YAML)", ", ".join(filled), cloud if defaults else "empty")
    if "head_start_ray_commands" in filled and not config["head_start_ray_commands"]:
        logger.warning("head_start_ray_commands is empty: `ray up` will not start Ray on the head")
    return filled
