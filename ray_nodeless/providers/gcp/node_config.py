"""Config-time checks of a node type's gcp node_config (the instances.insert body keys, as in Ray's own GCP
provider), and the planner requirements those keys imply. No client, no network.

Ray's keys keep their meaning (the whole table: ray_nodeless/swapin/keymap.py):
- `machineType` (with `guestAccelerators`) pins the catalog type (`n1-standard-8+1xT4`: host, GPU count and model);
- `scheduling` in map form or Ray's list form (`[{preemptible: true}, {onHostMaintenance: TERMINATE}]`, merged in
  order): `preemptible: true` / `provisioningModel: SPOT` pin spot capacity, `false` / `STANDARD` on-demand;
- `provider.availability_zone` ("us-west1-b", or a comma-separated list) limits the zones.
What ray_nodeless cannot honour is an error naming the key: custom machine types (the catalog has no per-vCPU /
per-GB rates to price them), `instanceTerminationAction: STOP`, `automaticRestart: true` on spot, ...
"""
from __future__ import annotations

import functools
import json
import logging
import re
import sys
from pathlib import Path
from typing import Any, Mapping

from ray_nodeless.core.gpus import KNOWN_GPU_MODELS, canonical_gpu
from ray_nodeless.core.requirements import REQUIREMENT_KEYS
from ray_nodeless.core.schema import suggest_key
from ray_nodeless.errors import ConfigError
from ray_nodeless.providers.gcp.labels import LABEL_KEY_RE, LABEL_VALUE_RE
from ray_nodeless.providers.gcp.settings import GcpSettings

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

# GCE custom machine types: `custom-6-16384` (N1), `n2-custom-8-32768`, `e2-custom-4-8192`, `...-ext`.
CUSTOM_MACHINE_TYPE = re.compile(r"^(?:(?P<series>[a-z][a-z0-9]*)-)?custom-(?P<vcpus>\d+)-(?P<mib>\d+)(?P<ext>-ext)?$")
# Families whose machine types come with their GPUs (a2-highgpu-1g has one A100): no guestAccelerators beside them.
BUILT_IN_GPU_FAMILIES = frozenset({"a2", "a3", "a4", "a4x", "g2", "g4"})
# scheduling values and the capacity type each pins.
PREEMPTIBLE_CAPACITY = {True: "spot", False: "on-demand"}
PROVISIONING_CAPACITY = {"SPOT": "spot", "STANDARD": "on-demand"}


def resource_name(url: str) -> str:
    """The last path segment of a resource URL or partial URL (`zones/z/machineTypes/n1-standard-8` -> the type)."""
    return str(url).rstrip("/").rsplit("/", 1)[-1]


def scheduling_map(value: Any, key: str = "scheduling") -> dict[str, Any]:
    """`scheduling` as one mapping: the map form as is, Ray's list form (`[{preemptible: true},
    {onHostMaintenance: TERMINATE}]`, what Ray's own GCP examples use) merged in order. A key given twice with two
    values is an error."""
    if value is None:
        return {}
    if isinstance(value, Mapping):
        return dict(value)
    if not isinstance(value, list):
        raise ConfigError(key, f"must be a mapping (or Ray's list of one-key mappings), got {value!r}")
    out: dict[str, Any] = {}
    for i, item in enumerate(value):
        if not isinstance(item, Mapping):
            raise ConfigError(f"{key}[{i}]", f"must be a mapping, got {item!r}")
        for k, v in item.items():
            if k in out and out[k] != v:
                raise ConfigError(f"{key}[{i}].{k}", f"{v!r} contradicts the earlier {out[k]!r}")
            out[k] = v
    return out


def scheduling_capacity(sched: Mapping[str, Any], key: str = "scheduling") -> str | None:
    """The capacity type `scheduling` pins (None: not pinned)."""
    pinned: dict[str, str] = {}
    if "preemptible" in sched:
        v = sched["preemptible"]
        if not isinstance(v, bool):
            raise ConfigError(f"{key}.preemptible", f"must be true or false, got {v!r}")
        pinned["preemptible"] = PREEMPTIBLE_CAPACITY[v]
    if "provisioningModel" in sched:
        v = sched["provisioningModel"]
        if v not in PROVISIONING_CAPACITY:
            raise ConfigError(f"{key}.provisioningModel", f"{v!r}: ray_nodeless launches SPOT or STANDARD VMs only")
        pinned["provisioningModel"] = PROVISIONING_CAPACITY[v]
    if len(set(pinned.values())) > 1:
        raise ConfigError(f"{key}.provisioningModel", f"{sched['provisioningModel']!r} contradicts preemptible: "
                                                      f"{str(sched['preemptible']).lower()}")
    return next(iter(pinned.values()), None)


