"""The region's Compute Engine reservations ray_nodeless can launch into (capacity `reserved`,
launch/reservations.py): one `reservations.aggregatedList` of the project, the region's zones kept.

Only *specific* reservations (`specificReservationRequired: true`) are candidates: GCE lets an instance target a
reservation by name only then; open ones are consumed by any matching standard VM anyway (default affinity
ANY_RESERVATION), ours included. Fields read (the Compute discovery document's `Reservation`): name, zone, status
(READY only), specificReservation.count / inUseCount / instanceProperties.machineType. An instance targets one with
`reservationAffinity` (SPECIFIC_RESERVATION, key `compute.googleapis.com/reservation-name`, its name: `affinity`).
"""
from __future__ import annotations

from typing import Any, Callable

from ray_nodeless.providers.base import Reservation

NAME_KEY = "compute.googleapis.com/reservation-name"


def affinity(reservation_name: str) -> dict[str, Any]:
    return {"consumeReservationType": "SPECIFIC_RESERVATION", "key": NAME_KEY, "values": [reservation_name]}


def _last(url: str) -> str:
    return url.rstrip("/").rsplit("/", 1)[-1]


def instance_type_name(machine_type: str, accelerators: Any) -> str:
    """The catalog's name of a reservation's VM: its machine type, with attached GPUs as the catalog writes them
    (`n1-standard-8` + 1 x `nvidia-tesla-t4` -> `n1-standard-8+1xT4`)."""
    name = _last(machine_type)
    for a in accelerators or []:
        model = _last(a.accelerator_type).removeprefix("nvidia-tesla-").removeprefix("nvidia-").upper()
        name += f"+{int(a.accelerator_count)}x{model}"
    return name


def list_reservations(aggregated: Callable[[], Any], region: str) -> list[Reservation]:
    """`aggregated()`: the pager of ReservationsClient.aggregated_list ((scope, ReservationsScopedList) pairs)."""
    out: list[Reservation] = []
    for scope, scoped in aggregated():
        zone = _last(scope)
        if not zone.startswith(region + "-"):
            continue
        for r in scoped.reservations:
            spec = r.specific_reservation
            if r.status != "READY" or not r.specific_reservation_required or spec is None:
                continue
            count, used = int(spec.count or 0), int(spec.in_use_count or 0)
            props = spec.instance_properties
            out.append(Reservation(id=r.name, instance_type=instance_type_name(props.machine_type,
                                                                               props.guest_accelerators),
                                   zone=zone, total=count, available=max(0, count - used), match="targeted"))
    return sorted(out, key=lambda r: (r.zone, r.id))
