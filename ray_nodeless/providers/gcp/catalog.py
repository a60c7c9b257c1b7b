"""Live refresh of the GCP part of the catalog: which machine shapes each zone of a region offers, from the
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

On any error the refresher falls back to the last good cached file, then to the embedded catalog, with a
warning. A fresh cache (younger than `ttl_s`) is used without calling the API at all.
"""
from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from ray_nodeless.core.catalog import (
    CAPACITY_TYPES,
    FORMAT_VERSION,
    Catalog,
    InstanceType,
    RegionCatalog,
    embedded,
    load_file,
    region_entry,
    type_row,
)
from ray_nodeless.errors import CatalogError
from ray_nodeless.core.gpus import canonical_gpu
from ray_nodeless.providers.gcp.clients import compute_client_kwargs

from ray_nodeless.core.catalog import dump_bytes as _encode  # noqa: E402  one encoding for every catalog file
from ray_nodeless.core.catalog import write_atomic as _write_atomic  # noqa: E402

logger = logging.getLogger(__name__)

# Memory per GPU (GiB) for built-in GPUs of machine types the embedded catalog does not know.
GPU_MEMORY_GIB: dict[str, float] = {
    "K80": 12, "P4": 8, "P100": 16, "T4": 16, "V100": 16, "L4": 24, "A100": 40, "A100-80GB": 80, "H100": 80,
    "H200": 141, "B200": 180,
}
# Shared-core types GCE bills as burstable (same list as the embedded catalog builder).
BURSTABLE_TYPES = frozenset({"e2-micro", "e2-small", "e2-medium", "f1-micro", "g1-small"})
# One list call of the refresh. Not retried: a failed refresh falls back to the cache or the embedded catalog, and
# a live catalog is an optimisation that must not hold up `ray up` for long.
FETCH_TIMEOUT_S = 60.0
# A cached live catalog younger than this is used without calling the API: GCE adds machine types a few times a
# year, so one refresh a day is plenty.
CACHE_TTL_S = 86400.0
# Deprecation states after which a machine type can no longer be used for new instances.
_UNUSABLE_STATES = frozenset({"OBSOLETE", "DELETED"})


@dataclass
class RefreshSummary:
    """What a refresh produced; `source` is "live", "cache" or "embedded" (the last two after a failure or TTL)."""

    source: str
    catalog_id: str
    region: str
    zones: list[str] = field(default_factory=list)
    types: int = 0
    offerings: int = 0
    priced: int = 0
    unknown: int = 0
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _clean(x: float) -> float | int:
    return int(x) if float(x).is_integer() else round(float(x), 3)


def _catalog_from_doc(doc: dict, source: str) -> tuple[Catalog, bytes]:
    raw = _encode(doc)
    return Catalog(doc, hashlib.sha256(raw).hexdigest(), source), raw


def _count(cat: Catalog, region: str) -> tuple[int, int, int, int]:
    """(types, offerings, priced, unknown) of a catalog's GCP region, zeros if it lacks the region."""
    try:
        r: RegionCatalog = cat.region("gcp", region)
    except CatalogError:
        return 0, 0, 0, 0
    priced = sum(1 for o in r.offerings() if o.hourly_price is not None)
    return len(cat.types("gcp")), len(r), priced, len(r) - priced


# ----------------------------------------------------------------------------------------- live fetch


@dataclass
class _ZoneData:
    machine_types: dict[str, Any]          # name -> compute_v1.MachineType
    accelerators: dict[str, int]           # accelerator type name -> maximumCardsPerInstance


def _clients(api_endpoint: str | None, credentials: Any) -> tuple[Any, Any, Any]:
    from google.cloud import compute_v1

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
    family = name.split("-")[0]
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
        burstable=bool(mt.is_shared_cpu) or name in BURSTABLE_TYPES, machine_type=name)


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


# ----------------------------------------------------------------------------------------- entry point


