"""`ray-nodeless convert` for Ray's `type: aws` YAMLs (`AwsConfig.swapin()`; the conversion is swapin/convert.py).

What is AWS's own: `InstanceType` pins a type; Ray's AWS provider fills `resources` itself (so Ray's YAMLs may omit
them); Ray's bootstrap gives a node type without ImageId (or with `latest_dlami`) the region's default AMI; and
Ray's examples still pin retired EC2 types the catalog (current offerings only) no longer lists.
"""
from __future__ import annotations

from typing import Any, Mapping

from ray_nodeless.core import catalog as catalog_mod
from ray_nodeless.providers.aws.images import LATEST_DLAMI, default_ami
from ray_nodeless.providers.swapin import KeyMapping, Note, SwapIn

# Retired / previous-generation EC2 types that Ray's examples and users still pin, which the catalog (current
# offerings only) no longer lists: name -> (vCPU, memory GiB, GPU model, GPU count, GPU memory GiB per GPU).
# Source: AWS EC2 documentation, "Previous generation instances" / accelerated computing specifications
# (https://aws.amazon.com/ec2/previous-generation/, https://docs.aws.amazon.com/ec2/latest/instancetypes/ac.html).
# Used only by `--free-instance-types`, to know the shape such a pin implies; never priced nor launched.
RETIRED_AWS_TYPES: dict[str, tuple[int, float, str, int, float]] = {
    "p2.xlarge": (4, 61, "K80", 1, 12),
    "p2.8xlarge": (32, 488, "K80", 8, 12),
    "p2.16xlarge": (64, 732, "K80", 16, 12),
    "g3s.xlarge": (4, 30.5, "M60", 1, 8),
    "g3.4xlarge": (16, 122, "M60", 1, 8),
    "g3.8xlarge": (32, 244, "M60", 2, 8),
    "g3.16xlarge": (64, 488, "M60", 4, 8),
    "p3.2xlarge": (8, 61, "V100", 1, 16),
    "p3.8xlarge": (32, 244, "V100", 4, 16),
    "p3.16xlarge": (64, 488, "V100", 8, 16),
}


def retired_aws_type(name: str) -> catalog_mod.InstanceType | None:
    """The shape of a retired EC2 type of RETIRED_AWS_TYPES, as an InstanceType (not in the catalog)."""
    spec = RETIRED_AWS_TYPES.get(name)
    if spec is None:
        return None
    vcpus, mem, model, count, gpu_mem = spec
    return catalog_mod.InstanceType(cloud="aws", name=name, family=name.split(".", 1)[0], vcpus=vcpus,
                                    memory_gib=mem, gpu_model=model, gpu_count=count, gpu_memory_gib=gpu_mem,
                                    machine_type=name)


def _ray_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("ray")
    except PackageNotFoundError:
        return "?"


class AwsSwapIn(SwapIn):
    ray_type = "aws"
    pin_key = "InstanceType"
    pin_keys = ("InstanceType",)
    ray_fills_resources = True
    unpinned_launch = "EC2 defaults to m1.small"
    keys = (
        KeyMapping("aws", "provider.availability_zone", "zones: the comma-separated zones (kept)",
                   "providers/aws/settings.py requirement_overrides"),
        KeyMapping("aws", "provider.aws_credentials", "boto3 Session arguments (kept)", "providers/aws/settings.py"),
        KeyMapping("aws", "provider.cache_stopped_nodes", "true cannot be honoured (instances are terminated, never "
                   "stopped): error; convert drops it with a note", "providers/aws/settings.py"),
        KeyMapping("aws", "node_config.InstanceType", "instance_types: [it] (pinned); --free-instance-types: its "
                   "CPUs, GPUs, GPU model and memory (retired types from RETIRED_AWS_TYPES; a GPU model no "
                   "offering has any more: any model)", "providers/aws/settings.py requirement_overrides"),
        KeyMapping("aws", "node_config.InstanceMarketOptions {MarketType: spot}", "capacity: [spot]; "
                   "SpotOptions.MaxPrice -> max_hourly_price; other market types / SpotOptions values: error",
                   "providers/aws/settings.py market_options"),
        KeyMapping("aws", "node_config.Placement.AvailabilityZone", "zones: [it]; AvailabilityZoneId: error",
                   "providers/aws/settings.py placement_zone"),
        KeyMapping("aws", "node_config.ImageId (absent or latest_dlami)", "Ray's DEFAULT_AMI for the region, "
                   "written out by convert (what Ray's bootstrap would use)", "providers/aws/swapin.py"),
        KeyMapping("aws", "node_config.<other RunInstances keys>", "passed to RunInstances as Ray passes them",
                   "providers/aws/launch_params.py"),
    )

    def settle_node_config(self, provider: Mapping[str, Any], node_config: dict[str, Any], key: str) -> list[Note]:
        """Ray's AWS bootstrap (`_check_ami`) gives a node type without ImageId, or with `latest_dlami`, the
        default AMI of the region; written out so that the converted YAML says what will boot."""
        image = node_config.get("ImageId")
        if ((image and str(image).lower() != LATEST_DLAMI) or "LaunchTemplate" in node_config
                or provider.get("image_id")):
            return []
        region = str(provider.get("region"))
        ami = default_ami(region)
        if ami is None:
            return []       # the checks name node_config.ImageId
        node_config["ImageId"] = ami
        return [(("node_config", "ImageId"),
                 f"{ami}: Ray's default AMI for {region} (what Ray's AWS bootstrap would use"
                 f"{' for latest_dlami' if image else ''}; Ray {_ray_version()})")]

    def pinned_type(self, node_config: Mapping[str, Any], catalog: catalog_mod.Catalog, key: str
                    ) -> catalog_mod.InstanceType | None:
        name = str(node_config["InstanceType"])
        return catalog.instance_type("aws", name) or retired_aws_type(name)

    def off_catalog_shape(self, name: str) -> catalog_mod.InstanceType | None:
        return retired_aws_type(name)

    def off_catalog_note(self, t: catalog_mod.InstanceType, catalog: catalog_mod.Catalog) -> str | None:
        if catalog.instance_type("aws", t.name) is not None:
            return None
        gpus = f", {t.gpu_count}x{t.gpu_model}" if t.gpu_count else ""
        return (f"{t.name} is a retired EC2 type (not in the catalog, so neither priced nor launched): its shape is "
                f"taken from AWS's previous-generation specifications ({t.vcpus:g} vCPU, {t.memory_gib:g} GiB{gpus})")
