"""A live AWS catalog for one region, built from the EC2 and Pricing APIs: `AwsConfig.live_catalog`'s hook.

When it is read, and what is used when it cannot be, is the one policy of `core/catalog/refresh.py` (memory ->
disk cache -> live -> stale disk cache -> embedded, `catalog_ttl_s`); this module only reads the cloud.

Sources, one catalog document in the embedded format (`ray_nodeless.core.catalog`: types through `type_row`, the region
through `region_entry`):
- specs: `DescribeInstanceTypes` (paginated). Mac types are skipped (they need dedicated hosts), as in the embedded
  builder (`scripts/build_catalog.py`), whose conventions this module follows: total GPU memory, A100 with >= 79 GiB
  per GPU is `A100-80GB`, Neuron/Qualcomm/Gaudi devices are non-GPU accelerators under their AWS name.
- where: `DescribeInstanceTypeOfferings` (LocationType availability-zone).
- spot: `DescribeSpotPriceHistory` at StartTime=now, i.e. the price in effect per type x AZ. Implausible values
  (below 3 % of on-demand or below $0.0005/h: moto's placeholder is 0.00001) are discarded.
- on-demand: the Pricing API (`pricing` in us-east-1, `GetProducts`, Linux / Shared tenancy / no pre-installed
  software / capacitystatus Used).

Failures (a live catalog is an optimisation; it must never stop a cluster):
- specs or offerings fail -> the fetch raises; the policy falls back to the cache file, then the embedded catalog;
- pricing or spot history fail -> prices for the same type (and zone, for spot) from `prices()` (the embedded
  catalog), recorded in the document's `price_source` and reported as warnings; `price_quality` lets the policy
  keep a cache file with better price sources (more of them from AWS) instead.
"""
from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import math
import os
from dataclasses import dataclass, field
from typing import Any, Callable

from ray_nodeless.core.catalog import FORMAT_VERSION, Catalog, InstanceType, embedded, region_entry, type_row
from ray_nodeless.core.catalog.refresh import LiveCatalog, LiveFetch
from ray_nodeless.core.cloud_facts import AWS_BURSTABLE_FAMILIES, aws_family
from ray_nodeless.core.gpus import NON_GPU_ACCELERATORS, NON_GPU_MANUFACTURERS, canonical_gpu, gpu_model_by_memory
from ray_nodeless.errors import CatalogError

logger = logging.getLogger(__name__)

SOURCE_AWS_PRICING = "aws:pricing:GetProducts"
SOURCE_AWS_SPOT = "aws:ec2:DescribeSpotPriceHistory"
MIN_SPOT_PRICE = 0.0005                 # $/h; below it a spot price is a placeholder (moto's is 0.00001)
MIN_SPOT_FRACTION_OF_ON_DEMAND = 0.03   # no real spot discount reaches 97 %
# Page sizes: DescribeInstanceTypes allows at most 100; the offerings and spot history calls 1000.
INSTANCE_TYPES_PAGE_SIZE = 100
OFFERINGS_PAGE_SIZE = 1000


@dataclass
class _Fetched:
    types: dict[str, InstanceType]
    spot_supported: set[str]
    zones_of: dict[str, set[str]]                       # type -> AZs where it is offered
    on_demand: dict[str, float] = field(default_factory=dict)
    spot: dict[tuple[str, str], float] = field(default_factory=dict)
    price_source: dict[str, str] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    implausible_spot: int = 0


# ------------------------------------------------------------------------------------------------------ parsing


def _clean_number(x: float) -> float | int:
    return int(x) if float(x).is_integer() else round(float(x), 4)


