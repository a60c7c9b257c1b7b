"""The AWS backend's provider-block keys and its node_config checks: config-time only, no client, no network.

    provider:
      cloud: aws
      region: us-west-2
      image_id: ami-0123456789abcdef0          # default ImageId for node types whose node_config has none
      subnets: {us-west-2a: subnet-0aa...}      # zone -> subnet; only these zones are planned
      endpoint_url: http://127.0.0.1:5000       # default: botocore's (AWS_ENDPOINT_URL honoured)
      aws_credentials: {profile_name: ml}       # boto3 Session arguments
      aws_max_attempts: 5
      aws_retry_mode: standard
      aws_retry_base_delay_s: 0.5
      aws_describe_page_size: 1000
      aws_settle_wait_s: 15                     # after a lost RunInstances answer: how long new instances may take
                                                # to be listed before "it made nothing" is believed (settle.py)
      availability_zone: us-west-2a,us-west-2b  # Ray's key: only these zones are planned (and launched into)

Ray's own AWS keys keep their meaning (see ray_nodeless/swapin/keymap.py for the whole table):
`availability_zone` limits the zones; node_config `InstanceType` pins the type, `InstanceMarketOptions` spot pins
spot capacity (its SpotOptions.MaxPrice caps the price), `Placement.AvailabilityZone` pins the zone. A Ray key
ray_nodeless cannot honour is an error naming it (`cache_stopped_nodes: true`, a persistent spot request, ...).
"""
from __future__ import annotations

import functools
import math
from typing import Annotated, Any, Literal, Mapping

from pydantic import Field, SecretStr, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

from ray_nodeless.core.requirements import REQUIREMENT_KEYS
from ray_nodeless.core.schema import Section, suggest_key
from ray_nodeless.errors import ConfigError
from ray_nodeless.providers.aws.launch_model import (  # noqa: F401  (installed_botocore_version: tests read it here)
    _other_ec2_models, check_launch_keys, installed_botocore_version,
)

# Attempts per EC2 call, the first one included: botocore's for every call but RunInstances, ours for RunInstances.
# Five rides out a typical throttling burst (RequestLimitExceeded) without holding an autoscaler update for long.
DEFAULT_MAX_ATTEMPTS = 5
# After a RunInstances whose answer was lost, how long a lookup by its request tag keeps looking for the new
# instances before "it made nothing" is believed (and a short set is reported as transient): EC2 lists new
# instances within seconds, rarely tens of seconds. Paid only after a lost answer or a 5xx.
DEFAULT_SETTLE_WAIT_S = 15.0
# First backoff of our RunInstances loop; doubled per retry (full jitter), capped by backend.RUN_BACKOFF_CAP_S.
DEFAULT_RETRY_BASE_DELAY_S = 0.5
# DescribeInstances MaxResults bounds, as EC2 defines them; the default is the largest page (fewest calls).
MIN_DESCRIBE_PAGE_SIZE = 5
MAX_DESCRIBE_PAGE_SIZE = 1000

# RunInstances parameters ray_nodeless sets itself; a node_config that sets them is a config error.
MANAGED_KEYS = frozenset({"MinCount", "MaxCount", "ClientToken", "DryRun"})
# Keys of Ray's AWS node_config that are not RunInstances parameters but that Ray (and we) accept.
EXTRA_KEYS = frozenset({"SubnetIds"})
# node_config keys that must be lists when present (EC2 would reject anything else only at launch time).
LIST_KEYS = ("SubnetIds", "SecurityGroupIds", "BlockDeviceMappings", "NetworkInterfaces", "TagSpecifications")

NonEmpty = Annotated[str, Field(min_length=1)]


