"""What the Compute Engine backend answers when the launch layer doubts a listing: a second query of another kind.

The listing is one `instances.aggregatedList` by the cluster label. A page of it can come back empty or short while
the instances run (a glitching endpoint or proxy; twice in a row too), so the second look never asks that method
again:

- by id: `instances.get` of each instance in the zone the backend saw it in (its launch or a listing). An
  instance GCE answers 404 for is gone (GCE's reads are consistent: a deleted instance is not found at once), with
  the reason its zone's operations give (`vanished_reasons`: a preemption or a delete call); one in a status that
  is not a Ray node any more (STOPPING, TERMINATED = stopped, SUSPENDED) is gone with no reason told; one whose
  zone the backend never saw, or whose answer is another cluster's, is left out (the contract's "shows nothing").
- with no ids (a fresh object's first listing: `ray down`, `ray-nodeless sweep`, a restarted monitor): the zonal
  `instances.list` by the cluster label in each zone of the region (the catalog's zones and every zone seen).
"""
from __future__ import annotations

from typing import Any

from ray_nodeless.errors import BackendError, TransientBackendError
from ray_nodeless.providers.base import TAG_CLUSTER, Machine, Recheck
from ray_nodeless.providers.gcp.errors import classify_http_error
from ray_nodeless.providers.gcp.labels import cluster_label_value


class GcpListing:
    """The second look; mixed into GcpBackend (uses its clients, policy, `_known`, `_machine`, `_get_instance`)."""

    project: str
    region: str
    cluster_name: str

    def _region_zones(self) -> list[str]:
        from ray_nodeless.core.catalog import embedded

        try:
            zones = set(embedded().region("gcp", self.region).zones)
        except Exception:   # noqa: BLE001 - a region the embedded catalog lacks: the zones seen still count
            zones = set()
        with self._known.lock:      # type: ignore[attr-defined]
            zones |= {z for z in self._known.seen.values() if z.startswith(self.region + "-")}  # type: ignore[attr-defined]
        return sorted(zones)

    def _zonal_list(self, zone: str) -> list[Any]:
        from google.cloud import compute_v1

        what = f"list instances in {zone}"
        request = compute_v1.ListInstancesRequest(
            project=self.project, zone=zone, max_results=500,
            filter=f'labels.{TAG_CLUSTER} = "{cluster_label_value(self.cluster_name)}"')
        try:
            return list(self._policy.call(what, self._clients.instances.list, request=request))  # type: ignore[attr-defined]
        except BackendError:
            raise
        except Exception as e:  # noqa: BLE001 - API, requests and google.auth errors, on any page
            raise TransientBackendError(f"{what} of cluster {self.cluster_name}: {e}",
                                        category=classify_http_error(e).category) from e

    def recheck(self, machine_ids: list[str] | None) -> Recheck:
        if machine_ids is None:
            live: dict[str, Machine] = {}
            for zone in self._region_zones():
                for inst in self._zonal_list(zone):
                    m = self._machine(inst)             # type: ignore[attr-defined]
                    if m is not None:
                        live[m.id] = m
                        with self._known.lock:          # type: ignore[attr-defined]
                            self._known.zones[m.id] = zone      # type: ignore[attr-defined]
                            self._known.saw(m.id, zone)         # type: ignore[attr-defined]
            return Recheck(live=[live[i] for i in sorted(live)])
        with self._known.lock:                          # type: ignore[attr-defined]
            zones = {m: self._known.seen.get(m) for m in machine_ids}   # type: ignore[attr-defined]
        out = Recheck()
        not_found: list[str] = []
        for mid in machine_ids:
            zone = zones[mid]
            if zone is None:
                continue                # never seen: nowhere to ask (left out)
            inst = self._get_instance(zone, mid)        # type: ignore[attr-defined]
            if inst is None:
                not_found.append(mid)
                continue
            if self._tags(inst).get(TAG_CLUSTER) != self.cluster_name:   # type: ignore[attr-defined]
                continue                # a name reused by another cluster: not ours to tell about
            m = self._machine(inst)                     # type: ignore[attr-defined]
            if m is not None:
                out.live.append(m)
                with self._known.lock:                  # type: ignore[attr-defined]
                    self._known.zones[mid] = zone       # type: ignore[attr-defined]
            else:
                out.gone[mid] = ""      # stopped or suspended: not a Ray node any more
        if not_found:
            reasons = self.vanished_reasons(not_found)  # type: ignore[attr-defined]
            out.gone.update({mid: reasons.get(mid, "") for mid in not_found})
        return out
