"""The instance catalog: what machines exist, where, and what they cost. Data, not code.

The packaged file (`ray_nodeless/data/catalog.json.gz`, built by `scripts/build_catalog.py`) holds, per cloud, a
table of instance types and, per region, one row per (instance type, zone) with its on-demand and spot price.
Loading is lazy twice over: the file is read on first use, and the per-region arrays the planner filters with are
built the first time that region is planned. Every decision names the catalog by `catalog_id`, which ends in the
first 12 hex digits of the file's sha256, so a decision can be replayed against exactly the data it used.

Price conventions in the file: a number is USD/hour; `null` means the price is unknown (never chosen). A capacity
type that is not offered for a type in a zone has no row at all.
"""
from __future__ import annotations

import gzip
import hashlib
import json
import logging
import math
import os
import tempfile
import threading
from dataclasses import dataclass
from functools import cached_property
from importlib import resources
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from ray_nodeless.errors import CatalogError

logger = logging.getLogger(__name__)

CLOUDS = ("aws", "gcp")
# Index in this tuple is the capacity id stored in the region arrays.
CAPACITY_TYPES = ("on-demand", "spot")
FORMAT_VERSION = 1

# Column order of an instance-type row in the catalog file.
TYPE_COLUMNS = (
    "name", "family", "vcpus", "memory_gib", "gpu_model", "gpu_count", "gpu_memory_gib", "arch", "burstable",
    "accelerator", "accelerator_count", "machine_type", "attached_gpu",
)


@dataclass(frozen=True, slots=True)
class InstanceType:
    """One machine shape of one cloud.

    `gpu_model` is in the cross-cloud vocabulary of `ray_nodeless.core.gpus`. `accelerator` names a non-GPU accelerator
    (Inferentia, Trainium) that never satisfies a Ray `GPU` demand. For GCP types that are a host plus attached
    GPUs (N1 + T4), `name` is `<machine_type>+<count>x<model>` (e.g. `n1-standard-8+1xT4`), `machine_type` is the
    GCE machine type and `attached_gpu` the GCE accelerator type to attach; for every other type `machine_type`
    equals `name` and `attached_gpu` is empty.
    """

    cloud: str
    name: str
    family: str
    vcpus: float
    memory_gib: float
    gpu_model: str = ""
    gpu_count: int = 0
    gpu_memory_gib: float = 0.0
    arch: str = "x86_64"
    burstable: bool = False
    accelerator: str = ""
    accelerator_count: int = 0
    machine_type: str = ""
    attached_gpu: str = ""

    def to_dict(self) -> dict:
        return {
            "cloud": self.cloud, "instance_type": self.name, "family": self.family, "vcpus": self.vcpus,
            "memory_gib": self.memory_gib, "gpu_model": self.gpu_model or None, "gpu_count": self.gpu_count,
            "gpu_memory_gib": self.gpu_memory_gib, "arch": self.arch, "burstable": self.burstable,
            "accelerator": self.accelerator or None, "accelerator_count": self.accelerator_count,
        }


@dataclass(frozen=True, slots=True)
class Offering:
    """An instance type in one zone, on one capacity type, at a price (None = unknown, never chosen)."""

    instance_type: InstanceType
    region: str
    zone: str
    capacity: str
    hourly_price: float | None

    @property
    def key(self) -> tuple[str, str, str]:
        """What the capacity-error memory is keyed on."""
        return (self.instance_type.name, self.zone, self.capacity)

    def to_dict(self) -> dict:
        d = self.instance_type.to_dict()
        d.update(region=self.region, zone=self.zone, capacity=self.capacity, hourly_price=self.hourly_price)
        return d


class RegionCatalog:
    """The offerings of one cloud region, as parallel numpy arrays in the base order (price, name, zone, capacity).

    The base order is the documented ranking without the capacity preference, which depends on the request; the
    planner applies that with one stable sort over the survivors. The file already holds the rows in that order
    (`region_entry` sorts them when a catalog is built), so loading is a few array conversions.
    """

    def __init__(self, cloud: str, region: str, types: Sequence[InstanceType], entry: dict):
        self.cloud = cloud
        self.region = region
        self.types: tuple[InstanceType, ...] = tuple(types)
        self.zones: tuple[str, ...] = tuple(entry["zones"])
        self.o_type = np.asarray(entry["type"], dtype=np.int32)
        self.o_zone = np.asarray(entry["zone"], dtype=np.int32)
        self.o_cap = np.asarray(entry["capacity"], dtype=np.int8)
        self.o_price = np.array([math.nan if p is None else p for p in entry["price"]], dtype=np.float64)

    def __len__(self) -> int:
        return int(self.o_type.shape[0])

    @cached_property
    def type_by_name(self) -> dict[str, int]:
        return {t.name: i for i, t in enumerate(self.types)}

    def offering(self, i: int) -> Offering:
        price = float(self.o_price[i])
        return Offering(
            instance_type=self.types[int(self.o_type[i])],
            region=self.region,
            zone=self.zones[int(self.o_zone[i])],
            capacity=CAPACITY_TYPES[int(self.o_cap[i])],
            hourly_price=None if math.isnan(price) else price,
        )

    def offerings(self) -> Iterator[Offering]:
        for i in range(len(self)):
            yield self.offering(i)

    def find(self, instance_type: str, zone: str, capacity: str) -> Offering | None:
        """The offering with this key, if the catalog has it (used to re-price a machine found after a restart)."""
        t = self.type_by_name.get(instance_type)
        if t is None or zone not in self.zones or capacity not in CAPACITY_TYPES:
            return None
        hit = np.nonzero((self.o_type == t) & (self.o_zone == self.zones.index(zone))
                         & (self.o_cap == CAPACITY_TYPES.index(capacity)))[0]
        return self.offering(int(hit[0])) if len(hit) else None


