"""What the catalog holds: instance types, offerings, and one region's offerings as arrays. No I/O here."""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Iterator, Sequence

from ray_nodeless.core.documents import Document, DocumentView

if TYPE_CHECKING:
    import numpy as np

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

    def to_dict(self) -> Document:
        return {
            "cloud": self.cloud, "instance_type": self.name, "family": self.family, "vcpus": self.vcpus,
            "memory_gib": self.memory_gib, "gpu_model": self.gpu_model or None, "gpu_count": self.gpu_count,
            "gpu_memory_gib": self.gpu_memory_gib, "arch": self.arch, "burstable": self.burstable,
            "accelerator": self.accelerator or None, "accelerator_count": self.accelerator_count,
        }


@dataclass(frozen=True, slots=True)
class Offering:
    """An instance type in one zone, on one capacity type, at a price (None = unknown, never chosen).

    `hourly_price` is what the user pays (the effective price: core/prices.py's `price_overrides` applied);
    `list_price` the catalog's own price on a catalog seen through price overrides, else None (`listed` reads
    either)."""

    instance_type: InstanceType
    region: str
    zone: str
    capacity: str
    hourly_price: float | None
    list_price: float | None = None

    @property
    def listed(self) -> float | None:
        """The catalog's list price of this offering (before any price override)."""
        return self.hourly_price if self.list_price is None else self.list_price

    @property
    def key(self) -> tuple[str, str, str]:
        """What the capacity-error memory is keyed on."""
        return (self.instance_type.name, self.zone, self.capacity)

    def to_dict(self) -> Document:
        d = self.instance_type.to_dict()
        d.update(region=self.region, zone=self.zone, capacity=self.capacity, hourly_price=self.hourly_price)
        return d


class RegionCatalog:
    """The offerings of one cloud region, as parallel columns in the base order (price, name, zone, capacity).

    `types` is the cloud's whole type table (the columns index into it); a type without a row here is not offered
    in the region. The base order is the documented ranking without the capacity preference, which depends on the
    request; the planner applies that with one stable sort over the survivors. A catalog file already holds the
    rows in that order (`region_entry` sorts them when a catalog is built), so loading is a few conversions.

    The columns are kept as Python lists (`type_ids`, `zone_ids`, `cap_ids`, `prices`, None = unknown price) and,
    on first use, as numpy arrays (`o_type`, `o_zone`, `o_cap`, `o_price`, NaN = unknown): a one-off plan in a
    fresh process (`ray-nodeless plan`) never imports numpy (issue 10).
    """

    def __init__(self, cloud: str, region: str, types: Sequence[InstanceType], entry: DocumentView):
        self.cloud = cloud
        self.region = region
        self.types: tuple[InstanceType, ...] = tuple(types)
        self.zones: tuple[str, ...] = tuple(entry["zones"])
        cols = _plain_columns(entry, len(self.types), len(self.zones))
        if cols is None:
            # Anything but plain in-range ints and float/None prices: the numpy conversion decides (it casts what
            # it can and raises the errors a bad catalog has always reported), and the lists come from its result.
            self._to_arrays(entry)
            cols = (self.o_type.tolist(), self.o_zone.tolist(), self.o_cap.tolist(),
                    [None if p != p else p for p in self.o_price.tolist()])
        self.type_ids: list[int] = cols[0]
        self.zone_ids: list[int] = cols[1]
        self.cap_ids: list[int] = cols[2]
        self.prices: list[float | None] = cols[3]

    def _to_arrays(self, entry: DocumentView) -> None:
        import numpy as np

        cloud, region = self.cloud, self.region
        o_type = np.asarray(entry["type"], dtype=np.int32)
        o_zone = np.asarray(entry["zone"], dtype=np.int32)
        o_cap = np.asarray(entry["capacity"], dtype=np.int8)
        o_price = np.array(entry["price"], dtype=np.float64)   # None (unknown price) becomes NaN
        n = len(o_type)
        if not (len(o_zone) == len(o_cap) == len(o_price) == n):
            raise ValueError(f"{cloud} {region}: region arrays differ in length")
        if n and (int(o_type.min()) < 0 or int(o_type.max()) >= len(self.types)
                  or int(o_zone.min()) < 0 or int(o_zone.max()) >= len(self.zones)
                  or int(o_cap.min()) < 0 or int(o_cap.max()) >= len(CAPACITY_TYPES)):
            raise ValueError(f"{cloud} {region}: a row refers to a type, zone or capacity the catalog does not have")
        for arr in (o_type, o_zone, o_cap, o_price):
            arr.flags.writeable = False
        self.__dict__.update(o_type=o_type, o_zone=o_zone, o_cap=o_cap, o_price=o_price)

    def __getattr__(self, name: str) -> np.ndarray:
        # o_type / o_zone / o_cap / o_price: the numpy arrays, built on first use.
        if name in ("o_type", "o_zone", "o_cap", "o_price"):
            self._to_arrays({"type": self.type_ids, "zone": self.zone_ids, "capacity": self.cap_ids,
                             "price": self.prices})
            column: np.ndarray = self.__dict__[name]
            return column
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __len__(self) -> int:
        return len(self.type_ids)

    @cached_property
    def type_by_name(self) -> dict[str, int]:
        return {t.name: i for i, t in enumerate(self.types)}

    def offering(self, i: int) -> Offering:
        return Offering(
            instance_type=self.types[self.type_ids[i]],
            region=self.region,
            zone=self.zones[self.zone_ids[i]],
            capacity=CAPACITY_TYPES[self.cap_ids[i]],
            hourly_price=self.prices[i],
        )

    def offerings(self) -> Iterator[Offering]:
        for i in range(len(self)):
            yield self.offering(i)

    def find(self, instance_type: str, zone: str, capacity: str) -> Offering | None:
        """The offering with this key, if the catalog has it (used to re-price a machine found after a restart)."""
        t = self.type_by_name.get(instance_type)
        if t is None or zone not in self.zones or capacity not in CAPACITY_TYPES:
            return None
        z, c = self.zones.index(zone), CAPACITY_TYPES.index(capacity)
        for i, (ti, zi, ci) in enumerate(zip(self.type_ids, self.zone_ids, self.cap_ids)):
            if ti == t and zi == z and ci == c:
                return self.offering(i)
        return None


def _plain_columns(entry: DocumentView, n_types: int, n_zones: int,
                   ) -> tuple[list[int], list[int], list[int], list[float | None]] | None:
    """The region columns as lists when they are plain: equal lengths, in-range ints, float/int/None prices (what
    every catalog file holds). None for anything else, which the numpy conversion then judges."""
    cols = []
    for key, bound in (("type", n_types), ("zone", n_zones), ("capacity", len(CAPACITY_TYPES))):
        col = entry[key]
        if type(col) is not list or not all(type(v) is int and 0 <= v < bound for v in col):
            return None
        cols.append(col)
    prices = entry["price"]
    if type(prices) is not list:
        return None
    out: list[float | None] = []
    for p in prices:
        if p is None:
            out.append(None)
        elif type(p) is float:
            out.append(None if p != p else p)
        elif type(p) is int and -2**53 <= p <= 2**53:
            out.append(float(p))
        else:
            return None
    if not (len(cols[0]) == len(cols[1]) == len(cols[2]) == len(out)):
        return None
    return cols[0], cols[1], cols[2], out
