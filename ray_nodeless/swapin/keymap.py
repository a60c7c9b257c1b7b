"""Ray's provider and node_config keys, and what each means to ray_nodeless.

The mapping itself is applied wherever a YAML is read (`requirement_overrides` / `check_node_config` of each
backend), so a hand-swapped YAML and a converted one mean the same. This module holds the table (for the docs,
the converter's notes and the tests) and answers "what would Ray's own provider launch for this node type", the
`before` of a conversion, through the very same mapping.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from ray_nodeless.core import catalog as catalog_mod
from ray_nodeless.core.schema import parse_section


@dataclass(frozen=True)
class KeyMapping:
    cloud: str            # aws | gcp | both
    ray_key: str          # as written in a Ray cluster YAML
    meaning: str          # what ray_nodeless makes of it
    where: str            # the code that applies it


KEYMAP: tuple[KeyMapping, ...] = (
    KeyMapping("both", "provider.type: aws|gcp", "provider.type: external, module: ray_nodeless.NodelessProvider, "
               "cloud: aws|gcp (convert)", "swapin/convert.py"),
    KeyMapping("both", "provider.region", "the region planned and launched in (kept)", "core/settings.py"),
    KeyMapping("aws", "provider.availability_zone", "zones: the comma-separated zones (kept)",
               "providers/aws/settings.py requirement_overrides"),
    KeyMapping("gcp", "provider.availability_zone", "zones: that zone (a comma-separated list is accepted; kept)",
               "providers/gcp/node_config.py requirement_overrides"),
    KeyMapping("gcp", "provider.project_id", "the project (kept; null is an error, as in Ray's bootstrap)",
               "providers/gcp/settings.py"),
    KeyMapping("aws", "provider.aws_credentials", "boto3 Session arguments (kept)", "providers/aws/settings.py"),
    KeyMapping("aws", "provider.cache_stopped_nodes", "true cannot be honoured (instances are terminated, never "
               "stopped): error; convert drops it with a note", "providers/aws/settings.py"),
    KeyMapping("gcp", "provider.cache_stopped_nodes", "true cannot be honoured (VMs are deleted, never stopped): "
               "error; convert drops it with a note", "providers/gcp/settings.py"),
    KeyMapping("gcp", "provider.gcp_credentials", "the clients' credentials, built as Ray builds them "
               "(service_account: the key's JSON; credentials_token: an access token) (kept)",
               "providers/gcp/settings.py GcpCredentials"),
    KeyMapping("aws", "node_config.InstanceType", "instance_types: [it] (pinned); --free-instance-types: its "
               "CPUs, GPUs, GPU model and memory (retired types from convert's RETIRED_AWS_TYPES; a GPU model no "
               "offering has any more: any model)", "providers/aws/settings.py requirement_overrides"),
    KeyMapping("aws", "node_config.InstanceMarketOptions {MarketType: spot}", "capacity: [spot]; "
               "SpotOptions.MaxPrice -> max_hourly_price; other market types / SpotOptions values: error",
               "providers/aws/settings.py market_options"),
    KeyMapping("aws", "node_config.Placement.AvailabilityZone", "zones: [it]; AvailabilityZoneId: error",
               "providers/aws/settings.py placement_zone"),
    KeyMapping("aws", "node_config.ImageId (absent or latest_dlami)", "Ray's DEFAULT_AMI for the region, "
               "written out by convert (what Ray's bootstrap would use)", "swapin/convert.py"),
    KeyMapping("aws", "node_config.<other RunInstances keys>", "passed to RunInstances as Ray passes them",
               "providers/aws/launch_params.py"),
    KeyMapping("gcp", "node_config.machineType", "instance_types: [it] (pinned); custom-N-M: error (the catalog "
               "has no per-vCPU / per-GB rates); --free-instance-types: its shape (custom-N-M: N vCPU, M MiB; a "
               "GPU model no offering has any more: any model)",
               "providers/gcp/node_config.py requirement_overrides"),
    KeyMapping("gcp", "node_config.guestAccelerators", "GPU model and count of the pinned type "
               "(`n1-standard-8+1xT4`); more than one entry, or one beside a machine type with built-in GPUs: "
               "error", "providers/gcp/node_config.py pinned_machine"),
    KeyMapping("gcp", "node_config.scheduling (map, or Ray's list form)", "merged; preemptible: true / "
               "provisioningModel: SPOT -> capacity: [spot]; false / STANDARD -> [on-demand]; "
               "instanceTerminationAction other than DELETE, automaticRestart or MIGRATE on spot: error",
               "providers/gcp/node_config.py scheduling_map / scheduling_capacity"),
    KeyMapping("gcp", "node_config.<other Instance fields>", "passed to instances.insert as Ray passes them",
               "providers/gcp/instance_body.py"),
    KeyMapping("both", "available_node_types.<t>.resources", "the shape; filled from a pinned type as Ray's AWS "
               "provider fills it", "ray_adapter/bootstrap.py fillout_available_node_types_resources"),
    KeyMapping("both", "file_mounts, head_setup_commands", "kept; convert adds the plugin's wheel mount "
               "(~/ray_nodeless_wheel) and its install on the head, last", "launch/plugin_install.py install_on_head"),
    KeyMapping("both", "every other top-level key (setup_commands, docker, ...)", "kept; the ones "
               "Ray's defaults.yaml supplies are written out by convert", "swapin/ray_defaults.py"),
)


@dataclass(frozen=True)
class RayLaunch:
    """What Ray's own provider launches for a node type: the pinned instance type (None: not pinned, Ray has no
    type to launch), its capacity type and the zones it may use (None: any)."""

    instance_type: str | None
    capacity: str
    zones: tuple[str, ...] | None


def implied_requirements(cloud: str, provider: Mapping[str, Any], node_config: Mapping[str, Any]) -> dict[str, Any]:
    """The requirement keys Ray's keys in `node_config` and `provider` (a ray_nodeless provider block) imply,
    through the backend's own mapping."""
    if cloud == "aws":
        from ray_nodeless.providers.aws import settings as aws_settings

        parsed = parse_section(aws_settings.AwsSettings, provider, "provider")
        return aws_settings.requirement_overrides(parsed, node_config)
    if cloud == "gcp":
        from ray_nodeless.providers.gcp import node_config as gcp_node_config

        return gcp_node_config.requirement_overrides(node_config, provider)
    return {}


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
    best = None
    for zone in rc.zones:
        if launch.zones is not None and zone not in launch.zones:
            continue
        o = rc.find(launch.instance_type, zone, launch.capacity)
        if o is not None and o.hourly_price is not None and (best is None or o.hourly_price < best.hourly_price):
            best = o
    return best
