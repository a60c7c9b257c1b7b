"""The EC2 machine backend: one RunInstances per launch, one paginated DescribeInstances per listing.

What this backend guarantees beyond what EC2 gives for free (see `ray_nodeless.providers.base` for the contract):

- Idempotency is enforced here, not only by EC2's ClientToken. RunInstances goes through a client with botocore
  retries switched off, and *our* loop re-issues it; before any re-issue (and before giving up) after an ambiguous
  failure (throttling, 5xx, connection error, timeout) we look the token up with
  `DescribeInstances tag:nodeless-request=<token>`. On AWS the ClientToken alone would dedupe a retry; moto (and any
  emulator or proxy that drops the token) would not, and botocore's own retry loop would silently create a second
  set of machines. The tag is set at creation through TagSpecifications, so it is visible as soon as the instance is.
- No instance ever exists without the cluster tag: every tag of `spec.tags` is in the RunInstances TagSpecifications
  for the instance and its volumes.
- `terminate` and `set_tags` only touch instances that were seen carrying `ray-cluster-name=<cluster>` (in the last
  listing, a launch, or a filtered describe of the ids it does not know).

Stopped instances: ray_nodeless never stops instances (spot ones are launched with interruption behaviour
`terminate`), so a stopped instance of this cluster was stopped by someone else. It is not a Ray node and is not
listed, but the listing asks for stopping/stopped too (same single call) and warns once per instance, because a
stopped instance keeps costing EBS money and nothing else would ever report it.
"""
from __future__ import annotations

import copy
import hashlib
import logging
import random
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Mapping, Any, Callable, Iterable

import boto3
import botocore.exceptions
import botocore.parsers
from botocore.client import BaseClient
from botocore.config import Config

from ray_nodeless.errors import BackendError, CapacityError, ConfigError, TransientBackendError
from ray_nodeless.providers.base import (
    MACHINE_PENDING,
    MACHINE_RUNNING,
    TAG_CLUSTER,
    LaunchSpec,
    Machine,
    MachineBackend,
)

logger = logging.getLogger(__name__)

# Tag carrying LaunchSpec.request_token on every instance and volume: the idempotency lookup key.
TAG_REQUEST = "nodeless-request"
# Subnets tagged with this key (any value) are the ones ray_nodeless launches into when node_config has no SubnetIds
# and provider.subnets is not set.
SUBNET_DISCOVERY_TAG = "ray-nodeless-subnet"

# EC2 error codes that mean "this offering has no capacity or quota right now": the launcher moves to the next
# candidate and remembers the failure for this (type, zone, capacity).
REGIONAL_LIMIT_CODES = frozenset({"VcpuLimitExceeded", "MaxSpotInstanceCountExceeded", "InstanceLimitExceeded"})
CAPACITY_CODES = frozenset({
    "InsufficientInstanceCapacity",
    "InsufficientHostCapacity",
    "InsufficientCapacity",
    "InsufficientReservedInstanceCapacity",
    "InsufficientFreeAddressesInSubnet",
    "SpotMaxPriceTooLow",
    "MaxSpotInstanceCountExceeded",
    "VcpuLimitExceeded",
    "InstanceLimitExceeded",
    "UnfulfillableCapacity",
    "Unsupported",
    # Not an EC2 code: raised by this backend when the user's subnets do not cover the planned zone.
    "NoSubnetInZone",
})
THROTTLE_CODES = frozenset({
    "RequestLimitExceeded", "Throttling", "ThrottlingException", "RequestThrottled",
    "RequestThrottledException", "TooManyRequestsException", "SlowDown", "PriorRequestNotComplete",
})
SERVER_CODES = frozenset({"InternalError", "InternalFailure", "ServiceUnavailable", "Unavailable", "ServerInternal"})
DENIED_CODES = frozenset({"UnauthorizedOperation", "AccessDenied", "AccessDeniedException", "AuthFailure",
                          "OptInRequired", "Blocked"})
NOT_FOUND_CODES = frozenset({"InvalidInstanceID.NotFound", "InvalidInstanceID.Malformed"})

# Transport-level failures: the request may or may not have reached EC2.
AMBIGUOUS_EXCEPTIONS: tuple[type[BaseException], ...] = (
    botocore.exceptions.ConnectionError,        # EndpointConnectionError, ConnectTimeoutError, ReadTimeoutError, ...
    botocore.exceptions.HTTPClientError,         # ConnectionClosedError, ...
    botocore.parsers.ResponseParserError,        # a 5xx HTML page from a proxy or load balancer
)