def instance_type_from_api(item: dict[str, Any]) -> InstanceType | None:
    """An InstanceType from one DescribeInstanceTypes entry, or None for types we never launch (Mac)."""
    name = item["InstanceType"]
    archs = [a for a in item.get("ProcessorInfo", {}).get("SupportedArchitectures", [])]
    if not archs or all(a.endswith("_mac") for a in archs):
        return None
    arch = "arm64" if "arm64" in archs else "x86_64"
    family = aws_family(name)
    vcpus = item.get("VCpuInfo", {}).get("DefaultVCpus", 0)
    memory_gib = item.get("MemoryInfo", {}).get("SizeInMiB", 0) / 1024

    gpu_model, gpu_count, gpu_mem, accel, accel_count = "", 0, 0.0, "", 0
    gpu_info = item.get("GpuInfo") or {}
    gpus = gpu_info.get("Gpus") or []
    if gpus:
        g = gpus[0]
        count = sum(int(x.get("Count", 0)) for x in gpus)
        canon = canonical_gpu(g.get("Name", ""))
        if canon in NON_GPU_ACCELERATORS or g.get("Manufacturer") in NON_GPU_MANUFACTURERS:
            accel, accel_count = g.get("Name", ""), count
        else:
            total_mib = gpu_info.get("TotalGpuMemoryInMiB") or sum(
                int(x.get("Count", 0)) * int(x.get("MemoryInfo", {}).get("SizeInMiB", 0)) for x in gpus)
            gpu_mem = round(total_mib / 1024, 2)
            gpu_model = gpu_model_by_memory(canon, gpu_mem / count if count else 0.0)
            gpu_count = count
    neuron = (item.get("NeuronInfo") or {}).get("NeuronDevices") or []
    if neuron and not accel:
        accel = neuron[0].get("Name", "")
        accel_count = sum(int(d.get("Count", 0)) for d in neuron)
    inference = (item.get("InferenceAcceleratorInfo") or {}).get("Accelerators") or []
    if inference and not accel and not gpu_model:
        accel = inference[0].get("Name", "")
        accel_count = sum(int(d.get("Count", 0)) for d in inference)

    return InstanceType(
        cloud="aws", name=name, family=family, vcpus=_clean_number(vcpus), memory_gib=_clean_number(memory_gib),
        gpu_model=gpu_model, gpu_count=gpu_count, gpu_memory_gib=_clean_number(gpu_mem), arch=arch,
        burstable=family in AWS_BURSTABLE_FAMILIES or bool(item.get("BurstablePerformanceSupported")),
        accelerator=accel, accelerator_count=accel_count, machine_type=name, attached_gpu="",
    )


def on_demand_price_from_product(raw: str | dict) -> tuple[str, float] | None:
    """(instance type, USD/hour) from one Pricing API PriceList entry, or None if it has no usable price."""
    doc = json.loads(raw) if isinstance(raw, str) else raw
    attrs = doc.get("product", {}).get("attributes", {})
    name = attrs.get("instanceType")
    if not name:
        return None
    best: float | None = None
    for term in (doc.get("terms", {}).get("OnDemand") or {}).values():
        for dim in (term.get("priceDimensions") or {}).values():
            if dim.get("unit") not in ("Hrs", "Hours", None):
                continue
            try:
                usd = float(dim.get("pricePerUnit", {}).get("USD", "nan"))
            except ValueError:
                continue
            if usd > 0 and not math.isnan(usd):
                best = usd if best is None else min(best, usd)
    return (name, best) if best is not None else None


def plausible_spot(spot: float, on_demand: float | None) -> bool:
    if not spot >= MIN_SPOT_PRICE:
        return False
    return on_demand is None or spot >= MIN_SPOT_FRACTION_OF_ON_DEMAND * on_demand


# ------------------------------------------------------------------------------------------------------ fetching


def fetch_specs(ec2: Any) -> tuple[dict[str, InstanceType], set[str]]:
    types: dict[str, InstanceType] = {}
    spot_supported: set[str] = set()
    pages = ec2.get_paginator("describe_instance_types").paginate(
        PaginationConfig={"PageSize": INSTANCE_TYPES_PAGE_SIZE})
    for page in pages:
        for item in page.get("InstanceTypes", []):
            t = instance_type_from_api(item)
            if t is None:
                continue
            types[t.name] = t
            if "spot" in (item.get("SupportedUsageClasses") or []):
                spot_supported.add(t.name)
    return types, spot_supported


def fetch_offerings(ec2: Any) -> dict[str, set[str]]:
    zones_of: dict[str, set[str]] = {}
    pages = ec2.get_paginator("describe_instance_type_offerings").paginate(
        LocationType="availability-zone", PaginationConfig={"PageSize": OFFERINGS_PAGE_SIZE})
    for page in pages:
        for o in page.get("InstanceTypeOfferings", []):
            zones_of.setdefault(o["InstanceType"], set()).add(o["Location"])
    return zones_of


