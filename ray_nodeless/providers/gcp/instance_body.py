"""The instances.insert body of one machine: the node type's node_config, with what the offering decides (machine
type, accelerators, spot or standard scheduling, zonal disk types) and the tags (labels + metadata manifest) set in
the body itself, so no instance ever exists untagged. Also the instance name and the insert's requestId, both
derived from the launch's request token so that a retried launch reuses them.
"""
from __future__ import annotations

import copy
import logging
import re
import uuid
from typing import Any

from ray_nodeless.providers.base import LaunchSpec
from ray_nodeless.providers.gcp.node_config import scheduling_map
from ray_nodeless.providers.gcp.reservations import affinity
from ray_nodeless.providers.gcp.labels import MAX_LABEL_LEN, METADATA_TAGS_KEY, tags_to_storage
from ray_nodeless.providers.gcp.settings import GcpSettings

logger = logging.getLogger(__name__)

# Namespace for deriving per-instance request ids and names from a launch's request token (uuid5).
_TOKEN_NAMESPACE = uuid.UUID("5f0b8f5e-8d0a-4c59-9a55-2a8f1b0c6e11")
# Hex digits of the token hash in an instance name: 40 bits keep names of one cluster apart, and leave most of
# GCE's 63 characters to the cluster name.
NAME_HASH_LEN = 10
STARTUP_SCRIPT_KEY = "startup-script"
# Families whose machine types accept only Hyperdisk boot disks (pd-* is rejected), used for the default disk.
_HYPERDISK_ONLY_FAMILIES = frozenset({"c4", "c4a", "c4d", "n4", "x4", "a4", "a4x", "m4", "h4d", "c3d-lssd"})
# Scheduling keys the offering's capacity type decides; node_config's values for them are dropped.
_CAPACITY_SCHEDULING_KEYS = ("preemptible", "provisioningModel", "instanceTerminationAction")


def resource_name(url: str) -> str:
    """The last path segment of a resource URL or partial URL (`zones/z/machineTypes/n1-standard-8` -> the type)."""
    return url.rstrip("/").rsplit("/", 1)[-1]


def instance_name(cluster_name: str, token: str, index: int) -> str:
    """`ray-<cluster>-<10 hex>` in GCE name syntax, derived from the request token so retries reuse it."""
    short = uuid.uuid5(_TOKEN_NAMESPACE, f"{token}/{index}").hex[:NAME_HASH_LEN]
    c = re.sub(r"[^a-z0-9-]+", "-", cluster_name.lower())
    c = re.sub(r"-{2,}", "-", c).strip("-")[:MAX_LABEL_LEN - len("ray--") - len(short)].rstrip("-")
    return f"ray-{c}-{short}" if c else f"ray-{short}"


def request_id_for(token: str, index: int) -> str:
    """The GCE requestId (must be a non-zero UUID) of instance `index` of a launch."""
    if index == 0:
        try:
            u = uuid.UUID(token)
            if u.int != 0:
                return str(u)
        except ValueError:
            pass
    return str(uuid.uuid5(_TOKEN_NAMESPACE, f"{token}/{index}/request"))


def instance_body(spec: LaunchSpec, name: str, request_id: str, settings: GcpSettings) -> dict[str, Any]:
    """The Compute `Instance` resource (JSON field names) to insert for instance `name` of `spec`."""
    it = spec.offering.instance_type
    zone = spec.offering.zone
    body: dict[str, Any] = copy.deepcopy(spec.node_config)
    body["name"] = name
    body["machineType"] = f"zones/{zone}/machineTypes/{it.machine_type or it.name}"
    # The offering decides the accelerators: node_config's guestAccelerators became an allow-list
    # (requirement_overrides), so copying them too would attach them twice or to the wrong host.
    body.pop("guestAccelerators", None)
    if it.attached_gpu and it.gpu_count:
        body["guestAccelerators"] = [{
            "acceleratorType": f"zones/{zone}/acceleratorTypes/{it.attached_gpu}",
            "acceleratorCount": int(it.gpu_count)}]
    body["scheduling"] = _scheduling(scheduling_map(body.get("scheduling")), spec.offering.capacity,
                                     bool(it.gpu_count or it.accelerator_count))
    if spec.reservation_id:
        # Capacity `reserved`: into that specific reservation (standard provisioning; GCE counts its VMs).
        body["reservationAffinity"] = affinity(spec.reservation_id)
    if not body.get("disks"):
        body["disks"] = [_default_boot_disk(it.family, zone, settings)]
    else:
        body["disks"] = [_zonal_disk(d, zone) for d in body["disks"]]
    if not body.get("networkInterfaces"):
        body["networkInterfaces"] = [{
            "network": settings.network,
            "accessConfigs": [{"name": "External NAT", "type": "ONE_TO_ONE_NAT"}]}]
    storage = tags_to_storage(spec.tags, request_id=request_id)
    labels = {str(k): str(v) for k, v in (body.get("labels") or {}).items()}
    labels.update(storage.labels)
    body["labels"] = labels
    md = dict(body.get("metadata") or {})
    items = [i for i in (md.get("items") or []) if i.get("key") != METADATA_TAGS_KEY]
    items.append({"key": METADATA_TAGS_KEY, "value": storage.metadata_value()})
    if spec.boot_script:
        if any(i.get("key") == STARTUP_SCRIPT_KEY for i in items):
            logger.warning("node type %s: metadata startup-script given with disable_node_updaters; it must "
                           "start Ray itself (ray_nodeless's boot script is not added)", spec.node_type)
        else:
            items.append({"key": STARTUP_SCRIPT_KEY, "value": spec.boot_script})
    md["items"] = items
    body["metadata"] = md
    return body


def _scheduling(given: dict[str, Any], capacity: str, has_accelerators: bool) -> dict[str, Any]:
    sched = {k: v for k, v in given.items() if k not in _CAPACITY_SCHEDULING_KEYS}
    if capacity == "spot":
        # spot VMs cannot live-migrate or restart; DELETE so a preempted node vanishes from the listing
        sched.update(provisioningModel="SPOT", instanceTerminationAction="DELETE", automaticRestart=False,
                     onHostMaintenance="TERMINATE")
    else:
        sched["provisioningModel"] = "STANDARD"
    if has_accelerators:
        sched["onHostMaintenance"] = "TERMINATE"     # GPU VMs do not support live migration
    return sched


def _default_boot_disk(family: str, zone: str, settings: GcpSettings) -> dict[str, Any]:
    disk_type = "hyperdisk-balanced" if family in _HYPERDISK_ONLY_FAMILIES else "pd-balanced"
    return {"boot": True, "autoDelete": True, "initializeParams": {
        "sourceImage": settings.image,
        "diskSizeGb": str(settings.disk_size_gb),
        "diskType": f"zones/{zone}/diskTypes/{disk_type}"}}


def _zonal_disk(disk: dict[str, Any], zone: str) -> dict[str, Any]:
    # A YAML written for one zone names disk types in that zone; the planner may pick another one.
    d = copy.deepcopy(disk)
    params = d.get("initializeParams") or {}
    dt = params.get("diskType")
    if isinstance(dt, str) and dt and not dt.startswith(("https://", "projects/")):
        params["diskType"] = f"zones/{zone}/diskTypes/{resource_name(dt)}"
    return d
