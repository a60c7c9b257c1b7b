"""Compute Engine reservations on the fake: `reservations.insert / get / list / aggregatedList / delete`, and
instances that consume them (`reservationAffinity`), as GCE documents them; bodies are checked against the Compute
discovery document (`Reservation`), and the stored resources carry GCE's output fields (tests/testing/
test_fake_gce_reservations.py checks them against the same document).

What GCE does and this does too:
- a reservation holds `specificReservation.count` VMs of `instanceProperties.machineType` in one zone;
  `inUseCount` counts the running instances consuming it (int64s as strings, as in GCE's JSON);
- an insert with `consumeReservationType: SPECIFIC_RESERVATION` (key `compute.googleapis.com/reservation-name`,
  the reservation's name as the value) must name an existing reservation of the zone (400 otherwise) created with
  `specificReservationRequired: true` (400 "can not be targeted as specificReservationRequired is not set"), and
  fails in its operation with `CONDITION_NOT_MET` when the machine type is not the reservation's ("No available
  resources in specified reservations") or it is full ("Specified reservation '<name>' does not have available
  resources for the request.", the wording Cluster Autoscaler's GCE provider matches on);
- deleting a consuming instance frees its place.
Not modelled: ANY_RESERVATION consumption of open reservations, shared and future reservations, resize.
"""
from __future__ import annotations

import copy
import threading
from typing import Any, Callable

from ray_nodeless.testing.fake_gce.filters import filter_match, parse_filter
from ray_nodeless.testing.fake_gce.schema import ApiError, validate_body

NAME_KEY = "compute.googleapis.com/reservation-name"


class ReservationHandlers:
    project: str
    zones: dict[str, str]
    reservations: dict[str, dict]         # "<zone>/<name>" -> stored resource
    lock: threading.RLock
    _ids: Any
    _zone_url: Callable[[str], str]
    _new_op: Callable[..., dict]
    _page: Callable[..., dict]

    def _reservation(self, zone: str, name: str) -> dict:
        r = self.reservations.get(f"{zone}/{name}")
        if r is None:
            raise ApiError(404, f"The resource 'projects/{self.project}/zones/{zone}/reservations/{name}' was not "
                                "found", reason="notFound")
        return r

    def _reservations_insert(self, q: dict, body: Any, zone: str) -> dict:
        validate_body(body, "Reservation", "reservation")
        name = body.get("name")
        spec = body.get("specificReservation") or {}
        mt = (spec.get("instanceProperties") or {}).get("machineType")
        if not name or not mt or int(spec.get("count") or 0) < 1:
            raise ApiError(400, "Invalid value for field 'resource': a reservation needs a name, "
                                "specificReservation.count >= 1 and instanceProperties.machineType")
        with self.lock:
            if f"{zone}/{name}" in self.reservations:
                raise ApiError(409, f"The resource 'projects/{self.project}/zones/{zone}/reservations/{name}' "
                                    "already exists", reason="alreadyExists")
            r = copy.deepcopy(body)
            r.update(kind="compute#reservation", id=str(next(self._ids)), zone=self._zone_url(zone),
                     selfLink=f"{self._zone_url(zone)}/reservations/{name}", status="READY",
                     creationTimestamp="2026-01-01T00:00:00.000-00:00")
            r.setdefault("specificReservationRequired", False)
            r["specificReservation"]["count"] = str(int(spec["count"]))
            r["specificReservation"]["inUseCount"] = "0"
            r["specificReservation"]["assuredCount"] = str(int(spec["count"]))
            self.reservations[f"{zone}/{name}"] = r
            op = self._new_op(zone, "insert", name)
            op["targetLink"] = r["selfLink"]
            return copy.deepcopy(op)

    def _reservations_get(self, q: dict, body: Any, zone: str, name: str) -> dict:
        with self.lock:
            return copy.deepcopy(self._reservation(zone, name))

    def _reservations_list(self, q: dict, body: Any, zone: str) -> dict:
        with self.lock:
            items = [copy.deepcopy(r) for k, r in sorted(self.reservations.items()) if k.startswith(zone + "/")]
        if q.get("filter"):
            terms = parse_filter(q["filter"])
            items = [i for i in items if filter_match(i, terms)]
        return self._page(items, q, "compute#reservationList")

    def _reservations_aggregatedList(self, q: dict, body: Any) -> dict:
        with self.lock:
            scoped: dict[str, Any] = {f"zones/{z}": {"reservations": [
                copy.deepcopy(r) for k, r in sorted(self.reservations.items()) if k.startswith(z + "/")]}
                for z in sorted(self.zones)}
        for z, v in scoped.items():
            if not v["reservations"]:
                scoped[z] = {"warning": {"code": "NO_RESULTS_ON_PAGE", "message": "There are no results for scope "
                                                                                   f"'{z}' on this page."}}
        return {"kind": "compute#reservationAggregatedList", "items": scoped}

    def _reservations_delete(self, q: dict, body: Any, zone: str, name: str) -> dict:
        with self.lock:
            self._reservation(zone, name)
            del self.reservations[f"{zone}/{name}"]
            return copy.deepcopy(self._new_op(zone, "delete", name))

    # ---- instances consuming them
    def _consume(self, body: dict, zone: str, machine_type: str) -> dict | None:
        """For an instance insert: None when it consumes nothing or its reservation took it (inUseCount + 1); the
        operation's error when the reservation cannot; ApiError(400) for an affinity GCE refuses outright."""
        aff = body.get("reservationAffinity") or {}
        if aff.get("consumeReservationType") != "SPECIFIC_RESERVATION":
            return None
        values = aff.get("values") or []
        if aff.get("key") != NAME_KEY or len(values) != 1:
            raise ApiError(400, "Invalid value for field 'resource.reservationAffinity': a SPECIFIC_RESERVATION "
                                f"names one reservation under the key {NAME_KEY}")
        name = str(values[0]).rsplit("/", 1)[-1]
        r = self.reservations.get(f"{zone}/{name}")
        if r is None:
            raise ApiError(400, f"Invalid value for field 'resource.reservationAffinity': Specified reservations "
                                f"[projects/{self.project}/reservations/{name}] do not exist.")
        if not r.get("specificReservationRequired"):
            raise ApiError(400, f"Invalid value for field 'resource.reservationAffinity': Specified reservations "
                                f"[projects/{self.project}/reservations/{name}] can not be targeted as "
                                "specificReservationRequired is not set")
        spec = r["specificReservation"]
        if spec["instanceProperties"]["machineType"].rsplit("/", 1)[-1] != machine_type:
            return {"errors": [{"code": "CONDITION_NOT_MET",
                                "message": f"No available resources in specified reservations '{name}'."}]}
        if int(spec["inUseCount"]) >= int(spec["count"]):
            return {"errors": [{"code": "CONDITION_NOT_MET", "message": f"Specified reservation '{name}' does not "
                                "have available resources for the request."}]}
        spec["inUseCount"] = str(int(spec["inUseCount"]) + 1)
        return None

    def _release(self, inst: dict, zone: str) -> None:
        """A consuming instance is gone: its reservation's place is free again."""
        aff = inst.get("reservationAffinity") or {}
        if aff.get("consumeReservationType") != "SPECIFIC_RESERVATION":
            return
        r = self.reservations.get(f"{zone}/{str((aff.get('values') or [''])[0]).rsplit('/', 1)[-1]}")
        if r is not None:
            spec = r["specificReservation"]
            spec["inUseCount"] = str(max(0, int(spec["inUseCount"]) - 1))