def fetch_spot_prices(ec2: Any, now: dt.datetime | None = None) -> dict[tuple[str, str], float]:
    """The latest Linux spot price per (type, AZ). With StartTime=now AWS returns the price in effect at now."""
    now = now or dt.datetime.now(dt.timezone.utc)
    latest: dict[tuple[str, str], tuple[dt.datetime, float]] = {}
    pages = ec2.get_paginator("describe_spot_price_history").paginate(
        StartTime=now, EndTime=now, ProductDescriptions=["Linux/UNIX", "Linux/UNIX (Amazon VPC)"],
        PaginationConfig={"PageSize": OFFERINGS_PAGE_SIZE})
    for page in pages:
        for h in page.get("SpotPriceHistory", []):
            key = (h["InstanceType"], h["AvailabilityZone"])
            ts = h.get("Timestamp") or dt.datetime.min.replace(tzinfo=dt.timezone.utc)
            try:
                price = float(h["SpotPrice"])
            except (KeyError, ValueError):
                continue
            if key not in latest or ts > latest[key][0]:
                latest[key] = (ts, price)
    return {k: v[1] for k, v in latest.items()}


def fetch_on_demand_prices(pricing: Any, region: str) -> dict[str, float]:
    filters = [{"Type": "TERM_MATCH", "Field": f, "Value": v} for f, v in (
        ("regionCode", region), ("operatingSystem", "Linux"), ("tenancy", "Shared"),
        ("preInstalledSw", "NA"), ("capacitystatus", "Used"))]
    prices: dict[str, float] = {}
    for page in pricing.get_paginator("get_products").paginate(
            ServiceCode="AmazonEC2", Filters=filters, FormatVersion="aws_v1"):
        for raw in page.get("PriceList", []):
            hit = on_demand_price_from_product(raw)
            if hit:
                name, usd = hit
                prices[name] = min(usd, prices.get(name, usd))
    return prices


def _fallback_prices(fallback: Callable[[], Catalog], region: str
                     ) -> tuple[str, dict[str, float], dict[tuple[str, str], float]]:
    """(catalog id, on-demand per type, spot per (type, zone)) of the fallback catalog for `region`."""
    cat = fallback()
    rc = cat.region("aws", region)
    od: dict[str, float] = {}
    spot: dict[tuple[str, str], float] = {}
    for o in rc.offerings():
        if o.hourly_price is None:
            continue
        if o.capacity == "on-demand":
            od[o.instance_type.name] = min(o.hourly_price, od.get(o.instance_type.name, o.hourly_price))
        else:
            spot[(o.instance_type.name, o.zone)] = o.hourly_price
    return cat.catalog_id, od, spot