def pinned_machine(node_config: Mapping[str, Any], key: str = "node_config") -> tuple[str, str, int] | None:
    """(machine type, GPU model, GPU count) that `machineType` + `guestAccelerators` pin, or None."""
    mt = node_config.get("machineType")
    if not mt:
        return None
    name = resource_name(str(mt))
    accs = node_config.get("guestAccelerators") or []
    if not accs:
        return name, "", 0
    if not isinstance(accs, list) or not isinstance(accs[0], Mapping):
        raise ConfigError(f"{key}.guestAccelerators", "must be a list of {acceleratorType, acceleratorCount}")
    acc = accs[0]
    count = acc.get("acceleratorCount", 1)
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ConfigError(f"{key}.guestAccelerators[0].acceleratorCount", f"must be a whole number >= 1, got {count!r}")
    model = canonical_gpu(resource_name(str(acc.get("acceleratorType", ""))))
    return name, model, count


def catalog_type_name(machine_type: str, gpu_model: str, gpu_count: int) -> str:
    """The catalog's name of a host with attached GPUs (`n1-standard-8+1xT4`), or the machine type itself."""
    return f"{machine_type}+{gpu_count}x{gpu_model}" if gpu_count else machine_type


def availability_zones(settings: GcpSettings | None) -> list[str] | None:
    """Ray's `provider.availability_zone` (one zone; a comma-separated list is accepted) as zones of the region."""
    if settings is None or settings.availability_zone is None:
        return None
    value, region = settings.availability_zone, settings.region
    if not isinstance(value, str):
        raise ConfigError("provider.availability_zone", f"must be a zone name, got {value!r}")
    zones = sorted({z.strip() for z in value.split(",") if z.strip()})
    if not zones:
        raise ConfigError("provider.availability_zone", "names no zone")
    for z in zones:
        if not z.startswith(f"{region}-"):
            raise ConfigError("provider.availability_zone", f"{z!r} is not a zone of region {region!r}")
    return zones


def requirement_overrides(node_config: Mapping[str, Any], settings: GcpSettings | None = None) -> dict[str, Any]:
    """Requirement keys implied by Ray's GCP keys: `machineType` (with its `guestAccelerators`) becomes an
    allow-list of that one catalog type, `scheduling`'s preemptible / provisioningModel the capacity type,
    `provider.availability_zone` the zones. `check_node_config` has rejected what cannot be honoured."""
    out: dict[str, Any] = {}
    pinned = pinned_machine(node_config)
    if pinned:
        out["instance_types"] = [catalog_type_name(*pinned)]
    capacity = scheduling_capacity(scheduling_map(node_config.get("scheduling")))
    if capacity:
        out["capacity"] = [capacity]
    zones = availability_zones(settings)
    if zones is not None:
        out["zones"] = zones
    return out