# ray_nodeless requirement keys: the core strips them from node_config before the backend sees it, but
# validate_node_config may be handed the raw node_config, so they are accepted here.
REQUIREMENT_KEYS = frozenset({
    "instance_types", "families", "exclude_families", "gpus", "exclude_gpus", "exclude_instance_types", "arch",
    "min_memory_gib", "min_vcpus", "capacity", "zones", "max_hourly_price", "allow_gpu_instances",
})
# RunInstances parameters that ray_nodeless sets itself; a node_config that sets them is a config error.
MANAGED_KEYS = frozenset({"MinCount", "MaxCount", "ClientToken", "DryRun"})
# Keys of Ray's AWS node_config that are not RunInstances parameters but that Ray (and we) accept.
EXTRA_KEYS = frozenset({"SubnetIds"})

LIVE_STATES = ("pending", "running")
LISTED_STATES = ("pending", "running", "stopping", "stopped")
TERMINATE_CHUNK = 1000        # TerminateInstances accepts up to 1000 ids per call
FILTER_VALUES_CHUNK = 200     # stay under EC2's limit on values per filter
SUBNET_CACHE_TTL_S = 300.0
_AZ_ID = re.compile(r"^[a-z]{2,5}\d+-az\d+$")     # use1-az1 (zone id) vs us-east-1a (zone name)
_INSTANCE_ID = re.compile(r"i-[0-9a-f]{8,17}")


def _run_instances_keys() -> frozenset[str]:
    """Every RunInstances parameter of the installed botocore: the node_config keys Ray's AWS provider passes on."""
    import botocore.session

    service = botocore.session.get_session().get_service_model("ec2")
    return frozenset(service.operation_model("RunInstances").input_shape.members)


_ACCEPTED_KEYS: frozenset[str] | None = None


def accepted_node_config_keys() -> frozenset[str]:
    """node_config keys this backend accepts (RunInstances parameters + SubnetIds + requirement keys)."""
    global _ACCEPTED_KEYS
    if _ACCEPTED_KEYS is None:
        _ACCEPTED_KEYS = (_run_instances_keys() | EXTRA_KEYS | REQUIREMENT_KEYS) - MANAGED_KEYS
    return _ACCEPTED_KEYS


@dataclass
class _Known:
    """What this backend last saw of its cluster's instances: the set terminate/set_tags may touch."""

    tags: dict[str, dict[str, str]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, instance_id: str, tags: dict[str, str]) -> None:
        with self.lock:
            self.tags[instance_id] = dict(tags)

    def replace(self, mapping: dict[str, dict[str, str]]) -> None:
        with self.lock:
            self.tags = mapping

    def discard(self, ids: Iterable[str]) -> None:
        with self.lock:
            for i in ids:
                self.tags.pop(i, None)

    def has(self, instance_id: str) -> bool:
        with self.lock:
            return instance_id in self.tags

    def merge_tags(self, instance_id: str, tags: dict[str, str]) -> None:
        with self.lock:
            if instance_id in self.tags:
                self.tags[instance_id].update(tags)


@dataclass
class _SubnetCache:
    zone_of: dict[str, tuple[str, str]] = field(default_factory=dict)  # subnet id -> (AZ name, AZ id)
    discovered: dict[str, list[str]] | None = None                     # AZ -> subnets, tagged SUBNET_DISCOVERY_TAG
    default_for_az: dict[str, str] | None = None                       # AZ -> default subnet
    fetched_at: float = 0.0


