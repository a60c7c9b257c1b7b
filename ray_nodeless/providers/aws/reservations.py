"""The region's On-Demand Capacity Reservations and Capacity Blocks (capacity `reserved`, launch/reservations.py):
one paginated DescribeCapacityReservations of the active ones.

EC2's fields read (botocore's model, `CapacityReservation`): CapacityReservationId, InstanceType, AvailabilityZone,
TotalInstanceCount, AvailableInstanceCount, InstanceMatchCriteria (open | targeted), ReservationType (default |
capacity-block), StartDate, EndDate, Tags, and InstancePlatform and Tenancy: only `Linux/UNIX` on default tenancy,
what ray_nodeless launches (a Windows or dedicated reservation would refuse our instances).
"""
from __future__ import annotations

from datetime import datetime
from typing import Any

from botocore.client import BaseClient

from ray_nodeless.providers.aws.errors import CALL_ERRORS, api_error
from ray_nodeless.providers.base import Reservation

PLATFORM = "Linux/UNIX"
TENANCY = "default"


def _epoch(v: Any) -> float | None:
    return v.timestamp() if isinstance(v, datetime) else None


def reservation_of(cr: dict[str, Any]) -> Reservation:
    return Reservation(
        id=cr["CapacityReservationId"], instance_type=cr.get("InstanceType", ""), zone=cr.get("AvailabilityZone", ""),
        total=int(cr.get("TotalInstanceCount") or 0), available=int(cr.get("AvailableInstanceCount") or 0),
        match=cr.get("InstanceMatchCriteria") or "open", kind=cr.get("ReservationType") or "default",
        start=_epoch(cr.get("StartDate")), end=_epoch(cr.get("EndDate")),
        tags={t["Key"]: t.get("Value", "") for t in cr.get("Tags") or []})


def list_reservations(ec2: BaseClient) -> list[Reservation]:
    """The active reservations ray_nodeless can launch into; BackendError (typed) when EC2 refuses the call."""
    out: list[Reservation] = []
    try:
        pages = ec2.get_paginator("describe_capacity_reservations").paginate(
            Filters=[{"Name": "state", "Values": ["active"]}])
        for page in pages:
            for cr in page.get("CapacityReservations", []):
                if cr.get("State", "active") != "active":
                    continue
                if cr.get("InstancePlatform", PLATFORM) != PLATFORM or cr.get("Tenancy", TENANCY) != TENANCY:
                    continue
                out.append(reservation_of(cr))
    except CALL_ERRORS as e:
        raise api_error("DescribeCapacityReservations", e) from e
    return sorted(out, key=lambda r: r.id)
