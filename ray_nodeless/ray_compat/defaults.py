"""Ray's per-cloud defaults (`ray/autoscaler/<cloud>/defaults.yaml`, as `ray up` finds and merges them) and its
own preparation and checks of a cluster YAML (`ray.autoscaler._private.util`), called rather than copied."""
from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Any, Iterator

_PROVIDERS = "ray.autoscaler._private.providers"
_UTIL = "ray.autoscaler._private.util"
RAY_NAMES = ((_PROVIDERS, "_DEFAULT_CONFIGS"), (_PROVIDERS, "_get_default_config"), (_UTIL, "fillout_defaults"),
             (_UTIL, "prepare_config"), (_UTIL, "validate_config"))
# Ray's config preparation logs every default it fills in through these.
CONFIG_LOGGERS = ("ray.autoscaler", _UTIL)


def ray_version() -> str:
    import ray

    return ray.__version__


def default_config(provider: dict[str, Any]) -> dict[str, Any]:
    """What `ray up` merges into a YAML with this provider block (a fresh dict: the whole defaults.yaml for Ray's
    own clouds, a minimal one for `type: external`)."""
    from ray.autoscaler._private.providers import _get_default_config

    return _get_default_config(provider)


def defaults_file(provider_type: str) -> Path | None:
    """The installed Ray's defaults.yaml for a provider type, found the way Ray finds it; None if it has none."""
    from ray.autoscaler._private.providers import _DEFAULT_CONFIGS

    if provider_type not in _DEFAULT_CONFIGS:
        return None
    return Path(_DEFAULT_CONFIGS[provider_type]())


def fillout_defaults(config: dict[str, Any]) -> dict[str, Any]:
    """Ray's `fillout_defaults` (the first step of `prepare_config`): its own errors propagate."""
    from ray.autoscaler._private.util import fillout_defaults as ray_fillout

    return ray_fillout(config)


def prepare_config(config: dict[str, Any]) -> dict[str, Any]:
    """Ray's `prepare_config`, as `ray up` runs it before any provider code: its own errors propagate."""
    from ray.autoscaler._private.util import prepare_config as ray_prepare

    return ray_prepare(config)


def validate_config(config: dict[str, Any]) -> None:
    """Ray's `validate_config` (its JSON schema and cross-key checks): jsonschema.ValidationError and Ray's own
    ValueError / RuntimeError propagate."""
    from ray.autoscaler._private.util import validate_config as ray_validate

    ray_validate(config)


@contextlib.contextmanager
def quiet_config_logs() -> Iterator[None]:
    """Ray's config preparation without its info lines (every default it fills in); errors still shown."""
    loggers = [logging.getLogger(n) for n in CONFIG_LOGGERS]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)