def check_node_config(node_type: str, node_config: Mapping[str, Any], key: str,
                      settings: GcpSettings | None = None) -> None:
    """Raise ConfigError naming `key`.<field> for node_config keys an insert could not take, or that Ray would
    honour and ray_nodeless could not."""
    for k in node_config:
        if k not in INSTANCE_FIELDS:
            # node_config holds the constraint keys too: a typo of either gets its nearest (`min_memory`).
            close = suggest_key(str(k), set(INSTANCE_FIELDS) | REQUIREMENT_KEYS)
            hint = f"did you mean {close!r}?" if close else "node_config takes the instances.insert body keys"
            raise ConfigError(f"{key}.{k}", f"unknown key {k!r}: not a Compute Engine Instance field (node type "
                                            f"{node_type!r}) nor a constraint key; {hint}")
        if k in OUTPUT_ONLY_FIELDS:
            raise ConfigError(f"{key}.{k}", "is output-only in the Compute Engine API and cannot be set")
        if k in SET_BY_BACKEND_FIELDS:
            raise ConfigError(f"{key}.{k}", "ray_nodeless names every instance itself; remove it")
    body = dict(node_config)
    if "scheduling" in body:
        body["scheduling"] = scheduling_map(body["scheduling"], f"{key}.scheduling")
    # Nested keys and JSON types, as insert would send them: a body the vendored schema shows the client's parser
    # accepts needs no client; anything else is parsed by the client itself, for its exact error.
    if not surely_parses(body):
        parse_with_client(body, key)
    accs = node_config.get("guestAccelerators") or []
    if accs and not node_config.get("machineType"):
        raise ConfigError(f"{key}.guestAccelerators", "needs a machineType beside it; to choose GPUs by "
                                                      "model let the planner pick with `gpus: [...]`")
    if len(accs) > 1:
        raise ConfigError(f"{key}.guestAccelerators", "only one accelerator type per instance is supported")
    check_machine_type(node_config, key)
    for lk, lv in (node_config.get("labels") or {}).items():
        if not LABEL_KEY_RE.fullmatch(str(lk)) or not LABEL_VALUE_RE.fullmatch(str(lv)):
            raise ConfigError(f"{key}.labels.{lk}", "GCE labels must be lowercase [a-z0-9_-], keys start "
                                                    "with a letter, at most 63 characters")
    _check_scheduling(body.get("scheduling") or {}, f"{key}.scheduling")
    availability_zones(settings)


def parse_with_client(body: Mapping[str, Any], key: str) -> None:
    """Parse `body` with google-cloud-compute's own Instance schema (what insert would send); a ConfigError naming
    the nested key on failure."""
    from google.cloud import compute_v1
    from google.protobuf import json_format

    try:
        compute_v1.Instance.from_json(json.dumps(body))
    except (json_format.ParseError, TypeError, ValueError) as e:
        m = re.search(r'at "?Instance\.?([\w.\[\]]*)', str(e))
        sub = f".{m.group(1)}" if m and m.group(1) else ""
        if not sub:
            # The parser names the field only sometimes ("Failed to parse disks field: ..."): the first top-level
            # field the vendored schema cannot vouch for, else the one the message names.
            named = re.search(r"Failed to parse (\w+) field", str(e))
            doubtful = [k for k in body if not surely_parses({k: body[k]})] if vendored_schema() else []
            if doubtful:
                sub = f".{doubtful[0]}"
            elif named and named.group(1) in body:
                sub = f".{named.group(1)}"
        raise ConfigError(f"{key}{sub}", str(e).splitlines()[0]) from None


# Integer ranges of the proto integer kinds, as the client's parser checks them.
_INT_RANGES = {"int32": (-(2 ** 31), 2 ** 31 - 1), "int64": (-(2 ** 63), 2 ** 63 - 1),
               "uint32": (0, 2 ** 32 - 1), "uint64": (0, 2 ** 64 - 1)}
# The client's parser refuses strings with an unpaired surrogate.
_SURROGATE = re.compile("[\ud800-\udfff]")


def installed_compute_version() -> str | None:
    """google-cloud-compute's version as installed (its gapic_version.py), read without importing it."""
    for base in sys.path:
        p = Path(base or ".") / "google" / "cloud" / "compute_v1" / "gapic_version.py"
        try:
            text = p.read_text(encoding="utf-8")
        except OSError:
            continue
        m = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)", text, re.M)
        return m.group(1) if m else None
    return None


@functools.cache
def vendored_schema() -> dict[str, dict[str, tuple[str, bool, str]]] | None:
    """The Instance schema written by scripts/vendor_cloud_schemas.py, when the installed google-cloud-compute is
    the version it was written from (else None: every body goes to the client's parser)."""
    from ray_nodeless.providers.gcp import instance_schema

    if installed_compute_version() != instance_schema.COMPUTE_VERSION:
        return None
    return instance_schema.SCHEMA


def surely_parses(body: Mapping[str, Any]) -> bool:
    """True when the client's JSON parser (`Instance.from_json(json.dumps(body))`) is certain to accept `body`, by
    the vendored schema: known fields only, each of its kind. Conservative: any value it is not sure of (a null, an
    integral float, a number as a string, ...) gives False, and the client decides."""
    schema = vendored_schema()
    return schema is not None and _message_ok(schema, "Instance", body)


