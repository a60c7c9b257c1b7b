"""What a backend tells `ray-nodeless convert` about Ray's own YAMLs for its cloud (`BackendConfig.swapin()`).

`swapin/convert.py` and `swapin/keymap.py` do the conversion for any cloud; everything that differs between Ray's
AWS and GCP YAMLs (the key that pins an instance type, the bootstrap-time fill-ins Ray would make, instance types
the catalog does not list but whose shape is known, the cloud-only provider keys) is a `SwapIn` of the backend,
in `providers/<cloud>/swapin.py`. No Ray and no cloud SDK here: the strategies read the node_config as written.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Mapping

from ray_nodeless.core import catalog as catalog_mod

# A note for the user at a key below the node type (`("node_config", "ImageId")`): shown in the report and written
# as a comment at that key of the converted YAML.
Note = tuple[tuple[str, ...], str]


@dataclass(frozen=True)
class KeyMapping:
    """One row of the key table (docs, converter notes, tests): a Ray key and what ray_nodeless makes of it."""

    cloud: str            # a backend name, or "both" for rows every cloud shares
    ray_key: str          # as written in a Ray cluster YAML
    meaning: str          # what ray_nodeless makes of it
    where: str            # the code that applies it (a path under ray_nodeless/, then what in it)


class SwapIn:
    """How a Ray cluster YAML of `type: <ray_type>` becomes a ray_nodeless one on this backend. Stateless; the
    defaults are those of a cloud whose Ray YAMLs need nothing special (no fill-ins, no off-catalog types)."""

    ray_type: ClassVar[str] = ""                # Ray's provider type: its defaults.yaml is what `ray up` merges
    pin_key: ClassVar[str] = ""                 # the node_config key that pins an instance type (named in errors)
    pin_keys: ClassVar[tuple[str, ...]] = ()    # the node_config keys removed when a pin is freed
    # Ray's own provider fills a node type's `resources` before Ray's schema (which requires the key) sees the
    # YAML (Ray's AWS provider does): convert writes `resources: {}` where the user left it out.
    ray_fills_resources: ClassVar[bool] = False
    unpinned_launch: ClassVar[str] = "no instance type"   # what Ray's own provider does with a node type unpinned
    keys: ClassVar[tuple[KeyMapping, ...]] = ()           # this cloud's rows of the key table

    def complete_provider(self, provider: dict[str, Any], project_id: str | None) -> None:
        """Finish the swapped provider block in place (`project_id`: convert's `--project-id`, for clouds that
        have projects); raise ConfigError naming the key for what Ray's own bootstrap would refuse too."""

    def settle_node_config(self, provider: Mapping[str, Any], node_config: dict[str, Any], key: str) -> list[Note]:
        """Write out (in place) what Ray's bootstrap would fill into this node_config at `ray up`, so that the
        converted YAML says what will boot; one note per change. `key` is the node_config's path."""
        return []

    def pinned_type(self, node_config: Mapping[str, Any], catalog: catalog_mod.Catalog, key: str
                    ) -> catalog_mod.InstanceType | None:
        """The instance type the node_config pins (the backend's own mapping decides that it pins one), with its
        shape: from the catalog, or from what the cloud documents for types it does not list. None: unknown."""
        return None

    def off_catalog_shape(self, name: str) -> catalog_mod.InstanceType | None:
        """The shape of an instance type the catalog does not list but convert knows (retired types), or None."""
        return None

    def off_catalog_note(self, t: catalog_mod.InstanceType, catalog: catalog_mod.Catalog) -> str | None:
        """Why a pinned type that `pinned_type` found is not a catalog type and where its shape came from."""
        return None

    def check_pinned(self, node_config: Mapping[str, Any], catalog: catalog_mod.Catalog, key: str
                     ) -> tuple[str, str] | None:
        """Static checks of a pin that is kept (ConfigError naming the key); returns (GPU model, key) of GPUs the
        node_config attaches apart from the instance type, which convert checks against the region's offerings."""
        return None