class Catalog:
    """A loaded catalog file. Thread-safe; region arrays are built on first use and kept."""

    def __init__(self, doc: dict, sha256: str, source: str):
        if doc.get("format") != FORMAT_VERSION:
            raise CatalogError(f"{source}: catalog format {doc.get('format')!r} is not {FORMAT_VERSION}")
        self.doc = doc
        self.sha256 = sha256
        self.name: str = doc.get("name", "catalog")
        self.built: str = doc.get("built", "")
        self.source = source
        self.catalog_id = f"{self.name}@{sha256[:12]}"
        self._types: dict[str, tuple[InstanceType, ...]] = {}
        self._regions: dict[tuple[str, str], RegionCatalog] = {}
        self._lock = threading.Lock()

    @property
    def clouds(self) -> list[str]:
        return sorted(self.doc["clouds"])

    def regions(self, cloud: str) -> list[str]:
        self._cloud_doc(cloud)
        return sorted(self.doc["clouds"][cloud]["regions"])

    def _cloud_doc(self, cloud: str) -> dict:
        try:
            return self.doc["clouds"][cloud]
        except KeyError:
            raise CatalogError(f"catalog {self.catalog_id} has no cloud {cloud!r}; it has {self.clouds}") from None

    def types(self, cloud: str) -> tuple[InstanceType, ...]:
        with self._lock:
            if cloud not in self._types:
                rows = self._cloud_doc(cloud)["types"]
                self._types[cloud] = tuple(
                    InstanceType(cloud=cloud, **dict(zip(TYPE_COLUMNS, row))) for row in rows
                )
            return self._types[cloud]

    def region(self, cloud: str, region: str) -> RegionCatalog:
        key = (cloud, region)
        hit = self._regions.get(key)
        if hit is not None:
            return hit
        regions = self._cloud_doc(cloud)["regions"]
        if region not in regions:
            raise CatalogError(
                f"catalog {self.catalog_id} has no {cloud} region {region!r}; it has {sorted(regions)}")
        built = RegionCatalog(cloud, region, self.types(cloud), regions[region])
        with self._lock:
            return self._regions.setdefault(key, built)

    def instance_type(self, cloud: str, name: str) -> InstanceType | None:
        for t in self.types(cloud):
            if t.name == name:
                return t
        return None


def region_entry(types: Sequence[InstanceType],
                 rows: Sequence[tuple[str, str, str, float | None]]) -> dict:
    """Encode (instance type name, zone, capacity, price|None) rows as a region entry of a catalog file.

    The one place the base order is defined: unknown prices last, then price, instance type name, zone, capacity.
    Both the embedded catalog builder and the live catalog refreshers write regions through this function.
    """
    index = {t.name: i for i, t in enumerate(types)}
    zones = sorted({z for _, z, _, _ in rows})
    zone_index = {z: i for i, z in enumerate(zones)}
    cap_index = {c: i for i, c in enumerate(CAPACITY_TYPES)}
    # Round before sorting: host + accelerator sums differ in the 15th digit, and the order must follow the
    # prices as stored, or two offerings at the same stored price would be ranked by noise instead of by name.
    rows = [(t, z, c, None if p is None else round(float(p), 6)) for t, z, c, p in rows]
    ordered = sorted(
        rows, key=lambda r: (r[3] is None, r[3] if r[3] is not None else 0.0, r[0], r[1], cap_index[r[2]]))
    return {
        "zones": zones,
        "type": [index[r[0]] for r in ordered],
        "zone": [zone_index[r[1]] for r in ordered],
        "capacity": [cap_index[r[2]] for r in ordered],
        "price": [r[3] for r in ordered],
    }


def type_row(t: InstanceType) -> list:
    return [getattr(t, c) for c in TYPE_COLUMNS]


def dump_bytes(doc: dict) -> bytes:
    """A catalog document as the bytes of a catalog file (gzip, mtime 0: same data, same sha256)."""
    return gzip.compress(json.dumps(doc, separators=(",", ":"), sort_keys=True).encode(), compresslevel=9, mtime=0)


def write_atomic(path: Path, raw: bytes) -> None:
    """Write a catalog (cache) file so that readers see the old file or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(raw)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _load_bytes(raw: bytes, source: str) -> Catalog:
    sha = hashlib.sha256(raw).hexdigest()
    try:
        doc = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    except (OSError, ValueError) as e:
        raise CatalogError(f"{source}: not a catalog file ({e})") from e
    return Catalog(doc, sha, source)


def load_file(path: str | Path) -> Catalog:
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise CatalogError(f"cannot read catalog {p}: {e}") from e
    return _load_bytes(raw, str(p))


_embedded: Catalog | None = None
_embedded_lock = threading.Lock()


def embedded() -> Catalog:
    """The catalog shipped inside the package, loaded once per process on first use."""
    global _embedded
    with _embedded_lock:
        if _embedded is None:
            ref = resources.files("ray_nodeless").joinpath("data/catalog.json.gz")
            _embedded = _load_bytes(ref.read_bytes(), "embedded")
            logger.debug("loaded embedded catalog %s", _embedded.catalog_id)
        return _embedded
