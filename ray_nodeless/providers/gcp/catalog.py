"""A live GCP catalog for one region (`GcpConfig.live_catalog`'s hook): which machine shapes each zone of a region
offers, from the
Compute API (`zones.list`, `machineTypes.list`, `acceleratorTypes.list`).

What is refreshed and what is not (also written into the catalog document, so a decision can say so):
- refreshed: the machine types each zone offers, with vCPUs, memory, architecture and built-in GPUs; the
  accelerator types each zone offers (which decides where N1 + attached GPU combinations exist);
- not refreshed: prices. The Compute API has no prices (they are in the Cloud Billing Catalog API, which needs
  billing permissions), so every price is copied from the embedded catalog: exact (type, zone, capacity) row
  first, else the same type and capacity elsewhere in the region (GCE prices are regional). A type the embedded
  catalog does not know gets price `None` = unknown, which the planner never chooses;
- not refreshed: spot availability. The API does not say which types can run as spot, so spot is listed
  wherever the type is offered, priced from the embedded catalog or unknown;
- N1 + GPU combinations follow the embedded catalog's list (the GPU-count and vCPU limits GCE documents); live
  data only decides in which zones each combination exists.

When it is read, and what is used when it cannot be (memory -> disk cache -> live -> stale disk cache ->
embedded, `catalog_ttl_s`), is the one policy of `core/catalog/refresh.py`; this module only reads the cloud.
"""
from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass
from typing import Any, Callable

from ray_nodeless.core.catalog import (
    CAPACITY_TYPES,
    FORMAT_VERSION,
    Catalog,
    InstanceType,
    RegionCatalog,
    embedded,
    region_entry,
    type_row,
)
from ray_nodeless.core.catalog.refresh import LiveCatalog, LiveFetch
from ray_nodeless.core.cloud_facts import GCP_BURSTABLE_TYPES, gcp_family
from ray_nodeless.core.gpus import GPU_MEMORY_GIB, canonical_gpu
from ray_nodeless.errors import CatalogError

logger = logging.getLogger(__name__)

# One list call of the refresh. Not retried: a failed refresh falls back to the cache or the embedded catalog, and
# a live catalog is an optimisation that must not hold up `ray up` for long.
FETCH_TIMEOUT_S = 60.0
# Deprecation states after which a machine type can no longer be used for new instances.
_UNUSABLE_STATES = frozenset({"OBSOLETE", "DELETED"})


def _clean(x: float) -> float | int:
    return int(x) if float(x).is_integer() else round(float(x), 3)


# ----------------------------------------------------------------------------------------- live fetch


@dataclass
class _ZoneData:
    machine_types: dict[str, Any]          # name -> compute_v1.MachineType
    accelerators: dict[str, int]           # accelerator type name -> maximumCardsPerInstance


def _clients(api_endpoint: str | None, credentials: Any) -> tuple[Any, Any, Any]:
    from google.cloud import compute_v1

    from ray_nodeless.providers.gcp.clients import compute_client_kwargs

    kw = compute_client_kwargs(api_endpoint, credentials)
    return (compute_v1.ZonesClient(**kw), compute_v1.MachineTypesClient(**kw),
            compute_v1.AcceleratorTypesClient(**kw))


def fetch_region(region: str, project_id: str, *, api_endpoint: str | None = None, credentials: Any = None,
                 timeout_s: float = FETCH_TIMEOUT_S) -> dict[str, _ZoneData]:
    """Zone -> offered machine types and accelerator types, for every UP zone of `region`."""
    zones_c, mt_c, acc_c = _clients(api_endpoint, credentials)
    try:
        zones = sorted(
            z.name for z in zones_c.list(project=project_id, timeout=timeout_s, retry=None)
            if z.region.rstrip("/").rsplit("/", 1)[-1] == region and z.status in ("UP", ""))
        if not zones:
            raise CatalogError(f"project {project_id} sees no UP zone in region {region}")
        out: dict[str, _ZoneData] = {}
        for zone in zones:
            mts = {m.name: m for m in mt_c.list(project=project_id, zone=zone, timeout=timeout_s, retry=None)
                   if m.deprecated.state not in _UNUSABLE_STATES}
            accs = {a.name: int(a.maximum_cards_per_instance or 0)
                    for a in acc_c.list(project=project_id, zone=zone, timeout=timeout_s, retry=None)
                    if a.deprecated.state not in _UNUSABLE_STATES}
            out[zone] = _ZoneData(mts, accs)
        return out
    finally:
        for c in (zones_c, mt_c, acc_c):
            try:
                c.transport.close()
            except Exception:  # noqa: BLE001 - best effort
                pass


# ----------------------------------------------------------------------------------------- build


def _live_type(mt: Any, known: InstanceType | None) -> InstanceType:
    name = mt.name
    family = gcp_family(name)
    model, count = "", 0
    if mt.accelerators:
        acc = mt.accelerators[0]
        model, count = canonical_gpu(acc.guest_accelerator_type), int(acc.guest_accelerator_count)
    gpu_mem = (known.gpu_memory_gib if known is not None and known.gpu_model == model
               else GPU_MEMORY_GIB.get(model, 0) * count)
    arch = "arm64" if (mt.architecture or "").upper() == "ARM64" else (
        known.arch if known is not None else "x86_64")
    return InstanceType(
        cloud="gcp", name=name, family=family, vcpus=_clean(mt.guest_cpus), memory_gib=_clean(mt.memory_mb / 1024),
        gpu_model=model, gpu_count=count, gpu_memory_gib=_clean(gpu_mem), arch=arch,
        burstable=bool(mt.is_shared_cpu) or name in GCP_BURSTABLE_TYPES, machine_type=name)