class AwsCredentials(Section):
    """`provider.aws_credentials`: the arguments of `boto3.session.Session` that a YAML can hold.

    Not accepted: `region_name` (provider.region is the one region, for the clients and the planner alike) and
    `botocore_session` (a Python object)."""

    model_config = Section.model_config | {"extra": "forbid"}

    aws_access_key_id: NonEmpty | None = None
    aws_secret_access_key: SecretStr | None = None      # SecretStr: never in a repr, a log line or a traceback
    aws_session_token: SecretStr | None = None
    profile_name: NonEmpty | None = None
    aws_account_id: NonEmpty | None = None

    @model_validator(mode="before")
    @classmethod
    def _mapping_with_unknown_values_hidden(cls, data: Any) -> Any:
        if not isinstance(data, Mapping):
            raise PydanticCustomError("dict_type", "must be a mapping")
        # A misspelt key usually holds a secret, and errors quote the value they reject.
        return {k: (v if k in cls.model_fields else "<hidden>") for k, v in data.items()}

    def session_kwargs(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for name in type(self).model_fields:
            value = getattr(self, name)
            if value is not None:
                out[name] = value.get_secret_value() if isinstance(value, SecretStr) else value
        return out


class AwsSettings(Section):
    """Every provider-block key the AWS backend reads."""

    region: NonEmpty
    image_id: NonEmpty | None = None
    subnets: dict[NonEmpty, NonEmpty] | None = None
    endpoint_url: NonEmpty | None = None
    aws_credentials: AwsCredentials | None = None
    aws_max_attempts: int = Field(DEFAULT_MAX_ATTEMPTS, ge=1)
    aws_retry_mode: Literal["standard", "adaptive", "legacy"] = "standard"     # botocore's retry modes
    aws_retry_base_delay_s: float = Field(DEFAULT_RETRY_BASE_DELAY_S, ge=0)
    aws_describe_page_size: int = Field(MAX_DESCRIBE_PAGE_SIZE, ge=MIN_DESCRIBE_PAGE_SIZE, le=MAX_DESCRIBE_PAGE_SIZE)
    aws_settle_wait_s: float = Field(DEFAULT_SETTLE_WAIT_S, ge=0)
    # Ray's keys, with Ray's meaning.
    availability_zone: NonEmpty | None = None          # "us-west-2a,us-west-2b": the zones to plan and launch in
    cache_stopped_nodes: bool | None = None            # only `false` can be honoured

    @field_validator("availability_zone")
    @classmethod
    def _zones_of_the_region(cls, value: str | None, info: ValidationInfo) -> str | None:
        region = info.data.get("region")
        if value is not None and region:
            try:
                availability_zones(value, region)
            except ConfigError as e:
                raise PydanticCustomError("availability_zone", str(e).split(": ", 1)[1]) from None
        return value

    @field_validator("endpoint_url")
    @classmethod
    def _a_url(cls, value: str | None) -> str | None:
        from urllib.parse import urlsplit

        if value is not None:
            parts = urlsplit(value)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise PydanticCustomError("endpoint_url", "must be an http(s) URL with a host, such as "
                                                          "http://127.0.0.1:5000 (botocore's endpoint_url)")
        return value

    @field_validator("cache_stopped_nodes")
    @classmethod
    def _never_stopped(cls, value: bool | None) -> bool | None:
        if value:
            raise PydanticCustomError(
                "cache_stopped_nodes", "ray_nodeless terminates instances on scale-down and never reuses stopped "
                                       "ones (a stopped instance keeps its type and zone, outside the plan); "
                                       "remove the key or set it to false")
        return value

    def zones(self) -> list[str] | None:
        """The zones `availability_zone` allows (None: every zone of the region)."""
        return availability_zones(self.availability_zone, self.region)

    def session_kwargs(self) -> dict[str, str]:
        return self.aws_credentials.session_kwargs() if self.aws_credentials else {}


def availability_zones(value: str | None, region: str) -> list[str] | None:
    """Ray's `provider.availability_zone` ("us-west-2a,us-west-2b") as a list of zones of `region`."""
    if value is None:
        return None
    zones = [z.strip() for z in str(value).split(",") if z.strip()]
    if not zones:
        raise ConfigError("provider.availability_zone", "names no zone")
    for z in zones:
        if not z.startswith(region) or z == region:
            raise ConfigError("provider.availability_zone", f"{z!r} is not a zone of region {region!r}")
    return sorted(set(zones))


@functools.cache
def accepted_node_config_keys() -> frozenset[str]:
    """node_config keys this backend accepts: every RunInstances parameter of the installed botocore (what Ray's
    AWS provider passes on), SubnetIds, and the requirement keys (the raw node_config may still hold them)."""
    return (run_instances_members() | EXTRA_KEYS | REQUIREMENT_KEYS) - MANAGED_KEYS


def run_instances_members() -> frozenset[str]:
    """The RunInstances parameters of the installed botocore. From the list scripts/vendor_cloud_schemas.py wrote
    when the installed botocore is the version it was written from and no other EC2 model can shadow botocore's
    own (AWS_DATA_PATH, ~/.aws/models/ec2), so a config check does not import botocore; else from botocore."""
    from ray_nodeless.providers.aws import run_instances_keys as vendored

    if installed_botocore_version() == vendored.BOTOCORE_VERSION and not _other_ec2_models():
        return vendored.RUN_INSTANCES_MEMBERS
    import botocore.session

    service = botocore.session.get_session().get_service_model("ec2")
    return frozenset(service.operation_model("RunInstances").input_shape.members)


def check_node_config(settings: AwsSettings, node_config: Mapping[str, Any], key: str) -> None:
    """ConfigError (naming `key`.<field>) for node_config keys that cannot work, or that Ray would honour and
    ray_nodeless could not."""
    accepted = accepted_node_config_keys()
    for name in node_config:
        if name in MANAGED_KEYS:
            raise ConfigError(f"{key}.{name}", f"{name} is set by ray_nodeless for every launch; remove it")
        if name not in accepted:
            # node_config holds the constraint keys too: a typo of either gets its nearest (`min_memory`).
            close = suggest_key(str(name), accepted | REQUIREMENT_KEYS)
            hint = f"; did you mean {close!r}?" if close else ""
            raise ConfigError(f"{key}.{name}", f"unknown key {name!r}: not a RunInstances parameter nor a "
                                               f"constraint key{hint}")
    # Types and ranges by EC2's own request model first: later checks (and Ray's AMI check) read these values.
    check_launch_keys({k: v for k, v in node_config.items() if k not in REQUIREMENT_KEYS and k not in EXTRA_KEYS},
                      key)
    subnets = node_config.get("SubnetIds")
    if subnets is not None and (not isinstance(subnets, list) or not all(isinstance(x, str) and x for x in subnets)):
        raise ConfigError(f"{key}.SubnetIds", f"must be a list of subnet ids, got {subnets!r}")
    if subnets == []:
        raise ConfigError(f"{key}.SubnetIds", "is empty: list the subnets to launch in, or remove the key (the "
                                              "zone's default subnet, or provider.subnets)")
    if not node_config.get("ImageId") and not settings.image_id and "LaunchTemplate" not in node_config:
        raise ConfigError(f"{key}.ImageId",
                          "no AMI: set node_config.ImageId (or provider.image_id, or a LaunchTemplate)")
    for list_key in LIST_KEYS:
        if list_key in node_config and not isinstance(node_config[list_key], list):
            raise ConfigError(f"{key}.{list_key}", "must be a list")
    it = node_config.get("InstanceType")
    if it is not None and (not isinstance(it, str) or not it):
        raise ConfigError(f"{key}.InstanceType", "must be one instance type name")
    if isinstance(node_config.get("SubnetIds"), list) and "SubnetId" in node_config:
        raise ConfigError(f"{key}.SubnetId", "set SubnetIds or SubnetId, not both")
    if "InstanceMarketOptions" in node_config:
        market_options(node_config["InstanceMarketOptions"], f"{key}.InstanceMarketOptions")
    placement_zone(node_config.get("Placement"), settings.region, f"{key}.Placement")
    if _zones(settings, node_config) == []:
        raise ConfigError(f"{key}.Placement.AvailabilityZone"
                          if isinstance(node_config.get("Placement"), Mapping)
                          and node_config["Placement"].get("AvailabilityZone") else "provider.availability_zone",
                          f"leaves no zone: provider.availability_zone {settings.availability_zone!r}, "
                          f"provider.subnets {sorted(settings.subnets or {})} and the node type's "
                          "Placement.AvailabilityZone have no zone in common")


# Ray's InstanceMarketOptions.SpotOptions values ray_nodeless launches with (launch_params.py): a one-time request,
# terminated on interruption. Any other value would be silently replaced, so it is an error.
SPOT_OPTIONS_HONOURED = {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"}


def market_options(value: Any, key: str) -> tuple[str, float | None]:
    """Ray's `InstanceMarketOptions` as (capacity type, spot max price or None). Only spot is a market type
    ray_nodeless launches in; SpotOptions must be what it launches with (see SPOT_OPTIONS_HONOURED)."""
    if not isinstance(value, Mapping):
        raise ConfigError(key, f"must be a mapping ({{MarketType: spot}}), got {value!r}")
    for k in value:
        if k not in ("MarketType", "SpotOptions"):
            raise ConfigError(f"{key}.{k}", "unknown key; InstanceMarketOptions takes MarketType and SpotOptions")
    market = value.get("MarketType")
    if market != "spot":
        raise ConfigError(f"{key}.MarketType",
                          f"{market!r}: ray_nodeless launches on-demand or spot capacity only; `spot` pins spot "
                          "(remove InstanceMarketOptions for on-demand)")
    spot = value.get("SpotOptions") or {}
    if not isinstance(spot, Mapping):
        raise ConfigError(f"{key}.SpotOptions", f"must be a mapping, got {spot!r}")
    max_price = None
    for k, v in spot.items():
        if k == "MaxPrice":
            try:
                max_price = float(v)
            except (TypeError, ValueError):
                max_price = None
            if max_price is None or not math.isfinite(max_price) or max_price <= 0:
                raise ConfigError(f"{key}.SpotOptions.MaxPrice", f"must be a price in USD per hour > 0, got {v!r}")
        elif k in SPOT_OPTIONS_HONOURED:
            if v != SPOT_OPTIONS_HONOURED[k]:
                raise ConfigError(f"{key}.SpotOptions.{k}",
                                  f"{v!r} is not supported: ray_nodeless launches spot instances as "
                                  f"{k}: {SPOT_OPTIONS_HONOURED[k]} (interrupted instances are replaced by the "
                                  "autoscaler, never stopped or resubmitted)")
        elif k in ("BlockDurationMinutes", "ValidUntil"):
            raise ConfigError(f"{key}.SpotOptions.{k}",
                              "is not supported (defined-duration and persistent spot requests are not launched "
                              "by ray_nodeless); remove it")
        else:
            raise ConfigError(f"{key}.SpotOptions.{k}", "unknown key; SpotOptions takes MaxPrice, SpotInstanceType "
                                                        "(one-time) and InstanceInterruptionBehavior (terminate)")
    return "spot", max_price


def placement_zone(value: Any, region: str, key: str) -> str | None:
    """`Placement.AvailabilityZone` (the zone Ray would launch in), checked; the offering's zone replaces the
    Placement zone at launch, so a zone id (`AvailabilityZoneId`) that cannot be planned on is an error."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise ConfigError(key, f"must be a mapping, got {value!r}")
    if value.get("AvailabilityZoneId"):
        raise ConfigError(f"{key}.AvailabilityZoneId", "zone ids cannot be planned on (zones are planned by "
                                                       "name); use Placement.AvailabilityZone or "
                                                       "provider.availability_zone")
    zone = value.get("AvailabilityZone")
    if zone is None:
        return None
    if not isinstance(zone, str) or not zone.startswith(region) or zone == region:
        raise ConfigError(f"{key}.AvailabilityZone", f"{zone!r} is not a zone of region {region!r}")
    return zone


def _zones(settings: AwsSettings, node_config: Mapping[str, Any]) -> list[str] | None:
    """The zones a node type may be launched in (None: any): provider.availability_zone, the zones of
    provider.subnets (unless the node type names its own subnets) and Placement.AvailabilityZone, intersected."""
    allowed: set[str] | None = None

    def narrow(zones: list[str] | None) -> None:
        nonlocal allowed
        if zones is not None:
            allowed = set(zones) if allowed is None else allowed & set(zones)

    narrow(settings.zones())
    # Zones without a configured subnet cannot be launched into.
    if settings.subnets and not node_config.get("SubnetIds") and not node_config.get("SubnetId"):
        narrow(sorted(settings.subnets))
    placement = node_config.get("Placement")
    if isinstance(placement, Mapping) and isinstance(placement.get("AvailabilityZone"), str):
        narrow([placement["AvailabilityZone"]])
    return None if allowed is None else sorted(allowed)


def requirement_overrides(settings: AwsSettings, node_config: Mapping[str, Any]) -> dict[str, Any]:
    """Requirement keys implied by Ray's keys in node_config and the provider block (static knowledge only, no
    API call). `check_node_config` has rejected what cannot be honoured; this only translates."""
    out: dict[str, Any] = {}
    it = node_config.get("InstanceType")
    if isinstance(it, str) and it:
        # Ray's meaning of InstanceType ("launch this") becomes an allow-list of one; the offering still picks
        # zone and capacity.
        out["instance_types"] = [it]
    market = node_config.get("InstanceMarketOptions")
    if market is not None:
        capacity, max_price = market_options(market, "InstanceMarketOptions")
        out["capacity"] = [capacity]           # Ray launches these as spot only: no on-demand fallback either
        if max_price is not None:
            out["max_hourly_price"] = max_price    # EC2 refuses a spot launch above MaxPrice: never plan one
    zones = _zones(settings, node_config)
    if zones is not None:
        out["zones"] = zones
    return out
