"""The RunInstances request of one LaunchSpec: node_config passed through, the offering's choices and our tags on
top. Every tag is set through TagSpecifications, on the instance and its volumes, so nothing exists untagged."""
from __future__ import annotations

import copy
import hashlib
import logging
import re
from typing import Any, Callable

from ray_nodeless.core.requirements import REQUIREMENT_KEYS
from ray_nodeless.errors import BackendError, ConfigError
from ray_nodeless.providers.aws.launch_model import check_launch_keys
from ray_nodeless.providers.aws.settings import MANAGED_KEYS
from ray_nodeless.providers.base import TAG_CLUSTER, LaunchSpec

logger = logging.getLogger(__name__)

# Tag carrying LaunchSpec.request_token on every instance and volume: the idempotency lookup key.
TAG_REQUEST = "nodeless-request"
# EC2 accepts a ClientToken of at most 64 ASCII characters.
CLIENT_TOKEN_MAX_LEN = 64
# The resource types our tags go on at creation (RunInstances can tag these two).
TAGGED_RESOURCES = ("instance", "volume")

_AZ_ID = re.compile(r"^[a-z]{2,5}\d+-az\d+$")     # use1-az1 (zone id) vs us-east-1a (zone name)


def client_token(request_token: str) -> str:
    """The request token as an EC2 ClientToken; a longer or non-ASCII one is hashed to 64 hex digits."""
    if request_token and len(request_token) <= CLIENT_TOKEN_MAX_LEN and request_token.isascii():
        return request_token
    return hashlib.sha256(request_token.encode()).hexdigest()


def instance_tags(spec: LaunchSpec, cluster_name: str) -> dict[str, str]:
    """Every tag of a machine of `spec`: its own tags, the cluster tag and the request token."""
    tags = {str(k): str(v) for k, v in spec.tags.items()}
    if tags.get(TAG_CLUSTER, cluster_name) != cluster_name:
        raise BackendError(f"LaunchSpec tag {TAG_CLUSTER}={tags[TAG_CLUSTER]!r} is not this backend's cluster "
                           f"{cluster_name!r}", category="WrongCluster")
    tags[TAG_CLUSTER] = cluster_name
    tags[TAG_REQUEST] = spec.request_token
    return tags


def merge_tag_specs(user_specs: list[dict[str, Any]], tags: dict[str, str]) -> list[dict[str, Any]]:
    """User TagSpecifications with our tags added to (and overriding them on) the instance and volume entries."""
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for spec in user_specs:
        rt = spec.get("ResourceType")
        if rt in TAGGED_RESOURCES:
            merged = {t["Key"]: t.get("Value", "") for t in spec.get("Tags", [])}
            merged.update(tags)
            out.append({"ResourceType": rt, "Tags": [{"Key": k, "Value": v} for k, v in merged.items()]})
            seen.add(rt)
        else:
            out.append(spec)
    for rt in TAGGED_RESOURCES:
        if rt not in seen:
            out.append({"ResourceType": rt, "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]})
    return out


def run_instances_params(spec: LaunchSpec, tags: dict[str, str], image_id: str | None,
                         subnet_for_zone: Callable[[str, list[str] | None], str | None]) -> dict[str, Any]:
    """The RunInstances request for `spec`, carrying `tags`. `image_id` is provider.image_id (used when
    node_config has no ImageId); `subnet_for_zone(zone, node_config's subnets)` picks the subnet."""
    nc = copy.deepcopy(spec.node_config)
    for k in list(nc):
        if k in REQUIREMENT_KEYS or k in MANAGED_KEYS:
            nc.pop(k)
    nc.pop("InstanceType", None)            # the offering decides; node_config's value was an allow-list
    off = spec.offering
    zone = off.zone

    if not nc.get("ImageId") and "LaunchTemplate" not in nc:
        if not image_id:
            raise ConfigError(f"available_node_types.{spec.node_type}.node_config.ImageId",
                              "no AMI: set node_config.ImageId (or provider.image_id)")
        nc["ImageId"] = image_id

    user_subnets = nc.pop("SubnetIds", None)
    if user_subnets is None and nc.get("SubnetId"):
        user_subnets = [nc.pop("SubnetId")]
    subnet = subnet_for_zone(zone, user_subnets)

    placement = dict(nc.pop("Placement", None) or {})
    placement.pop("AvailabilityZone", None)
    placement.pop("AvailabilityZoneId", None)
    placement["AvailabilityZoneId" if _AZ_ID.match(zone) else "AvailabilityZone"] = zone

    if nc.get("NetworkInterfaces"):
        # With NetworkInterfaces, subnet and security groups belong to the primary interface; EC2 rejects them
        # at the top level (Ray drops SecurityGroupIds here; moving them keeps the user's intent).
        nis = nc["NetworkInterfaces"]
        primary = next((n for n in nis if int(n.get("DeviceIndex", 0)) == 0), nis[0])
        groups = nc.pop("SecurityGroupIds", None)
        if "NetworkInterfaceId" not in primary:
            if subnet and "SubnetId" not in primary:
                primary["SubnetId"] = subnet
            if groups and "Groups" not in primary:
                primary["Groups"] = groups
    elif subnet:
        nc["SubnetId"] = subnet

    if spec.boot_script:
        if nc.get("UserData"):
            # The user's own user data must then start Ray; two scripts cannot both be the instance's.
            logger.warning("node type %s: node_config.UserData given with disable_node_updaters; it must start "
                           "Ray itself (ray_nodeless's boot script is not added)", spec.node_type)
        else:
            nc["UserData"] = spec.boot_script

    nc["TagSpecifications"] = merge_tag_specs(nc.get("TagSpecifications") or [], tags)

    if off.capacity == "spot":
        user_spot = dict((nc.get("InstanceMarketOptions") or {}).get("SpotOptions") or {})
        # One-time, terminated on interruption: ray_nodeless never stops instances (see backend.py).
        spot: dict[str, Any] = {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"}
        if user_spot.get("MaxPrice"):
            spot["MaxPrice"] = str(user_spot["MaxPrice"])
        nc["InstanceMarketOptions"] = {"MarketType": "spot", "SpotOptions": spot}
    elif nc.pop("InstanceMarketOptions", None):
        logger.debug("node type %s: InstanceMarketOptions dropped for an on-demand offering", spec.node_type)
    if spec.reservation_id:
        # Capacity `reserved`: into that reservation, by id (open ones too, so EC2 never picks another); EC2
        # refuses with ReservationCapacityExceeded when it has no room left, which the launcher walks past.
        nc["CapacityReservationSpecification"] = {
            "CapacityReservationTarget": {"CapacityReservationId": spec.reservation_id}}

    nc.update(
        InstanceType=off.instance_type.machine_type or off.instance_type.name,
        Placement=placement,
        MinCount=spec.count,            # MinCount == MaxCount: EC2 launches all of them or none
        MaxCount=spec.count,
        ClientToken=client_token(spec.request_token),
    )
    # What is sent, against EC2's request model: a node_config that never went through bootstrap_config (a config
    # changed on the head) fails here as a ConfigError naming the key, not as botocore's raw TypeError.
    check_launch_keys(nc, f"available_node_types.{spec.node_type}.node_config")
    return nc