def _message_ok(schema: dict[str, dict[str, tuple[str, bool, str]]], message: str, value: Any) -> bool:
    if not isinstance(value, dict):
        return False
    fields = schema.get(message)
    if fields is None:
        return False
    seen: set[tuple[tuple[str, bool, str], str] | int] = set()
    for name, v in value.items():
        spec = fields.get(name) if isinstance(name, str) else None
        if spec is None:
            return False
        # One field given under both its JSON and its proto name is an error of the parser's: leave it to it.
        ident = (spec, name.replace("_", "").lower())
        if ident in seen:
            return False
        seen.add(ident)
        kind, repeated, target = spec
        if repeated:
            if not isinstance(v, list) or not all(_value_ok(schema, kind, target, item) for item in v):
                return False
        elif not _value_ok(schema, kind, target, v):
            return False
    return True


def _value_ok(schema: dict[str, dict[str, tuple[str, bool, str]]], kind: str, target: str, v: Any) -> bool:
    if kind == "string":
        return isinstance(v, str) and not _SURROGATE.search(v)
    if kind == "bool":
        return isinstance(v, bool)
    if kind in _INT_RANGES:
        lo, hi = _INT_RANGES[kind]
        return isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi
    if kind == "message":
        return _message_ok(schema, target, v)
    if kind == "map":
        return isinstance(v, dict) and all(isinstance(k, str) and isinstance(x, str) and not _SURROGATE.search(k)
                                           and not _SURROGATE.search(x) for k, x in v.items())
    return False


def check_machine_type(node_config: Mapping[str, Any], key: str) -> None:
    """ConfigError for a pinned machine type ray_nodeless cannot plan: a custom machine type, guestAccelerators
    beside a type with built-in GPUs, an accelerator that is not a known GPU."""
    pinned = pinned_machine(node_config, key)
    if pinned is None:
        return
    name, model, count = pinned
    m = CUSTOM_MACHINE_TYPE.match(name)
    if m:
        series = (m.group("series") or "n1").upper()
        gib = int(m.group("mib")) / 1024
        raise ConfigError(
            f"{key}.machineType",
            f"{name!r} is a custom machine type ({m.group('vcpus')} vCPU, {gib:g} GiB): ray_nodeless cannot price "
            f"it, because its catalog holds predefined machine types only and no per-vCPU / per-GB rates of the "
            f"{series} custom series; use a predefined machine type, or state the node type's resources (CPU, GPU, "
            "memory) and let the planner choose (`ray-nodeless convert --free-instance-types` writes that)")
    family = name.split("-", 1)[0]
    if count and family in BUILT_IN_GPU_FAMILIES:
        raise ConfigError(f"{key}.guestAccelerators", f"{name} comes with its own GPUs; remove guestAccelerators")
    if count and model not in KNOWN_GPU_MODELS:
        acc = (node_config.get("guestAccelerators") or [{}])[0].get("acceleratorType")
        raise ConfigError(f"{key}.guestAccelerators[0].acceleratorType", f"{acc!r} is not a known GPU accelerator")


def _check_scheduling(sched: Mapping[str, Any], key: str) -> None:
    capacity = scheduling_capacity(sched, key)
    action = sched.get("instanceTerminationAction")
    if action is not None and action != "DELETE":
        raise ConfigError(f"{key}.instanceTerminationAction",
                          f"{action!r} is not supported: ray_nodeless deletes a preempted spot VM (the autoscaler "
                          "replaces it) and never keeps stopped instances; remove it or set DELETE")
    if capacity == "spot" and sched.get("automaticRestart") is True:
        raise ConfigError(f"{key}.automaticRestart", "true cannot be honoured for spot / preemptible VMs "
                                                     "(GCE never restarts them); remove it")
    if capacity == "spot" and sched.get("onHostMaintenance") == "MIGRATE":
        raise ConfigError(f"{key}.onHostMaintenance", "MIGRATE cannot be honoured for spot / preemptible VMs "
                                                      "(GCE terminates them on maintenance); remove it")