def _error_code(exc: botocore.exceptions.ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", "Unknown"))


def _error_message(exc: botocore.exceptions.ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Message", ""))


def _http_status(exc: botocore.exceptions.ClientError) -> int:
    return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)


def _is_ambiguous(exc: BaseException) -> bool:
    """True if the request may have been executed although it failed (or was refused in a retryable way)."""
    if isinstance(exc, AMBIGUOUS_EXCEPTIONS):
        return True
    if isinstance(exc, botocore.exceptions.ClientError):
        code = _error_code(exc)
        if code in CAPACITY_CODES:
            return False
        return code in THROTTLE_CODES or code in SERVER_CODES or _http_status(exc) >= 500
    return False


def _api_error(operation: str, exc: BaseException) -> BackendError:
    """Turn a botocore error of `operation` into our error types. The message always names the EC2 action."""
    if isinstance(exc, AMBIGUOUS_EXCEPTIONS):
        return TransientBackendError(f"ec2:{operation} failed to reach EC2: {exc}", category=type(exc).__name__)
    if not isinstance(exc, botocore.exceptions.ClientError):
        return BackendError(f"ec2:{operation} failed: {exc}", category=type(exc).__name__)
    code, message = _error_code(exc), _error_message(exc)
    if code in CAPACITY_CODES:
        # Account limits are regional; capacity shortages are per zone.
        return CapacityError(f"ec2:{operation}: {code}: {message}", category=code,
                             scope="region" if code in REGIONAL_LIMIT_CODES else "zone")
    if code in THROTTLE_CODES or code in SERVER_CODES or _http_status(exc) >= 500:
        return TransientBackendError(f"ec2:{operation} still failing after retries: {code}: {message}", category=code)
    if code in DENIED_CODES:
        # EC2's UnauthorizedOperation message does not say which action was refused (only an encoded blob), so
        # name it here: that is what the user must add to the head node's policy.
        return BackendError(
            f"not authorized to perform ec2:{operation} ({code}); grant it in the head node's IAM policy "
            f"(see cluster-configs/aws-iam-policy.json): {message}", category=code)
    return BackendError(f"ec2:{operation} failed: {code}: {message}", category=code)


def _tags_of(instance: dict[str, Any]) -> dict[str, str]:
    return {t["Key"]: t.get("Value", "") for t in instance.get("Tags", []) or []}


def _chunks(items: list[str], size: int) -> Iterable[list[str]]:
    for i in range(0, len(items), size):
        yield items[i:i + size]


def client_token(request_token: str) -> str:
    """EC2's ClientToken is at most 64 ASCII characters; longer or non-ASCII tokens are hashed to 64 hex digits."""
    if len(request_token) <= 64 and request_token.isascii() and request_token:
        return request_token
    return hashlib.sha256(request_token.encode()).hexdigest()


class AwsBackend(MachineBackend):
    """EC2 instances, one RunInstances per LaunchSpec.

    provider_config keys read here: `region` (required), `endpoint_url`, `aws_credentials` (dict of boto3 client
    kwargs, as in Ray's AWS provider), `aws_max_attempts` (default 5: botocore's attempts for every call except
    RunInstances, and our own attempts for RunInstances), `aws_retry_mode` (`standard` | `adaptive`, default
    standard), `aws_retry_base_delay_s` (first backoff of our RunInstances loop, default 0.5),
    `aws_describe_page_size` (DescribeInstances MaxResults, 5..1000, default 1000), `image_id` (default ImageId),
    `subnets` ({zone: subnet-id}).
    """

    cloud = "aws"

    def __init__(self, provider_config: dict[str, Any], cluster_name: str):
        super().__init__(provider_config, cluster_name)
        region = provider_config.get("region")
        if not region or not isinstance(region, str):
            raise ConfigError("provider.region", "the AWS backend needs a region, e.g. us-east-1")
        self.region: str = region
        self.max_attempts = int(provider_config.get("aws_max_attempts", 5))
        if self.max_attempts < 1:
            raise ConfigError("provider.aws_max_attempts", "must be >= 1")
        mode = provider_config.get("aws_retry_mode", "standard")
        if mode not in ("standard", "adaptive", "legacy"):
            raise ConfigError("provider.aws_retry_mode", f"must be standard or adaptive, not {mode!r}")
        self.retry_base_delay_s = float(provider_config.get("aws_retry_base_delay_s", 0.5))
        self.page_size = int(provider_config.get("aws_describe_page_size", 1000))
        if not 5 <= self.page_size <= 1000:
            raise ConfigError("provider.aws_describe_page_size", "DescribeInstances MaxResults must be 5..1000")
        subnets = provider_config.get("subnets") or {}
        if not isinstance(subnets, dict):
            raise ConfigError("provider.subnets", "must map availability zone -> subnet id")
        self.provider_subnets: dict[str, str] = {str(k): str(v) for k, v in subnets.items()}

        creds = dict(provider_config.get("aws_credentials") or {})
        endpoint_url = provider_config.get("endpoint_url")  # None: botocore honours AWS_ENDPOINT_URL itself
        session = boto3.session.Session()
        common: dict[str, Any] = dict(region_name=region, **creds)
        if endpoint_url:
            common["endpoint_url"] = endpoint_url
        # Describe/Terminate/CreateTags: botocore retries throttling and 5xx (all of them are idempotent).
        # `total_max_attempts` counts the first try; botocore's `max_attempts` key would count retries only.
        self.ec2: BaseClient = session.client(
            "ec2", config=Config(retries={"mode": mode, "total_max_attempts": self.max_attempts}), **common)
        # RunInstances: no botocore retries. A botocore retry after a lost response re-sends the request, which is
        # only safe where ClientToken is honoured; our loop looks the token up first (see module docstring).
        self.ec2_launch: BaseClient = session.client(
            "ec2", config=Config(retries={"mode": mode, "total_max_attempts": 1}), **common)
        self._sleep: Callable[[float], None] = time.sleep
        self._known = _Known()
        self._subnets = _SubnetCache()
        self._subnet_lock = threading.Lock()
        self._warned_stopped: set[str] = set()

    @property
    def clients(self) -> tuple[BaseClient, BaseClient]:
        """The botocore clients this backend calls through (for event hooks in tests and benchmarks)."""
        return (self.ec2, self.ec2_launch)

    # ------------------------------------------------------------------ config

    @classmethod
    def check_node_config(cls, provider: Mapping[str, Any], node_type: str, node_config: dict[str, Any],
                          key: str) -> None:
        accepted = accepted_node_config_keys()
        for name in node_config:
            if name in MANAGED_KEYS:
                raise ConfigError(f"{key}.{name}", f"{name} is set by ray_nodeless for every launch; remove it")
            if name not in accepted:
                close = sorted(k for k in accepted if k.lower() == str(name).lower())
                hint = f" (did you mean {close[0]}?)" if close else ""
                raise ConfigError(f"{key}.{name}", f"not a RunInstances parameter{hint}")
        if not node_config.get("ImageId") and not provider.get("image_id") and "LaunchTemplate" not in node_config:
            raise ConfigError(f"{key}.ImageId",
                              "no AMI: set node_config.ImageId (or provider.image_id, or a LaunchTemplate)")
        for list_key in ("SubnetIds", "SecurityGroupIds", "BlockDeviceMappings", "NetworkInterfaces",
                         "TagSpecifications"):
            if list_key in node_config and not isinstance(node_config[list_key], list):
                raise ConfigError(f"{key}.{list_key}", "must be a list")
        it = node_config.get("InstanceType")
        if it is not None and not isinstance(it, str):
            raise ConfigError(f"{key}.InstanceType", "must be one instance type name")
        if isinstance(node_config.get("SubnetIds"), list) and "SubnetId" in node_config:
            raise ConfigError(f"{key}.SubnetId", "set SubnetIds or SubnetId, not both")

    @classmethod
    def requirement_overrides(cls, provider: Mapping[str, Any], node_config: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        it = node_config.get("InstanceType")
        if isinstance(it, str) and it:
            # Ray's meaning of InstanceType ("launch this") becomes an allow-list of one; the offering still picks
            # zone and capacity.
            out["instance_types"] = [it]
        # Static knowledge only (no API call here): zones without a configured subnet cannot be launched into.
        subnets = provider.get("subnets")
        if isinstance(subnets, dict) and subnets and not node_config.get("SubnetIds") \
                and not node_config.get("SubnetId"):
            out["zones"] = sorted(str(z) for z in subnets)
        return out

    # ------------------------------------------------------------------ launch

    def launch(self, spec: LaunchSpec) -> list[str]:
        if spec.count <= 0:
            return []
        params = self._run_params(spec)
        token = spec.request_token
        off = spec.offering
        logger.info("RunInstances %s x%d in %s (%s), token %s", off.instance_type.name, spec.count, off.zone,
                    off.capacity, token)
        ambiguous = False
        last_exc: BaseException | None = None
        for attempt in range(1, self.max_attempts + 1):
            if ambiguous:
                # A previous attempt may have run although it failed (lost response, 5xx after commit). EC2's
                # ClientToken would dedupe a re-issue; we do not rely on it (moto ignores it).
                found = self._instances_for_token(token)
                if found:
                    return self._settle(spec, found)
                self._sleep(self._backoff(attempt - 1))
            try:
                resp = self.ec2_launch.run_instances(**params)
            except (botocore.exceptions.ClientError, *AMBIGUOUS_EXCEPTIONS) as e:
                last_exc = e
                if _is_ambiguous(e):
                    ambiguous = True
                    logger.warning("RunInstances %s in %s attempt %d/%d: %s", off.instance_type.name, off.zone,
                                   attempt, self.max_attempts, _short(e))
                    continue
                if isinstance(e, botocore.exceptions.ClientError) and _error_code(e) == "IdempotentParameterMismatch":
                    # The token was used before with other parameters: whatever it created is the result.
                    found = self._instances_for_token(token)
                    if found:
                        return self._settle(spec, found)
                raise _api_error("RunInstances", e) from e
            instances = resp.get("Instances", [])
            ids = [i["InstanceId"] for i in instances]
            if len(ids) != spec.count:
                # MinCount == MaxCount makes EC2 all-or-nothing; anything else is a broken endpoint. Never leak.
                self._terminate_ids(ids)
                raise BackendError(f"ec2:RunInstances returned {len(ids)} instances for MinCount=MaxCount="
                                   f"{spec.count}; terminated them", category="PartialLaunch")
            tags = self._instance_tags(spec)
            for i in ids:
                self._known.add(i, tags)
            logger.info("launched %s (%s in %s, %s)", ",".join(ids), off.instance_type.name, off.zone, off.capacity)
            return ids
        # Out of attempts: one last look before reporting failure, so a launch that did happen is not lost.
        found = self._instances_for_token(token)
        if found:
            return self._settle(spec, found)
        assert last_exc is not None
        err = _api_error("RunInstances", last_exc)
        if not isinstance(err, TransientBackendError):
            err = TransientBackendError(str(err), category=err.category)
        raise err from last_exc

    def _backoff(self, n: int) -> float:
        """Full-jitter exponential backoff for our RunInstances loop (n = retries so far, from 1)."""
        if self.retry_base_delay_s <= 0:
            return 0.0
        return random.uniform(0.5, 1.0) * min(20.0, self.retry_base_delay_s * (2 ** max(0, n - 1)))

    def _instance_tags(self, spec: LaunchSpec) -> dict[str, str]:
        tags = {str(k): str(v) for k, v in spec.tags.items()}
        if tags.get(TAG_CLUSTER, self.cluster_name) != self.cluster_name:
            raise BackendError(f"LaunchSpec tag {TAG_CLUSTER}={tags[TAG_CLUSTER]!r} is not this backend's cluster "
                               f"{self.cluster_name!r}", category="WrongCluster")
        tags[TAG_CLUSTER] = self.cluster_name
        tags[TAG_REQUEST] = spec.request_token
        return tags

    def _run_params(self, spec: LaunchSpec) -> dict[str, Any]:
        """The RunInstances request for `spec` (node_config keys passed through, ours merged on top)."""
        nc = copy.deepcopy(spec.node_config)
        for k in list(nc):
            if k in REQUIREMENT_KEYS or k in MANAGED_KEYS:
                nc.pop(k)
        nc.pop("InstanceType", None)            # the offering decides; node_config's value was an allow-list
        off = spec.offering
        zone = off.zone

        if not nc.get("ImageId") and "LaunchTemplate" not in nc:
            image = self.provider_config.get("image_id")
            if not image:
                raise ConfigError(f"available_node_types.{spec.node_type}.node_config.ImageId",
                                  "no AMI: set node_config.ImageId (or provider.image_id)")
            nc["ImageId"] = image

        user_subnets = nc.pop("SubnetIds", None)
        if user_subnets is None and nc.get("SubnetId"):
            user_subnets = [nc.pop("SubnetId")]
        subnet = self._subnet_for_zone(zone, user_subnets)

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

        tags = self._instance_tags(spec)
        nc["TagSpecifications"] = _merge_tag_specs(nc.get("TagSpecifications") or [], tags)

        if off.capacity == "spot":
            user_spot = dict((nc.get("InstanceMarketOptions") or {}).get("SpotOptions") or {})
            spot: dict[str, Any] = {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"}
            if user_spot.get("MaxPrice"):
                spot["MaxPrice"] = str(user_spot["MaxPrice"])
            nc["InstanceMarketOptions"] = {"MarketType": "spot", "SpotOptions": spot}
        else:
            if nc.pop("InstanceMarketOptions", None):
                logger.debug("node type %s: InstanceMarketOptions dropped for an on-demand offering", spec.node_type)

        nc.update(
            InstanceType=off.instance_type.machine_type or off.instance_type.name,
            Placement=placement,
            MinCount=spec.count,
            MaxCount=spec.count,
            ClientToken=client_token(spec.request_token),
        )
        return nc

    # ------------------------------------------------------------------ subnets

    def _subnet_for_zone(self, zone: str, user_subnets: list[str] | None) -> str | None:
        """The subnet to launch into for `zone`, or None to let EC2 use the default VPC's subnet of the AZ."""
        if user_subnets:
            zone_of = self._subnet_zones(list(user_subnets))
            for s in user_subnets:
                if zone in zone_of.get(s, ()):
                    return s
            raise CapacityError(f"none of node_config SubnetIds {list(user_subnets)} is in zone {zone}",
                                category="NoSubnetInZone")
        if self.provider_subnets:
            if zone in self.provider_subnets:
                return self.provider_subnets[zone]
            raise CapacityError(f"provider.subnets has no subnet for zone {zone}", category="NoSubnetInZone")
        discovered, defaults = self._discovered_subnets()
        if discovered:
            candidates = discovered.get(zone)
            if not candidates:
                raise CapacityError(f"no subnet tagged {SUBNET_DISCOVERY_TAG} in zone {zone}",
                                    category="NoSubnetInZone")
            return candidates[0]
        return defaults.get(zone)

    def _subnet_zones(self, subnet_ids: list[str]) -> dict[str, tuple[str, str]]:
        with self._subnet_lock:
            missing = [s for s in subnet_ids if s not in self._subnets.zone_of]
            if missing:
                try:
                    resp = self.ec2.describe_subnets(SubnetIds=missing)
                except (botocore.exceptions.ClientError, *AMBIGUOUS_EXCEPTIONS) as e:
                    raise _api_error("DescribeSubnets", e) from e
                for s in resp.get("Subnets", []):
                    self._subnets.zone_of[s["SubnetId"]] = (s["AvailabilityZone"], s.get("AvailabilityZoneId", ""))
            return dict(self._subnets.zone_of)

    def _discovered_subnets(self) -> tuple[dict[str, list[str]], dict[str, str]]:
        with self._subnet_lock:
            c = self._subnets
            if c.discovered is None or time.monotonic() - c.fetched_at > SUBNET_CACHE_TTL_S:
                try:
                    tagged = self._describe_subnets([{"Name": "tag-key", "Values": [SUBNET_DISCOVERY_TAG]}])
                    default = [] if tagged else self._describe_subnets(
                        [{"Name": "default-for-az", "Values": ["true"]}])
                except (botocore.exceptions.ClientError, *AMBIGUOUS_EXCEPTIONS) as e:
                    raise _api_error("DescribeSubnets", e) from e
                by_zone: dict[str, list[dict[str, Any]]] = {}
                for s in tagged:
                    for z in (s["AvailabilityZone"], s.get("AvailabilityZoneId")):
                        if z:
                            by_zone.setdefault(z, []).append(s)
                # Most free addresses first: InsufficientFreeAddressesInSubnet is the failure this avoids.
                c.discovered = {z: [s["SubnetId"] for s in sorted(ss, key=lambda s: -s.get("AvailableIpAddressCount", 0))]
                                for z, ss in by_zone.items()}
                c.default_for_az = {}
                for s in default:
                    c.default_for_az[s["AvailabilityZone"]] = s["SubnetId"]
                    if s.get("AvailabilityZoneId"):
                        c.default_for_az[s["AvailabilityZoneId"]] = s["SubnetId"]
                c.fetched_at = time.monotonic()
            return dict(c.discovered), dict(c.default_for_az or {})

    def _describe_subnets(self, filters: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for page in self.ec2.get_paginator("describe_subnets").paginate(Filters=filters):
            out.extend(page.get("Subnets", []))
        return out

    # ------------------------------------------------------------------ idempotency lookup

    def _instances_for_token(self, token: str) -> list[dict[str, Any]]:
        """Live instances of this cluster created under `token` (any earlier attempt of this launch)."""
        filters = [
            {"Name": f"tag:{TAG_REQUEST}", "Values": [token]},
            {"Name": f"tag:{TAG_CLUSTER}", "Values": [self.cluster_name]},
            {"Name": "instance-state-name", "Values": list(LIVE_STATES)},
        ]
        try:
            return [i for i in self._describe(filters) if _tags_of(i).get(TAG_REQUEST) == token]
        except (botocore.exceptions.ClientError, *AMBIGUOUS_EXCEPTIONS) as e:
            # If we cannot tell whether the launch happened we must not launch again: report a transient failure.
            # Anything it did create carries the cluster tag and shows up in the next listing.
            raise TransientBackendError(
                f"cannot check launch token {token} after an ambiguous RunInstances failure: {_short(e)}",
                category="DescribeInstances") from e

    def _settle(self, spec: LaunchSpec, found: list[dict[str, Any]]) -> list[str]:
        """Turn what an earlier attempt created into this launch's result: exactly spec.count, or nothing."""
        found = sorted(found, key=lambda i: (i.get("LaunchTime") or 0, i["InstanceId"]))
        ids = [i["InstanceId"] for i in found]
        if len(ids) > spec.count:
            extra = ids[spec.count:]
            logger.warning("token %s has %d instances for count %d; terminating %s",
                           spec.request_token, len(ids), spec.count, extra)
            self._terminate_ids(extra)
            ids = ids[:spec.count]
        elif len(ids) < spec.count:
            # EC2 launches MinCount==MaxCount all-or-nothing; a short set means a broken endpoint. Never leak.
            self._terminate_ids(ids)
            raise TransientBackendError(
                f"launch token {spec.request_token}: found {len(ids)} of {spec.count} instances after an ambiguous "
                f"failure; terminated them", category="PartialLaunch")
        for inst in found:
            if inst["InstanceId"] in ids:
                self._known.add(inst["InstanceId"], _tags_of(inst))
        logger.info("launch token %s already ran: %s", spec.request_token, ",".join(ids))
        return ids

    # ------------------------------------------------------------------ list

    def _describe(self, filters: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        pages = self.ec2.get_paginator("describe_instances").paginate(
            Filters=filters, PaginationConfig={"PageSize": self.page_size})
        for page in pages:
            for r in page.get("Reservations", []):
                out.extend(r.get("Instances", []))
        return out

    def list_machines(self) -> list[Machine]:
        filters = [
            {"Name": f"tag:{TAG_CLUSTER}", "Values": [self.cluster_name]},
            {"Name": "instance-state-name", "Values": list(LISTED_STATES)},
        ]
        try:
            instances = self._describe(filters)
        except (botocore.exceptions.ClientError, *AMBIGUOUS_EXCEPTIONS) as e:
            err = _api_error("DescribeInstances", e)
            raise err from e
        machines: list[Machine] = []
        known: dict[str, dict[str, str]] = {}
        for inst in instances:
            tags = _tags_of(inst)
            if tags.get(TAG_CLUSTER) != self.cluster_name:
                continue            # never trust a server-side filter with what terminate may touch
            iid = inst["InstanceId"]
            state = inst.get("State", {}).get("Name", "")
            known[iid] = tags
            if state not in LIVE_STATES:
                if iid not in self._warned_stopped:
                    self._warned_stopped.add(iid)
                    logger.warning("instance %s of cluster %s is %s (not by ray_nodeless); it is not a Ray node "
                                   "and still costs EBS storage: terminate it", iid, self.cluster_name, state)
                continue
            launched = inst.get("LaunchTime")
            machines.append(Machine(
                id=iid,
                tags=tags,
                state=MACHINE_PENDING if state == "pending" else MACHINE_RUNNING,
                internal_ip=inst.get("PrivateIpAddress"),
                external_ip=inst.get("PublicIpAddress"),
                launched_at=launched.timestamp() if hasattr(launched, "timestamp") else 0.0,
            ))
        self._known.replace(known)
        return machines

    # ------------------------------------------------------------------ terminate / tags

    def _ours(self, ids: list[str]) -> list[str]:
        """The subset of `ids` that carries this cluster's tag and is not terminated (known, else one describe)."""
        ours = [i for i in ids if self._known.has(i)]
        unknown = [i for i in ids if not self._known.has(i)]
        for chunk in _chunks(unknown, FILTER_VALUES_CHUNK):
            filters = [
                {"Name": "instance-id", "Values": chunk},
                {"Name": f"tag:{TAG_CLUSTER}", "Values": [self.cluster_name]},
                {"Name": "instance-state-name", "Values": list(LISTED_STATES)},
            ]
            try:
                found = self._describe(filters)
            except (botocore.exceptions.ClientError, *AMBIGUOUS_EXCEPTIONS) as e:
                raise _api_error("DescribeInstances", e) from e
            for inst in found:
                tags = _tags_of(inst)
                if tags.get(TAG_CLUSTER) == self.cluster_name:
                    self._known.add(inst["InstanceId"], tags)
                    ours.append(inst["InstanceId"])
        return ours

    def terminate(self, machine_ids: list[str]) -> None:
        ids = list(dict.fromkeys(machine_ids))
        if not ids:
            return
        ours = set(self._ours(ids))
        skipped = [i for i in ids if i not in ours]
        if skipped:
            logger.warning("terminate: skipping %d ids that are gone or not tagged %s=%s: %s", len(skipped),
                           TAG_CLUSTER, self.cluster_name, skipped[:20])
        self._terminate_ids([i for i in ids if i in ours])

    def _terminate_ids(self, ids: list[str]) -> None:
        for chunk in _chunks(list(ids), TERMINATE_CHUNK):
            remaining = chunk
            # EC2 fails the whole call if one id no longer exists; drop the ids it names and try again.
            for _ in range(3):
                if not remaining:
                    break
                try:
                    self.ec2.terminate_instances(InstanceIds=remaining)
                    logger.info("terminated %s", ",".join(remaining))
                    break
                except botocore.exceptions.ClientError as e:
                    if _error_code(e) not in NOT_FOUND_CODES:
                        raise _api_error("TerminateInstances", e) from e
                    gone = set(_INSTANCE_ID.findall(_error_message(e)))
                    if not gone & set(remaining):
                        # Message not parseable: ask which ones still exist.
                        gone = set(remaining) - set(self._ours_uncached(remaining))
                    logger.info("terminate: already gone %s", sorted(gone))
                    remaining = [i for i in remaining if i not in gone]
                except AMBIGUOUS_EXCEPTIONS as e:
                    raise _api_error("TerminateInstances", e) from e
            self._known.discard(chunk)

    def _ours_uncached(self, ids: list[str]) -> list[str]:
        self._known.discard(ids)
        return self._ours(ids)

    def set_tags(self, machine_id: str, tags: dict[str, str]) -> None:
        if not tags:
            return
        tags = {str(k): str(v) for k, v in tags.items()}
        if tags.get(TAG_CLUSTER, self.cluster_name) != self.cluster_name:
            # Re-tagging would move the instance out of this cluster's reach (and into another's).
            raise BackendError(f"refusing to set {TAG_CLUSTER}={tags[TAG_CLUSTER]!r} on {machine_id}",
                               category="WrongCluster")
        if not self._ours([machine_id]):
            # Gone (spot reclaim) or someone else's: never an exception loop in the autoscaler for this.
            logger.warning("set_tags: %s is gone or not tagged %s=%s; not tagging", machine_id, TAG_CLUSTER,
                           self.cluster_name)
            return
        try:
            self.ec2.create_tags(Resources=[machine_id], Tags=[{"Key": k, "Value": v} for k, v in tags.items()])
        except botocore.exceptions.ClientError as e:
            if _error_code(e) in NOT_FOUND_CODES:
                self._known.discard([machine_id])
                logger.warning("set_tags: %s vanished", machine_id)
                return
            raise _api_error("CreateTags", e) from e
        except AMBIGUOUS_EXCEPTIONS as e:
            raise _api_error("CreateTags", e) from e
        self._known.merge_tags(machine_id, tags)

    def close(self) -> None:
        for c in self.clients:
            try:
                c.close()
            except Exception:  # noqa: BLE001 - closing is best effort
                pass


def _merge_tag_specs(user_specs: list[dict[str, Any]], tags: dict[str, str]) -> list[dict[str, Any]]:
    """User TagSpecifications with our tags added to (and overriding them on) the instance and volume entries."""
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for spec in user_specs:
        rt = spec.get("ResourceType")
        if rt in ("instance", "volume"):
            merged = {t["Key"]: t.get("Value", "") for t in spec.get("Tags", [])}
            merged.update(tags)
            out.append({"ResourceType": rt, "Tags": [{"Key": k, "Value": v} for k, v in merged.items()]})
            seen.add(rt)
        else:
            out.append(spec)
    for rt in ("instance", "volume"):
        if rt not in seen:
            out.append({"ResourceType": rt, "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]})
    return out


def _short(exc: BaseException) -> str:
    if isinstance(exc, botocore.exceptions.ClientError):
        return f"{_error_code(exc)}: {_error_message(exc)}"
    return f"{type(exc).__name__}: {exc}"