def fetch(region: str, ec2: Any, pricing: Any, fallback: Callable[[], Catalog]) -> _Fetched:
    """Everything the document needs. Specs/offerings errors propagate; price errors are recorded and patched."""
    types, spot_supported = fetch_specs(ec2)
    zones_of = fetch_offerings(ec2)
    f = _Fetched(types=types, spot_supported=spot_supported, zones_of=zones_of)
    if not any(t in types for t in zones_of):
        raise CatalogError(f"no instance type offerings in {region}")

    fb: tuple[str, dict[str, float], dict[tuple[str, str], float]] | None = None

    def fallback_prices() -> tuple[str, dict[str, float], dict[tuple[str, str], float]]:
        nonlocal fb
        if fb is None:
            try:
                fb = _fallback_prices(fallback, region)
            except Exception as e:  # noqa: BLE001 - a region the fallback lacks leaves prices unknown
                f.errors.append(f"fallback catalog has no prices for aws/{region}: {e}")
                fb = ("none", {}, {})
        return fb

    try:
        f.on_demand = fetch_on_demand_prices(pricing, region)
        if not f.on_demand:
            raise CatalogError("the Pricing API returned no Linux on-demand prices")
        f.price_source["on_demand"] = SOURCE_AWS_PRICING
    except Exception as e:  # noqa: BLE001 - any failure of this source has the same remedy
        cid, od, _ = fallback_prices()
        f.errors.append(f"pricing:GetProducts failed ({_short(e)}); on-demand prices from {cid}")
        f.on_demand = od
        f.price_source["on_demand"] = f"fallback:{cid}"

    spot_ok = False
    try:
        raw_spot = fetch_spot_prices(ec2)
        for key, price in raw_spot.items():
            if plausible_spot(price, f.on_demand.get(key[0])):
                f.spot[key] = price
            else:
                f.implausible_spot += 1
        spot_ok = bool(f.spot)
        if not spot_ok:
            f.errors.append(f"ec2:DescribeSpotPriceHistory gave no plausible prices "
                            f"({f.implausible_spot} discarded, e.g. placeholders)")
    except Exception as e:  # noqa: BLE001
        f.errors.append(f"ec2:DescribeSpotPriceHistory failed ({_short(e)})")
    if spot_ok:
        f.price_source["spot"] = SOURCE_AWS_SPOT
        if f.implausible_spot:
            f.errors.append(f"{f.implausible_spot} implausible spot prices discarded")
    else:
        cid, _, spot = fallback_prices()
        f.spot = dict(spot)
        f.price_source["spot"] = f"fallback:{cid}"
    return f


def build_document(region: str, f: _Fetched, built: str | None = None) -> dict:
    ordered = [f.types[n] for n in sorted(f.types) if f.zones_of.get(n)]
    rows: list[tuple[str, str, str, float | None]] = []
    for t in ordered:
        od = f.on_demand.get(t.name)
        for zone in sorted(f.zones_of[t.name]):
            rows.append((t.name, zone, "on-demand", od))
            if t.name in f.spot_supported:
                rows.append((t.name, zone, "spot", f.spot.get((t.name, zone))))
    built = built or dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "format": FORMAT_VERSION,
        "name": f"aws-live-{region}",
        "built": built,
        "sources": {"aws": "live: ec2:DescribeInstanceTypes, ec2:DescribeInstanceTypeOfferings, "
                           f"on-demand {f.price_source.get('on_demand')}, spot {f.price_source.get('spot')}"},
        "price_source": dict(f.price_source),
        "clouds": {"aws": {"types": [type_row(t) for t in ordered],
                           "regions": {region: region_entry(ordered, rows)}}},
    }


# ------------------------------------------------------------------------------------------------------ the hook


def price_quality(doc: dict) -> int:
    """How many of the two price sources came from AWS itself (a degraded refresh keeps a better cache file)."""
    ps = doc.get("price_source") or {}
    return int(ps.get("on_demand") == SOURCE_AWS_PRICING) + int(ps.get("spot") == SOURCE_AWS_SPOT)


def live_catalog(region: str, *, session_kwargs: dict | None = None, endpoint_url: str | None = None,
                 pricing_endpoint_url: str | None = None,
                 prices: Callable[[], Catalog] = embedded) -> LiveCatalog:
    """How to read `region`'s catalog from EC2 and the Pricing API (the policy, `core/catalog/refresh.py`, decides
    when). `prices`: the catalog whose prices patch a failed price source."""
    endpoint = endpoint_url or os.environ.get("AWS_ENDPOINT_URL") or None
    # A catalog built against another endpoint (moto, a proxy) must never be mistaken for the real one.
    suffix = "-" + hashlib.sha256(endpoint.encode()).hexdigest()[:8] if endpoint else ""

    def fetch_now() -> LiveFetch:
        from ray_nodeless.providers.aws.sessions import catalog_clients   # boto3 only when the cloud is read

        ec2, pricing = catalog_clients(region, session_kwargs, endpoint_url, pricing_endpoint_url)
        fetched = fetch(region, ec2, pricing, prices)
        return LiveFetch(build_document(region, fetched), tuple(fetched.errors))

    return LiveCatalog(cloud="aws", region=region, cache_name=f"aws-{region}{suffix}", fetch=fetch_now,
                       quality=price_quality,
                       describe=f"EC2 + Pricing APIs{' at ' + endpoint if endpoint else ''}")


def _short(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"[:300]
