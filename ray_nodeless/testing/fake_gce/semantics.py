"""GCE's checks beyond the schema: name and label syntax, the machine type and accelerators the zone offers, GPUs
need `onHostMaintenance: TERMINATE`, spot/preemptible instances cannot restart automatically."""
from __future__ import annotations

import re

from ray_nodeless.testing.fake_gce.schema import ApiError

NAME_RE = re.compile(r"[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?")
LABEL_KEY_RE = re.compile(r"[a-z][-_a-z0-9]{0,62}")
LABEL_VALUE_RE = re.compile(r"[-_a-z0-9]{0,63}")
METADATA_KEY_RE = re.compile(r"[a-zA-Z0-9-_]{1,128}")
# GCE's limit of labels per resource.
MAX_LABELS = 64

# A machine type as the fake offers it: (vCPUs, memory MiB, built-in accelerators [(type, count)], shared core,
# architecture).
MachineTypeSpec = tuple[int, int, list[tuple[str, int]], bool, str]


def check_instance(body: dict, zone: str, machine_types: dict[str, MachineTypeSpec],
                   accelerator_types: dict[str, int]) -> None:
    """Semantic checks GCE makes on an insert body beyond the schema, given what the zone offers."""
    name = body.get("name")
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise ApiError(400, f"Invalid value for field 'resource.name': '{name}'. Must be a match of regex "
                            "'(?:[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?)'")
    mt = body.get("machineType")
    if not mt:
        raise ApiError(400, "Invalid value for field 'resource.machineType': ''. Machine type not specified.")
    m = re.search(r"zones/([^/]+)/machineTypes/([^/]+)$", mt)
    if not m or m.group(1) != zone:
        raise ApiError(400, f"Invalid value for field 'resource.machineType': '{mt}'. "
                            f"Machine type must be in zone '{zone}'.")
    if m.group(2) not in machine_types:
        raise ApiError(400, f"Invalid value for field 'resource.machineType': '{mt}'. "
                            f"Machine type with name '{m.group(2)}' does not exist in zone '{zone}'.")
    labels = body.get("labels", {})
    if len(labels) > MAX_LABELS:
        raise ApiError(400, f"Invalid value for field 'resource.labels': more than {MAX_LABELS} labels.")
    check_labels(labels, "resource.labels")
    for item in body.get("metadata", {}).get("items", []):
        if not METADATA_KEY_RE.fullmatch(item.get("key", "")):
            raise ApiError(400, f"Invalid value for field 'resource.metadata.items.key': '{item.get('key')}'")
    if not body.get("disks"):
        raise ApiError(400, "Invalid value for field 'resource.disks': ''. No boot disk specified.")
    if not body.get("networkInterfaces"):
        raise ApiError(400, "Invalid value for field 'resource.networkInterfaces': ''. "
                            "At least one network interface is required.")
    sched = body.get("scheduling", {})
    gpus = body.get("guestAccelerators", [])
    for acc in gpus:
        am = re.search(r"zones/([^/]+)/acceleratorTypes/([^/]+)$", acc.get("acceleratorType", ""))
        if not am or am.group(1) != zone or am.group(2) not in accelerator_types:
            raise ApiError(400, "Invalid value for field 'resource.guestAccelerators[0].acceleratorType': "
                                f"'{acc.get('acceleratorType')}'. Accelerator type does not exist in zone.")
    builtin = machine_types[m.group(2)][2]
    if (gpus or builtin) and sched.get("onHostMaintenance", "MIGRATE") != "TERMINATE":
        raise ApiError(400, "Instances with guest accelerators do not support live migration.")
    spot = sched.get("provisioningModel") == "SPOT" or sched.get("preemptible") is True
    if spot and sched.get("automaticRestart", True):
        raise ApiError(400, "Invalid value for field 'resource.scheduling.automaticRestart': 'true'. "
                            "Preemptible instances cannot be automatically restarted.")

def check_labels(labels: dict, where: str) -> None:
    for k, v in labels.items():
        if not LABEL_KEY_RE.fullmatch(k) or not LABEL_VALUE_RE.fullmatch(v):
            raise ApiError(400, f"Invalid value for field '{where}': '{k}={v}'. Label keys must start with a "
                                "lowercase letter; keys and values may contain only lowercase letters, digits, "
                                "'_' and '-', at most 63 characters.")
