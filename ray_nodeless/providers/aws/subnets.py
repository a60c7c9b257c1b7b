"""Which subnet a launch in a given zone goes into.

In order: the node type's own `SubnetIds` / `SubnetId` (the one in the planned zone), `provider.subnets`
({zone: subnet}), subnets tagged `ray-nodeless-subnet` (most free addresses first), else none, which lets EC2 use
the default VPC's subnet of the zone. A zone the chosen source does not cover is a `CapacityError`
(`NoSubnetInZone`): the launcher then moves on to an offering in another zone.
"""
from __future__ import annotations

import threading
from typing import Any, Mapping

from botocore.client import BaseClient
from cachetools import TTLCache

from ray_nodeless.errors import CapacityError
from ray_nodeless.providers.aws.errors import CALL_ERRORS, api_error

# Subnets tagged with this key (any value) are the ones launched into when neither node_config nor
# provider.subnets names one.
SUBNET_DISCOVERY_TAG = "ray-nodeless-subnet"
# How long a discovery (tagged and default subnets) is reused: subnets change rarely, and a newly tagged subnet
# should be used within minutes without a DescribeSubnets per launch.
SUBNET_CACHE_TTL_S = 300.0

_DISCOVERY = "discovery"      # the one key of the discovery cache


class Subnets:
    """Subnet choice for one backend. A subnet's zone never changes, so it is looked up once per subnet id."""

    def __init__(self, ec2: BaseClient, configured: Mapping[str, str] | None):
        self._ec2 = ec2
        self._configured = dict(configured or {})                       # provider.subnets
        self._zone_of: dict[str, tuple[str, str]] = {}                  # subnet id -> (AZ name, AZ id)
        # (AZ -> subnets tagged SUBNET_DISCOVERY_TAG, AZ -> default subnet), by AZ name and by AZ id
        self._discovery: TTLCache = TTLCache(maxsize=1, ttl=SUBNET_CACHE_TTL_S)
        self._lock = threading.Lock()

    def for_zone(self, zone: str, user_subnets: list[str] | None) -> str | None:
        """The subnet to launch into for `zone` (a name or an AZ id), or None for the default VPC's subnet."""
        if user_subnets:
            zone_of = self._zones(list(user_subnets))
            for s in user_subnets:
                if zone in zone_of.get(s, ()):
                    return s
            raise CapacityError(f"none of node_config SubnetIds {list(user_subnets)} is in zone {zone}",
                                category="NoSubnetInZone")
        if self._configured:
            if zone in self._configured:
                return self._configured[zone]
            raise CapacityError(f"provider.subnets has no subnet for zone {zone}", category="NoSubnetInZone")
        tagged, defaults = self._discovered()
        if tagged:
            candidates = tagged.get(zone)
            if not candidates:
                raise CapacityError(f"no subnet tagged {SUBNET_DISCOVERY_TAG} in zone {zone}",
                                    category="NoSubnetInZone")
            return candidates[0]
        return defaults.get(zone)

    def _zones(self, subnet_ids: list[str]) -> dict[str, tuple[str, str]]:
        with self._lock:
            missing = [s for s in subnet_ids if s not in self._zone_of]
            if missing:
                try:
                    resp = self._ec2.describe_subnets(SubnetIds=missing)
                except CALL_ERRORS as e:
                    raise api_error("DescribeSubnets", e) from e
                for s in resp.get("Subnets", []):
                    self._zone_of[s["SubnetId"]] = (s["AvailabilityZone"], s.get("AvailabilityZoneId", ""))
            return dict(self._zone_of)

    def _discovered(self) -> tuple[dict[str, list[str]], dict[str, str]]:
        with self._lock:
            hit = self._discovery.get(_DISCOVERY)
            if hit is None:
                hit = self._discovery[_DISCOVERY] = self._discover()
            return hit

    def _discover(self) -> tuple[dict[str, list[str]], dict[str, str]]:
        try:
            tagged = self._describe([{"Name": "tag-key", "Values": [SUBNET_DISCOVERY_TAG]}])
            default = [] if tagged else self._describe([{"Name": "default-for-az", "Values": ["true"]}])
        except CALL_ERRORS as e:
            raise api_error("DescribeSubnets", e) from e
        by_zone: dict[str, list[dict[str, Any]]] = {}
        for s in tagged:
            for z in (s["AvailabilityZone"], s.get("AvailabilityZoneId")):
                if z:
                    by_zone.setdefault(z, []).append(s)
        # Most free addresses first: InsufficientFreeAddressesInSubnet is the failure this avoids.
        by_tag = {z: [s["SubnetId"] for s in sorted(ss, key=lambda s: -s.get("AvailableIpAddressCount", 0))]
                  for z, ss in by_zone.items()}
        by_default: dict[str, str] = {}
        for s in default:
            by_default[s["AvailabilityZone"]] = s["SubnetId"]
            if s.get("AvailabilityZoneId"):
                by_default[s["AvailabilityZoneId"]] = s["SubnetId"]
        return by_tag, by_default

    def _describe(self, filters: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for page in self._ec2.get_paginator("describe_subnets").paginate(Filters=filters):
            out.extend(page.get("Subnets", []))
        return out
