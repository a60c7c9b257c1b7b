"""Config-time checks of a node type's gcp node_config (the instances.insert body keys, as in Ray's own GCP
provider), and the planner requirements those keys imply. No client, no network.
"""
from __future__ import annotations

import json
import logging
import re
from typing import Any, Mapping

from ray_nodeless.core.gpus import canonical_gpu
from ray_nodeless.errors import ConfigError
from ray_nodeless.providers.gcp.instance_body import resource_name
from ray_nodeless.providers.gcp.labels import LABEL_KEY_RE, LABEL_VALUE_RE

logger = logging.getLogger(__name__)

# Every property of the Compute v1 `Instance` resource (discovery revision 20261106). node_config may use the
# writable ones; output-only ones and the ones ray_nodeless sets itself are rejected with a clear message.
INSTANCE_FIELDS = frozenset({
    "advancedMachineFeatures", "canIpForward", "confidentialInstanceConfig", "cpuPlatform", "creationTimestamp",
    "deletionProtection", "description", "disks", "displayDevice", "fingerprint", "guestAccelerators", "hostname",
    "id", "instanceEncryptionKey", "keyRevocationActionType", "kind", "labelFingerprint", "labels",
    "lastStartTimestamp", "lastStopTimestamp", "lastSuspendedTimestamp", "localSsdEncryptionMode", "machineType",
    "metadata", "minCpuPlatform", "name", "networkInterfaces", "networkPerformanceConfig", "params",
    "privateIpv6GoogleAccess", "reservationAffinity", "resourcePolicies", "resourceStatus", "satisfiesPzi",
    "satisfiesPzs", "scheduling", "selfLink", "serviceAccounts", "shieldedInstanceConfig",
    "shieldedInstanceIntegrityPolicy", "sourceMachineImage", "sourceMachineImageEncryptionKey", "startRestricted",
    "status", "statusMessage", "tags", "workloadIdentityConfig", "zone",
})
OUTPUT_ONLY_FIELDS = frozenset({
    "cpuPlatform", "creationTimestamp", "id", "kind", "lastStartTimestamp", "lastStopTimestamp",
    "lastSuspendedTimestamp", "resourceStatus", "satisfiesPzi", "satisfiesPzs", "selfLink", "startRestricted",
    "status", "statusMessage", "zone", "fingerprint", "labelFingerprint",
})
SET_BY_BACKEND_FIELDS = frozenset({"name"})


def requirement_overrides(node_config: Mapping[str, Any]) -> dict[str, Any]:
    """`machineType` (with its `guestAccelerators`) becomes an allow-list of that one catalog type."""
    mt = node_config.get("machineType")
    if not mt:
        return {}
    name = resource_name(str(mt))
    accs = node_config.get("guestAccelerators") or []
    if accs:
        acc = accs[0]
        count = int(acc.get("acceleratorCount", 1))
        model = canonical_gpu(resource_name(str(acc.get("acceleratorType", ""))))
        name = f"{name}+{count}x{model}"
    return {"instance_types": [name]}


def check_node_config(node_type: str, node_config: Mapping[str, Any], key: str) -> None:
    """Raise ConfigError naming `key`.<field> for node_config keys an insert could not take."""
    from google.cloud import compute_v1
    from google.protobuf import json_format

    for k in node_config:
        if k not in INSTANCE_FIELDS:
            raise ConfigError(f"{key}.{k}", f"not a Compute Engine Instance field (node type {node_type!r}); "
                                            "node_config takes the instances.insert body keys")
        if k in OUTPUT_ONLY_FIELDS:
            raise ConfigError(f"{key}.{k}", "is output-only in the Compute Engine API and cannot be set")
        if k in SET_BY_BACKEND_FIELDS:
            raise ConfigError(f"{key}.{k}", "ray_nodeless names every instance itself; remove it")
    # Nested keys and JSON types: parse with the client's own proto schema (what insert would send).
    try:
        compute_v1.Instance.from_json(json.dumps(dict(node_config)))
    except (json_format.ParseError, TypeError, ValueError) as e:
        m = re.search(r'at "?Instance\.?([\w.\[\]]*)', str(e))
        sub = f".{m.group(1)}" if m and m.group(1) else ""
        raise ConfigError(f"{key}{sub}", str(e).splitlines()[0]) from None
    accs = node_config.get("guestAccelerators") or []
    if accs and not node_config.get("machineType"):
        raise ConfigError(f"{key}.guestAccelerators", "needs a machineType beside it; to choose GPUs by "
                                                      "model let the planner pick with `gpus: [...]`")
    if len(accs) > 1:
        raise ConfigError(f"{key}.guestAccelerators", "only one accelerator type per instance is supported")
    for lk, lv in (node_config.get("labels") or {}).items():
        if not LABEL_KEY_RE.fullmatch(str(lk)) or not LABEL_VALUE_RE.fullmatch(str(lv)):
            raise ConfigError(f"{key}.labels.{lk}", "GCE labels must be lowercase [a-z0-9_-], keys start "
                                                    "with a letter, at most 63 characters")
    sched = node_config.get("scheduling") or {}
    if "preemptible" in sched or "provisioningModel" in sched:
        logger.warning("%s.scheduling: preemptible/provisioningModel are decided by the offering's capacity "
                       "type (use the `capacity` requirement); they are overridden at launch", key)
