"""The installed Ray's own config preparation, called rather than copied: its per-cloud defaults merged exactly as
`ray up` merges them, and its own checks of a cluster YAML.

`ray up` gives `type: aws` / `type: gcp` the whole `ray/autoscaler/<cloud>/defaults.yaml` (a shallow merge: every
top-level key the YAML lacks comes from there, `available_node_types` included), but `type: external` only a
minimal dict. A converted YAML must therefore carry every key Ray would have merged in.
"""
from __future__ import annotations

import copy
import logging
from pathlib import Path
from typing import Any, Mapping

from ray_nodeless.errors import ConfigError
from ray_nodeless.providers import ray_provider_types
from ray_nodeless.ray_compat import defaults as ray_own

logger = logging.getLogger(__name__)



def ray_version() -> str:
    return ray_own.ray_version()


def defaults_path(ray_type: object) -> Path:
    """The installed Ray's defaults.yaml for its provider `type: <ray_type>`, found the way Ray finds it; only for
    a type a registered backend stands for (`BackendConfig.ray_provider_type`)."""
    types = ray_provider_types()
    path = ray_own.defaults_file(ray_type) if isinstance(ray_type, str) and ray_type in types else None
    if path is None:
        raise ConfigError("provider.type", f"{ray_type!r}: ray_nodeless converts Ray YAMLs for {sorted(types)}")
    return path


def defaults_text(cloud: str) -> str:
    return defaults_path(cloud).read_text(encoding="utf-8")


def merge_ray_defaults(config: Mapping[str, Any]) -> dict[str, Any]:
    """`config` merged with its cloud's defaults by Ray's own `fillout_defaults` (what `prepare_config` does first
    in `ray up`): top-level keys the YAML lacks come from defaults.yaml; legacy `head_node` / `worker_nodes`
    configs are rewritten and empty ones dropped, as Ray does. The setup-command merge and the per-node-type
    min/max workers that `prepare_config` adds next are left to `ray up` (baking them in would apply them twice)."""
    cloud = (config.get("provider") or {}).get("type")
    defaults_path(cloud)     # the error for a provider type that is not a Ray cloud
    try:
        return ray_own.fillout_defaults(copy.deepcopy(dict(config)))
    except (KeyError, TypeError, ValueError, AssertionError, AttributeError) as e:
        raise ConfigError("cluster", f"Ray's own merge of its {cloud} defaults failed: {e!r}") from e


def ray_checks(config: Mapping[str, Any]) -> dict[str, Any]:
    """Ray's own path of `ray up` for a cluster YAML, up to the provider: `prepare_config` then `validate_config`
    (its JSON schema and cross-key checks). Returns the prepared config; failures are ConfigErrors naming the key."""
    import jsonschema

    try:
        prepared = ray_own.prepare_config(copy.deepcopy(dict(config)))
    except KeyError as e:
        key = str(e.args[0]) if e.args else "cluster"
        raise ConfigError(key, "missing: Ray's config preparation needs it") from e
    except (TypeError, ValueError, AssertionError, AttributeError) as e:
        raise ConfigError("cluster", f"Ray's config preparation refused it: {e}") from e
    try:
        ray_own.validate_config(prepared)
    except jsonschema.ValidationError as e:
        key = ".".join(str(p) for p in e.absolute_path) or "cluster"
        raise ConfigError(key, f"Ray's cluster schema refused it: {e.message}") from e
    except (ValueError, RuntimeError) as e:
        raise ConfigError("cluster", f"Ray refused it: {e}") from e
    return prepared
