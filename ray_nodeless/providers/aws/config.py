"""The AWS backend's config-time half (`AwsConfig`, see providers/base.py): its provider-block keys and node_config
checks (settings.py) and the hooks callers outside providers/ use instead of switching on the cloud's name. No
boto3, no botocore, no Ray: each hook's implementation is imported when the hook is called."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

from ray_nodeless.core.family_names import AWS_PREVIOUS_GENERATION, AWS_RETIRED_FAMILIES
from ray_nodeless.core.catalog.refresh import LiveCatalog
from ray_nodeless.core.node_resources import FillRule
from ray_nodeless.providers.aws import metadata
from ray_nodeless.providers.aws.ray_resources import AWS_FILL
from ray_nodeless.providers.aws.settings import AwsSettings, check_node_config, requirement_overrides
from ray_nodeless.providers.base import BackendConfig

if TYPE_CHECKING:
    from ray_nodeless.providers.swapin import SwapIn


class AwsConfig(BackendConfig):
    """The AWS backend's config-time half: AwsSettings, the checks of settings.py and the AWS hooks."""

    cloud = "aws"
    catalog_cloud = "aws"                  # priced by the catalog's aws offerings
    unlisted_families = AWS_RETIRED_FAMILIES
    previous_generation_families = AWS_PREVIOUS_GENERATION
    ray_provider_type = "aws"              # Ray's own `type: aws` provider (its defaults.yaml)
    settings_model = AwsSettings
    supports_interruption_queue = True          # EventBridge -> SQS spot interruption warnings

    @classmethod
    def check_node_config(cls, settings: AwsSettings, node_type: str, node_config: dict[str, Any],
                          key: str) -> None:
        check_node_config(settings, node_config, key)

    @classmethod
    def requirement_overrides(cls, settings: AwsSettings, node_config: dict[str, Any]) -> dict[str, Any]:
        return requirement_overrides(settings, node_config)

    @classmethod
    def fill_default_images(cls, settings: AwsSettings, cluster_config: dict[str, Any]) -> None:
        from ray_nodeless.providers.aws.images import fill_default_images

        fill_default_images(cluster_config, settings.region, settings.image_id)

    @classmethod
    def interruption_queue_client(cls, queue_url: str, settings: AwsSettings) -> Any:
        from ray_nodeless.providers.aws.interruption_queue import sqs_client   # boto3 only when a queue is set

        return sqs_client(queue_url, settings)

    @classmethod
    def interruption_source(cls, metadata_url: str | None) -> Any:
        return metadata.interruption_source(metadata_url)

    @classmethod
    def instance_id_snippet(cls, var: str) -> str | None:
        return metadata.instance_id_snippet(var)

    @classmethod
    def fill_rule(cls) -> FillRule:
        return AWS_FILL

    @classmethod
    def swapin(cls) -> SwapIn | None:
        from ray_nodeless.providers.aws.swapin import AwsSwapIn      # only `ray-nodeless convert` needs it

        return AwsSwapIn()

    @classmethod
    def plan_notes(cls, node_config: Mapping[str, Any]) -> list[str]:
        """An AWS launch template is read by `ray up` (bootstrap_config), which pins the InstanceType and spot
        market it sets; `plan` makes no API call and cannot read it, so it says so where that could change the
        plan."""
        ref = node_config.get("LaunchTemplate")
        if not isinstance(ref, dict) or "InstanceType" in node_config:
            return []
        which = ref.get("LaunchTemplateName") or ref.get("LaunchTemplateId") or "?"
        return [f"note: LaunchTemplate {which} is read by `ray up`: an InstanceType or spot InstanceMarketOptions "
                "it sets pins this node type then (this preview makes no API call and cannot read it)"]

    @classmethod
    def live_catalog(cls, settings: AwsSettings, region: str) -> LiveCatalog:
        from ray_nodeless.providers.aws.catalog import live_catalog   # reads the cloud only when fetched

        return live_catalog(region, session_kwargs=settings.session_kwargs() or None,
                            endpoint_url=settings.endpoint_url)
