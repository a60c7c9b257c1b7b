"""What the catalog holds: instance types, offerings, and one region's offerings as arrays. No I/O here."""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Iterator, Mapping, Sequence

import numpy as np

CLOUDS = ("aws", "gcp")
# Index in this tuple is the capacity id stored in the region arrays.
CAPACITY_TYPES = ("on-demand", "spot")

# Column order of an instance-type row in a catalog file.
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

    `types` is the cloud's whole type table (the arrays index into it); a type without a row here is not offered
    in the region. The base order is the documented ranking without the capacity preference, which depends on the
    request; the planner applies that with one stable sort over the survivors. A catalog file already holds the
    rows in that order (`region_entry` sorts them when a catalog is built), so loading is a few array conversions.
    """

    def __init__(self, cloud: str, region: str, types: Sequence[InstanceType], entry: Mapping):
        self.cloud = cloud
        self.region = region
        self.types: tuple[InstanceType, ...] = tuple(types)
        self.zones: tuple[str, ...] = tuple(entry["zones"])
        self.o_type = np.asarray(entry["type"], dtype=np.int32)
        self.o_zone = np.asarray(entry["zone"], dtype=np.int32)
        self.o_cap = np.asarray(entry["capacity"], dtype=np.int8)
        self.o_price = np.array(entry["price"], dtype=np.float64)   # None (unknown price) becomes NaN
        n = len(self.o_type)
        if not (len(self.o_zone) == len(self.o_cap) == len(self.o_price) == n):
            raise ValueError(f"{cloud} {region}: region arrays differ in length")
        if n and (int(self.o_type.min()) < 0 or int(self.o_type.max()) >= len(self.types)
                  or int(self.o_zone.min()) < 0 or int(self.o_zone.max()) >= len(self.zones)
                  or int(self.o_cap.min()) < 0 or int(self.o_cap.max()) >= len(CAPACITY_TYPES)):
            raise ValueError(f"{cloud} {region}: a row refers to a type, zone or capacity the catalog does not have")

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
