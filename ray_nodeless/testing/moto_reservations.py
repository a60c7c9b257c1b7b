"""On-Demand Capacity Reservations and Capacity Blocks on the moto server, which has none (moto 5.2): EC2's
CreateCapacityReservation, DescribeCapacityReservations and CancelCapacityReservation, and RunInstances /
TerminateInstances that honour a `CapacityReservationSpecification` targeting a reservation, as EC2 documents them.

`install()` adds the three actions to moto's EC2Response (moto dispatches an action to the response method of its
snake-case name) and wraps its run_instances and terminate_instances; it is idempotent, and state is per moto
account and region. Responses are `ActionResult`s of plain dicts, which moto serializes through botocore's own EC2
service model (the shapes `CapacityReservation`, `CreateCapacityReservationResult`, ...); tests/testing/
test_moto_reservations.py checks every field produced here is a member of those shapes (none is dropped
silently) and reads them back through boto3.

What EC2 does and this does too:
- a reservation holds `TotalInstanceCount` instances of one type in one zone (Linux/UNIX, default tenancy);
  `AvailableInstanceCount` is that less the running instances launched into it;
- RunInstances targeting a reservation by id: the instance type and zone must be the reservation's
  (`InvalidParameterCombination`), it must exist and be active (`InvalidCapacityReservationId.NotFound`), and it
  must have room for MinCount (`ReservationCapacityExceeded`, the error EC2 and Karpenter's ODCR design name);
- a terminated instance frees its place; a cancelled reservation is `cancelled` and takes no instance;
- a Capacity Block (`ReservationType: capacity-block`, bought in EC2 with PurchaseCapacityBlock, here made by
  `add_capacity_block`) is `scheduled` before its StartDate, `active` until its EndDate, then `expired`.
Not modelled: open reservations absorbing untargeted launches (ray_nodeless always targets by id), reservation
groups, fleets, cross-account sharing, instance-platform variants beyond Linux/UNIX.
"""
from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

_LOCK = threading.RLock()
_BOOKS: dict[tuple[str, str], dict[str, "_Reservation"]] = {}
_INSTALLED = False


@dataclass
class _Reservation:
    id: str
    account: str
    region: str
    instance_type: str
    zone: str
    total: int
    match: str = "open"
    kind: str = "default"
    start: float = field(default_factory=time.time)
    end: float | None = None
    tags: dict[str, str] = field(default_factory=dict)
    cancelled: bool = False
    created: float = field(default_factory=time.time)
    instances: set[str] = field(default_factory=set)

    @property
    def state(self) -> str:
        now = time.time()
        if self.cancelled:
            return "cancelled"
        if self.kind == "capacity-block" and now < self.start:
            return "scheduled"
        if self.end is not None and now >= self.end:
            return "expired"
        return "active"

    def record(self) -> dict[str, Any]:
        """The reservation as botocore's `CapacityReservation` shape has it."""
        def ts(t: float) -> datetime:
            return datetime.fromtimestamp(t, tz=timezone.utc)

        rec: dict[str, Any] = {
            "CapacityReservationId": self.id, "OwnerId": self.account,
            "CapacityReservationArn": f"arn:aws:ec2:{self.region}:{self.account}:capacity-reservation/{self.id}",
            "InstanceType": self.instance_type, "InstancePlatform": "Linux/UNIX", "AvailabilityZone": self.zone,
            "Tenancy": "default", "TotalInstanceCount": self.total,
            "AvailableInstanceCount": 0 if self.state != "active" else max(0, self.total - len(self.instances)),
            "EbsOptimized": False, "EphemeralStorage": False, "State": self.state, "StartDate": ts(self.start),
            "EndDateType": "unlimited" if self.end is None else "limited", "InstanceMatchCriteria": self.match,
            "CreateDate": ts(self.created), "Tags": [{"Key": k, "Value": v} for k, v in sorted(self.tags.items())],
            "ReservationType": self.kind,
        }
        if self.end is not None:
            rec["EndDate"] = ts(self.end)
        return rec


def _book(account: str, region: str) -> dict[str, _Reservation]:
    return _BOOKS.setdefault((account, region), {})


def reset() -> None:
    with _LOCK:
        _BOOKS.clear()


def add_capacity_block(account: str, region: str, instance_type: str, zone: str, count: int, start: float,
                       end: float, tags: dict[str, str] | None = None) -> str:
    """A Capacity Block as PurchaseCapacityBlock leaves one (targeted, with its start and end)."""
    rid = f"cr-{uuid.uuid4().hex[:17]}"
    with _LOCK:
        _book(account, region)[rid] = _Reservation(rid, account, region, instance_type, zone, count,
                                                   match="targeted", kind="capacity-block", start=start, end=end,
                                                   tags=dict(tags or {}))
    return rid


def _error(code: str, message: str) -> Exception:
    from moto.ec2.exceptions import EC2ClientError

    return EC2ClientError(code, message)


def _epoch(v: Any) -> float | None:
    if v is None or v == "":
        return None
    if isinstance(v, datetime):
        return v.timestamp()
    return datetime.fromisoformat(str(v).replace("Z", "+00:00")).timestamp()