def refresh_gcp_catalog(region: str, project_id: str, *, api_endpoint: str | None = None, credentials: Any = None,
                        cache_dir: str | Path | None = None, ttl_s: float = CACHE_TTL_S,
                        fallback: Callable[[], Catalog] = embedded,
                        price_catalog: Catalog | None = None) -> Catalog:
    """The live GCP catalog of `region` (what `NodelessProvider._load_catalog` uses).

    The summary dict of `refresh_gcp_catalog_with_summary` is attached as `catalog.refresh_summary`.
    """
    cat, summary = refresh_gcp_catalog_with_summary(
        region, project_id, api_endpoint=api_endpoint, credentials=credentials, cache_dir=cache_dir, ttl_s=ttl_s,
        fallback=fallback, price_catalog=price_catalog)
    cat.refresh_summary = summary  # type: ignore[attr-defined]
    return cat


def refresh_gcp_catalog_with_summary(
        region: str, project_id: str, *, api_endpoint: str | None = None, credentials: Any = None,
        cache_dir: str | Path | None = None, ttl_s: float = CACHE_TTL_S, fallback: Callable[[], Catalog] = embedded,
        price_catalog: Catalog | None = None) -> tuple[Catalog, dict[str, Any]]:
    """Build (or reuse) the live GCP catalog of `region`. Returns (catalog, summary dict).

    `credentials`: None = google.auth default, "anonymous" (tests), or a google.auth Credentials object.
    `price_catalog`: where prices come from (default: the embedded catalog).
    Never raises for API or cache problems: it falls back to the cached file, then to `fallback()`.
    """
    cache = Path(cache_dir) / f"gcp-live-{region}.json.gz" if cache_dir is not None else None
    if cache is not None and cache.exists() and time.time() - cache.stat().st_mtime < ttl_s:
        try:
            cat = load_file(cache)
            return cat, _summary("cache", cat, region).to_dict()
        except CatalogError as e:
            logger.warning("cached catalog %s is unreadable (%s); refreshing", cache, e)
    try:
        prices = price_catalog
        if prices is None:
            try:
                prices = embedded()
            except Exception as e:  # noqa: BLE001 - a refresh without prices is still a refresh
                logger.warning("embedded catalog unavailable (%s): every live price will be unknown", e)
        data = fetch_region(region, project_id, api_endpoint=api_endpoint, credentials=credentials)
        doc = build_doc(region, data, prices, project_id)
        cat, raw = _catalog_from_doc(doc, f"live:gcp:{region}")
        if cache is not None:
            try:
                _write_atomic(cache, raw)
            except OSError as e:
                logger.warning("could not write catalog cache %s: %s", cache, e)
        summary = _summary("live", cat, region)
        summary.zones = sorted(data)
        logger.info("refreshed gcp catalog %s: %d types, %d offerings (%d priced, %d unknown)", cat.catalog_id,
                    summary.types, summary.offerings, summary.priced, summary.unknown)
        return cat, summary.to_dict()
    except Exception as e:  # noqa: BLE001 - any failure falls back, loudly
        err = f"{type(e).__name__}: {e}"
        if cache is not None and cache.exists():
            try:
                cat = load_file(cache)
                logger.warning("gcp catalog refresh for %s failed (%s); using the last good cache %s (%s)", region,
                               err, cache, cat.catalog_id)
                s = _summary("cache", cat, region)
                s.error = err
                return cat, s.to_dict()
            except CatalogError as ce:
                logger.warning("cached catalog %s is unreadable too: %s", cache, ce)
        cat = fallback()
        logger.warning("gcp catalog refresh for %s failed (%s); using %s", region, err, cat.catalog_id)
        s = _summary("embedded", cat, region)
        s.error = err
        return cat, s.to_dict()


def _summary(source: str, cat: Catalog, region: str) -> RefreshSummary:
    types, offerings, priced, unknown = _count(cat, region)
    zones: list[str] = []
    try:
        zones = list(cat.region("gcp", region).zones)
    except CatalogError:
        pass
    return RefreshSummary(source=source, catalog_id=cat.catalog_id, region=region, zones=zones, types=types,
                          offerings=offerings, priced=priced, unknown=unknown)
