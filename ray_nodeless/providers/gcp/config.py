"""The gcp backend's config-time half (`GcpConfig`, see providers/base.py): its provider-block keys (settings.py),
node_config checks (node_config.py) and the hooks callers outside providers/ use instead of switching on the
cloud's name. No Compute client, no Ray."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ray_nodeless.core.family_names import GCP_PREVIOUS_GENERATION, GCP_RETIRED_FAMILIES
from ray_nodeless.core.catalog.refresh import LiveCatalog
from ray_nodeless.core.node_resources import FillRule
from ray_nodeless.providers.base import BackendConfig
from ray_nodeless.providers.gcp import metadata
from ray_nodeless.providers.gcp.node_config import check_node_config, requirement_overrides
from ray_nodeless.providers.gcp.settings import GcpSettings

if TYPE_CHECKING:
    from ray_nodeless.providers.swapin import SwapIn

# Ray's GCP provider fills no resources of VM node types: a pinned node type that declares CPU or GPU stays as
# written; one that declares neither gets Ray's generic rule (otherwise the autoscaler could never scale it).
GCP_FILL = FillRule(declared_shape_kept=True)


class GcpConfig(BackendConfig):
    """The gcp backend's config-time half: GcpSettings, the checks of node_config.py and the GCP hooks."""

    cloud = "gcp"
    catalog_cloud = "gcp"                  # priced by the catalog's gcp offerings
    unlisted_families = GCP_RETIRED_FAMILIES
    previous_generation_families = GCP_PREVIOUS_GENERATION
    ray_provider_type = "gcp"              # Ray's own `type: gcp` provider (its defaults.yaml)
    settings_model = GcpSettings

    @classmethod
    def check_node_config(cls, settings: GcpSettings, node_type: str, node_config: dict[str, Any],
                          key: str) -> None:
        check_node_config(node_type, node_config, key, settings)

    @classmethod
    def requirement_overrides(cls, settings: GcpSettings, node_config: dict[str, Any]) -> dict[str, Any]:
        return requirement_overrides(node_config, settings)

    @classmethod
    def interruption_source(cls, metadata_url: str | None) -> Any:
        return metadata.interruption_source(metadata_url)

    @classmethod
    def instance_id_snippet(cls, var: str) -> str | None:
        return metadata.instance_id_snippet(var)

    @classmethod
    def fill_rule(cls) -> FillRule:
        return GCP_FILL

    @classmethod
    def swapin(cls) -> SwapIn | None:
        from ray_nodeless.providers.gcp.swapin import GcpSwapIn      # only `ray-nodeless convert` needs it

        return GcpSwapIn()

    @classmethod
    def live_catalog(cls, settings: GcpSettings, region: str) -> LiveCatalog:
        from ray_nodeless.providers.gcp.catalog import live_catalog_for   # reads the cloud only when fetched

        return live_catalog_for(settings, region)