def _matches(r: _Reservation, filters: list[dict[str, Any]]) -> bool:
    for f in filters:
        name, values = f.get("Name", ""), [str(v) for v in f.get("Values", [])]
        have = {"state": r.state, "instance-type": r.instance_type, "availability-zone": r.zone,
                "instance-match-criteria": r.match, "reservation-type": r.kind,
                "owner-id": r.account, "tenancy": "default", "instance-platform": "Linux/UNIX"}.get(name)
        if name.startswith("tag:"):
            have = r.tags.get(name[4:])
        elif name == "tag-key":
            if not set(values) & set(r.tags):
                return False
            continue
        if have is None or have not in values:
            return False
    return True


def install() -> None:
    """Add the capacity-reservation actions to moto's EC2 responses (idempotent)."""
    global _INSTALLED
    with _LOCK:
        if _INSTALLED:
            return
        from moto.core.responses import ActionResult
        from moto.ec2.responses import EC2Response

        run_instances = EC2Response.run_instances
        terminate_instances = EC2Response.terminate_instances

        def create_capacity_reservation(self: Any) -> Any:
            itype, zone = self._get_param("InstanceType"), self._get_param("AvailabilityZone")
            count = int(self._get_param("InstanceCount") or 0)
            if not itype or not zone or count < 1:
                raise _error("InvalidParameterValue", "InstanceType, AvailabilityZone and InstanceCount >= 1 are "
                                                      "required")
            if self._get_param("InstancePlatform", "Linux/UNIX") != "Linux/UNIX":
                raise _error("InvalidParameterValue", "only Linux/UNIX reservations are modelled here")
            tags: dict[str, str] = {}
            for spec in self._get_param("TagSpecifications", []) or []:
                tags.update({t["Key"]: t.get("Value", "") for t in spec.get("Tags", [])})
            rid = f"cr-{uuid.uuid4().hex[:17]}"
            r = _Reservation(rid, self.current_account, self.region, itype, zone, count,
                             match=self._get_param("InstanceMatchCriteria") or "open",
                             end=_epoch(self._get_param("EndDate")), tags=tags)
            with _LOCK:
                _book(self.current_account, self.region)[rid] = r
                return ActionResult({"CapacityReservation": r.record()})

        def describe_capacity_reservations(self: Any) -> Any:
            ids = self._get_param("CapacityReservationIds", []) or []
            filters = self._get_param("Filters", []) or []
            with _LOCK:
                book = _book(self.current_account, self.region)
                for rid in ids:
                    if rid not in book:
                        raise _error("InvalidCapacityReservationId.NotFound",
                                     f"The capacity reservation ID '{rid}' does not exist")
                out = [r.record() for rid, r in sorted(book.items())
                       if (not ids or rid in ids) and _matches(r, filters)]
            return ActionResult({"CapacityReservations": out})

        def cancel_capacity_reservation(self: Any) -> Any:
            rid = self._get_param("CapacityReservationId")
            with _LOCK:
                r = _book(self.current_account, self.region).get(rid)
                if r is None:
                    raise _error("InvalidCapacityReservationId.NotFound",
                                 f"The capacity reservation ID '{rid}' does not exist")
                r.cancelled = True
            return ActionResult({"Return": True})

        def run_instances_into_reservations(self: Any) -> Any:
            rid = self._get_param("CapacityReservationSpecification.CapacityReservationTarget.CapacityReservationId")
            if not rid:
                return run_instances(self)
            with _LOCK:      # held across the launch: two launches never both take the last place
                r = _book(self.current_account, self.region).get(rid)
                if r is None or r.state != "active":
                    raise _error("InvalidCapacityReservationId.NotFound",
                                 f"The capacity reservation ID '{rid}' does not exist or is not active")
                itype = self._get_param("InstanceType", "m1.small")
                zone = self._get_param("Placement.AvailabilityZone")
                if itype != r.instance_type or (zone and zone != r.zone):
                    raise _error("InvalidParameterCombination",
                                 f"the instance's attributes ({itype} in {zone}) do not match capacity reservation "
                                 f"{rid} ({r.instance_type} in {r.zone})")
                need = int(self._get_param("MinCount", if_none="1"))
                room = r.total - len(r.instances)
                if room < need:
                    raise _error("ReservationCapacityExceeded",
                                 f"There is not enough capacity in capacity reservation {rid}: {room} available, "
                                 f"{need} requested")
                result = run_instances(self)
                r.instances.update(i.id for i in result.result.instances)   # type: ignore[attr-defined]
                return result

        def terminate_instances_out_of_reservations(self: Any) -> Any:
            result = terminate_instances(self)
            ids = set(self._get_param("InstanceIds", []) or [])
            with _LOCK:
                for r in _book(self.current_account, self.region).values():
                    r.instances -= ids
            return result

        # moto's dispatch reads the class's functions at each request (method_names_from_class).
        for name, fn in (("create_capacity_reservation", create_capacity_reservation),
                         ("describe_capacity_reservations", describe_capacity_reservations),
                         ("cancel_capacity_reservation", cancel_capacity_reservation),
                         ("run_instances", run_instances_into_reservations),
                         ("terminate_instances", terminate_instances_out_of_reservations)):
            setattr(EC2Response, name, fn)
        _INSTALLED = True
