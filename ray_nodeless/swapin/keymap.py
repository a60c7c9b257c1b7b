"""Ray's provider and node_config keys, and what each means to ray_nodeless.

The mapping itself is applied wherever a YAML is read (`requirement_overrides` / `check_node_config` of each
backend), so a hand-swapped YAML and a converted one mean the same. This module holds the table (for the docs,
the converter's notes and the tests: the rows every cloud shares here, each cloud's own from its backend's
`SwapIn`, providers/<cloud>/swapin.py) and answers "what would Ray's own provider launch for this node type", the
`before` of a conversion, through the very same mapping.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from ray_nodeless.core import catalog as catalog_mod
from ray_nodeless.core.schema import parse_section
from ray_nodeless.errors import ConfigError
from ray_nodeless.providers import backend_config, backend_names
from ray_nodeless.providers.swapin import KeyMapping, SwapIn

__all__ = ["SHARED", "KeyMapping", "RayLaunch", "cheapest_offering", "convertible", "implied_requirements",
           "ray_launch", "strategy", "table"]

# The rows every cloud shares ("both"); each cloud's own rows are its SwapIn's `keys`.
SHARED: tuple[KeyMapping, ...] = (
    KeyMapping("both", "provider.type: aws|gcp", "provider.type: external, module: ray_nodeless.NodelessProvider, "
               "cloud: aws|gcp (convert)", "swapin/convert.py"),
    KeyMapping("both", "provider.region", "the region planned and launched in (kept)", "core/settings.py"),
    KeyMapping("both", "available_node_types.<t>.resources", "the shape; filled from a pinned type as Ray's AWS "
               "provider fills it", "ray_adapter/bootstrap.py fillout_available_node_types_resources"),
    KeyMapping("both", "file_mounts, head_setup_commands", "kept; convert adds the plugin's wheel mount "
               "(~/ray_nodeless_wheel) and its install on the head, last", "operate/plugin_install.py install_on_head"),
    KeyMapping("both", "every other top-level key (setup_commands, docker, ...)", "kept; the ones "
               "Ray's defaults.yaml supplies are written out by convert", "swapin/ray_defaults.py"),
)


def convertible() -> list[str]:
    """The backends whose Ray YAMLs `ray-nodeless convert` reads (those with a SwapIn), by name."""
    return [name for name in backend_names() if backend_config(name).swapin() is not None]


def strategy(ray_type: Any) -> SwapIn:
    """The SwapIn of the backend that takes over Ray's provider `type: <ray_type>` (a backend is named after the
    Ray provider it replaces); ConfigError naming provider.type when there is none."""
    if isinstance(ray_type, str) and ray_type in backend_names():
        s = backend_config(ray_type).swapin()
        if s is not None:
            return s
    raise ConfigError("provider.type", f"{ray_type!r}: convert reads Ray YAMLs for "
                                       + " or ".join(f"`type: {c}`" for c in convertible()))


def table() -> tuple[KeyMapping, ...]:
    """The whole key table: the shared rows, then each convertible backend's own, by backend name."""
    swapins = [backend_config(name).swapin() for name in convertible()]
    return SHARED + tuple(m for s in swapins if s is not None for m in s.keys)   # convertible: each has one


@dataclass(frozen=True)
class RayLaunch:
    """What Ray's own provider launches for a node type: the pinned instance type (None: not pinned, Ray has no
    type to launch), its capacity type and the zones it may use (None: any)."""

    instance_type: str | None
    capacity: str
    zones: tuple[str, ...] | None


def implied_requirements(cloud: str, provider: Mapping[str, Any], node_config: Mapping[str, Any]) -> dict[str, Any]:
    """The requirement keys Ray's keys in `node_config` and `provider` (a ray_nodeless provider block) imply,
    through the backend's own mapping (`requirement_overrides`, what every YAML read goes through)."""
    cls = backend_config(cloud)
    return cls.requirement_overrides(parse_section(cls.settings_model, provider, "provider"), dict(node_config))


def ray_launch(cloud: str, provider: Mapping[str, Any], node_config: Mapping[str, Any]) -> RayLaunch:
    req = implied_requirements(cloud, provider, node_config)
    types = req.get("instance_types") or [None]
    zones = req.get("zones")
    return RayLaunch(instance_type=types[0], capacity=(req.get("capacity") or ["on-demand"])[0],
                     zones=tuple(zones) if zones is not None else None)


def cheapest_offering(catalog: catalog_mod.Catalog, cloud: str, region: str, launch: RayLaunch
                      ) -> catalog_mod.Offering | None:
    """The cheapest priced offering of the pinned type, capacity and zones (None when the catalog has none)."""
    if launch.instance_type is None:
        return None
    rc = catalog.region(cloud, region)
    best: catalog_mod.Offering | None = None
    best_price = 0.0
    for zone in rc.zones:
        if launch.zones is not None and zone not in launch.zones:
            continue
        o = rc.find(launch.instance_type, zone, launch.capacity)
        if o is not None and o.hourly_price is not None and (best is None or o.hourly_price < best_price):
            best, best_price = o, o.hourly_price
    return best