def build_doc(region: str, data: dict[str, _ZoneData], prices: Catalog | None, project_id: str = "") -> dict:
    """A format-1 catalog document for one GCP region from live zone data, priced from `prices`."""
    known: dict[str, InstanceType] = {t.name: t for t in prices.types("gcp")} if prices is not None else {}
    price_region: RegionCatalog | None = None
    if prices is not None:
        try:
            price_region = prices.region("gcp", region)
        except CatalogError:
            logger.warning("price catalog %s has no gcp region %s: every price is unknown", prices.catalog_id, region)
    exact: dict[tuple[str, str, str], float | None] = {}
    regional: dict[tuple[str, str], float] = {}
    if price_region is not None:
        for o in price_region.offerings():
            exact[o.key] = o.hourly_price
            if o.hourly_price is not None:
                k = (o.instance_type.name, o.capacity)
                regional[k] = min(regional.get(k, o.hourly_price), o.hourly_price)

    types: dict[str, InstanceType] = {}
    offered: set[tuple[str, str]] = set()
    for zone, zd in sorted(data.items()):
        for name, mt in zd.machine_types.items():
            if name not in types:
                types[name] = _live_type(mt, known.get(name))
            offered.add((name, zone))
        # N1 + attached GPU combinations the embedded catalog defines, where host and accelerator both exist
        for t in known.values():
            if not t.attached_gpu or t.machine_type not in zd.machine_types:
                continue
            if zd.accelerators.get(t.attached_gpu, 0) < t.gpu_count:
                continue
            if t.name not in types:
                host = types[t.machine_type]
                types[t.name] = InstanceType(
                    cloud="gcp", name=t.name, family=t.family, vcpus=host.vcpus, memory_gib=host.memory_gib,
                    gpu_model=t.gpu_model, gpu_count=t.gpu_count, gpu_memory_gib=t.gpu_memory_gib, arch=host.arch,
                    burstable=False, machine_type=t.machine_type, attached_gpu=t.attached_gpu)
            offered.add((t.name, zone))

    rows: list[tuple[str, str, str, float | None]] = []
    for name, zone in sorted(offered):
        for cap in CAPACITY_TYPES:
            key = (name, zone, cap)
            price = exact[key] if key in exact else regional.get((name, cap))
            rows.append((name, zone, cap, price))
    ordered = [types[n] for n in sorted(types)]
    return {
        "format": FORMAT_VERSION,
        "name": f"gcp-live-{region}",
        "built": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "price_source": "embedded",
        "price_catalog": prices.catalog_id if prices is not None else None,
        "refreshed": ["machine types per zone (vCPUs, memory, architecture, built-in GPUs)",
                      "accelerator types per zone (where N1 + GPU combinations exist)"],
        "not_refreshed": ["prices: copied from the embedded catalog (exact row, else the same type and capacity "
                          "in the region); types it lacks have unknown price (null) and are never chosen",
                          "spot availability: assumed wherever the type is offered",
                          "N1 + GPU combinations: the embedded catalog's list"],
        "sources": {"gcp": f"Compute API zones/machineTypes/acceleratorTypes.list, project {project_id}, "
                           f"zones {sorted(data)}"},
        "clouds": {"gcp": {"types": [type_row(t) for t in ordered],
                           "regions": {region: region_entry(ordered, rows)}}},
    }


# ----------------------------------------------------------------------------------------- the hook


def live_catalog(region: str, project_id: str, *, api_endpoint: str | None = None, credentials: Any = None,
                 prices: Callable[[], Catalog | None] | None = None) -> LiveCatalog:
    """How to read `region`'s catalog from the Compute API (the policy, `core/catalog/refresh.py`, decides when).

    `credentials`: None = google.auth default, "anonymous" (tests), a google.auth Credentials object, or a
    callable returning one of these (called when the cloud is read, so building the hook does no I/O).
    `prices`: the catalog prices are copied from (default: the embedded catalog).
    """
    def fetch_now() -> LiveFetch:
        price_catalog = prices() if prices is not None else _embedded_or_none()
        creds = credentials() if callable(credentials) else credentials
        data = fetch_region(region, project_id, api_endpoint=api_endpoint, credentials=creds)
        warnings = () if price_catalog is not None else ("no price catalog: every price is unknown",)
        return LiveFetch(build_doc(region, data, price_catalog, project_id), warnings)

    # The cache file names the project and endpoint: machine types offered differ by project (quotas, previews),
    # and a fake server's catalog must never be mistaken for the real one.
    ident = f"{project_id}|{api_endpoint or ''}"
    return LiveCatalog(cloud="gcp", region=region,
                       cache_name=f"gcp-{region}-{hashlib.sha256(ident.encode()).hexdigest()[:8]}",
                       fetch=fetch_now,
                       describe=f"Compute API{' at ' + api_endpoint if api_endpoint else ''}, project {project_id}")


def live_catalog_for(settings: Any, region: str) -> LiveCatalog:
    """`GcpConfig.live_catalog`: the parsed settings' (a GcpSettings) project, endpoint and credentials (built
    only when the cloud is read; None from `client_credentials`: Application Default Credentials)."""
    return live_catalog(region, settings.project_id, api_endpoint=settings.api_endpoint,
                        credentials=settings.client_credentials)


def _embedded_or_none() -> Catalog | None:
    try:
        return embedded()
    except Exception as e:  # noqa: BLE001 - a refresh without prices is still a refresh
        logger.warning("embedded catalog unavailable (%s): every live price will be unknown", e)
        return None
