"""Effective prices: what the user pays for an offering, where it differs from the catalog's list price.

    provider:
      price_overrides:
        - instance_types: [g4dn.xlarge]     # a reserved instance: a fixed price
          capacity: [on-demand]
          hourly_price: 0.33
        - families: [g4dn, g6]              # a Savings Plan on these families: 28 % off the list price
          capacity: [on-demand]
          discount: 0.28
        - discount: 0.05                    # an enterprise discount on everything else

Each override has match keys (every one given must hold; none given matches every offering) and exactly one price:
- `families`: family names (`g4dn`, `n1`); `instance_types`: globs on the instance type (`g4dn.*`);
  `capacity`: capacity types (`on-demand`, `spot`); `regions`: region names (`us-west-2`).
- `discount`: a fraction off the list price, 0 <= discount < 1 (`0.28` is 28 % off); or `hourly_price`: a fixed
  USD/hour (> 0) whatever the list price (an offering with an unknown list price gets a price this way).

**First match wins**, as in `rules`: the overrides are read top to bottom and the first one whose match keys all
hold prices the offering; discounts never stack. Put the specific ones (a reserved instance type) before the
general ones (a family-wide plan, a blanket discount). An offering no override matches keeps its list price.

The effective price is the price everywhere a price is used: the documented total order of candidates (capacity
preference, then *effective* price, then name, zone), `max_hourly_price` in rules, `provider.max_hourly_cost`
(the launcher's reservations), the machines' price tags, `ray-nodeless plan`, `status` and `simulate`. The list
price stays beside it on every offering (`Offering.list_price`) so the reports can show both.

How: `priced(catalog, book)` is the catalog seen through the overrides: each region's rows re-priced and put back
into the base order (`encoding.region_entry`, the one place that order is defined), so the planner (both of its
evaluations) and everything downstream read effective prices without knowing overrides exist. Its `catalog_id`
is the catalog's plus `+prices@<12 hex digits of the overrides' digest>`, so a decision names the prices it used.
"""
from __future__ import annotations

import fnmatch
import functools
import hashlib
import json
import threading
from dataclasses import dataclass, field
from typing import Any, Sequence

from ray_nodeless.core.documents import Document
from ray_nodeless.core.catalog import CAPACITY_TYPES, Catalog, InstanceType, Offering, RegionCatalog
from ray_nodeless.core.catalog.encoding import region_entry
from ray_nodeless.core.schema import unknown_key
from ray_nodeless.errors import ConfigError

KEY = "provider.price_overrides"
MATCH_KEYS = ("families", "instance_types", "capacity", "regions")
PRICE_KEYS = ("discount", "hourly_price")


@dataclass(frozen=True)
class PriceOverride:
    """One entry of `price_overrides`: where it applies and what it makes the price."""

    families: frozenset[str] | None = None
    instance_types: tuple[str, ...] | None = None     # globs
    capacity: frozenset[str] | None = None
    regions: frozenset[str] | None = None
    discount: float | None = None
    hourly_price: float | None = None

    def matches(self, t: InstanceType, region: str, capacity: str) -> bool:
        return (self.matches_type(t) and (self.capacity is None or capacity in self.capacity)
                and (self.regions is None or region in self.regions))

    def matches_type(self, t: InstanceType) -> bool:
        return ((self.families is None or t.family in self.families)
                and (self.instance_types is None
                     or any(fnmatch.fnmatchcase(t.name, p) for p in self.instance_types)))

    def apply(self, list_price: float | None) -> float | None:
        if self.hourly_price is not None:
            return self.hourly_price
        if list_price is None:
            return None           # a discount of an unknown price is still unknown: never chosen
        return list_price * (1.0 - float(self.discount or 0.0))

    def to_dict(self) -> Document:
        out: Document = {}
        for k in MATCH_KEYS:
            v = getattr(self, k)
            if v is not None:
                out[k] = sorted(v) if isinstance(v, frozenset) else list(v)
        for k in PRICE_KEYS:
            v = getattr(self, k)
            if v is not None:
                out[k] = v
        return out


@dataclass(frozen=True)
class PriceBook:
    """The parsed `price_overrides`, in the order given (first match wins).

    Looked up through an index, not by trying every override on every offering: 10,000 overrides over a region's
    10,000 offerings made `plan` take 126 s. An override naming families is filed under each family, one naming
    only literal instance types under each name; only glob-only and match-everything overrides are tried on every
    instance type. Per instance type the candidate overrides (in order) are computed once."""

    overrides: tuple[PriceOverride, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.overrides)

    def effective(self, t: InstanceType, region: str, capacity: str, list_price: float | None) -> float | None:
        i = self.which(t, region, capacity)
        return list_price if i is None else self.overrides[i].apply(list_price)

    def which(self, t: InstanceType, region: str, capacity: str) -> int | None:
        """The index of the override that prices this offering (None: the list price)."""
        for i in self._candidates(t):
            if self.overrides[i].matches(t, region, capacity):
                return i
        return None

    def _candidates(self, t: InstanceType) -> tuple[int, ...]:
        """The overrides that may match instance type `t`, in order (its family's, its name's, the globbed ones
        that match it, the open ones); computed once per instance type."""
        idx = self._index
        hit = idx.cache.get(t.name)
        if hit is None:
            found = set(idx.by_family.get(t.family, ())) | set(idx.by_name.get(t.name, ())) | set(idx.open)
            found |= {i for i in idx.globbed if self.overrides[i].matches_type(t)}
            hit = idx.cache[t.name] = tuple(sorted(found))
        return hit

    @functools.cached_property
    def _index(self) -> "_Index":
        idx = _Index()
        for i, o in enumerate(self.overrides):
            if o.families is not None:
                for f in o.families:
                    idx.by_family.setdefault(f, []).append(i)
            elif o.instance_types is not None and not any(_GLOB & set(p) for p in o.instance_types):
                for name in o.instance_types:
                    idx.by_name.setdefault(name, []).append(i)
            elif o.instance_types is not None:
                idx.globbed.append(i)
            else:
                idx.open.append(i)
        return idx

    @property
    def digest(self) -> str:
        doc = json.dumps([o.to_dict() for o in self.overrides], sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(doc.encode()).hexdigest()[:12]


_GLOB = frozenset("*?[")


@dataclass
class _Index:
    by_family: dict[str, list[int]] = field(default_factory=dict)
    by_name: dict[str, list[int]] = field(default_factory=dict)
    globbed: list[int] = field(default_factory=list)
    open: list[int] = field(default_factory=list)
    cache: dict[str, tuple[int, ...]] = field(default_factory=dict)     # instance type name -> candidates


# ----------------------------------------------------------------------------------------------- parsing

def _names(value: object, key: str, allowed: Sequence[str] | None = None) -> frozenset[str]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v.strip() for v in value):
        raise ConfigError(key, f"must be a non-empty list of names, got {value!r}")
    if allowed is not None:
        bad = sorted(v for v in value if v not in allowed)
        if bad:
            raise ConfigError(key, f"{bad[0]!r} is not one of {list(allowed)}")
    return frozenset(value)


def _number(value: object, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or value in (
            float("inf"), float("-inf")):
        raise ConfigError(key, f"must be a finite number, got {value!r}")
    return float(value)


def parse_price_overrides(value: object, prefix: str = KEY) -> PriceBook:
    """`provider.price_overrides` as a PriceBook; every mistake a ConfigError naming the key
    (`provider.price_overrides[1].discount: must be >= 0 and < 1 ...`)."""
    if value is None:
        return PriceBook()
    if isinstance(value, PriceBook):
        return value
    if not isinstance(value, list):
        raise ConfigError(prefix, f"must be a list of overrides, got {type(value).__name__}")
    out: list[PriceOverride] = []
    known = MATCH_KEYS + PRICE_KEYS
    for i, entry in enumerate(value):
        key = f"{prefix}[{i}]"
        if not isinstance(entry, dict):
            raise ConfigError(key, f"must be a mapping, got {type(entry).__name__}")
        for k in sorted(entry, key=str):
            if k not in known:
                raise unknown_key(f"{key}.{k}", str(k), known)
        given = [k for k in PRICE_KEYS if k in entry]
        if len(given) != 1:
            raise ConfigError(key, "needs exactly one of `discount` (a fraction off the list price) or "
                                   f"`hourly_price` (a fixed USD/hour); got {given or 'neither'}")
        kw: Document = {}
        if "families" in entry:
            kw["families"] = _names(entry["families"], f"{key}.families")
        if "instance_types" in entry:
            kw["instance_types"] = tuple(sorted(_names(entry["instance_types"], f"{key}.instance_types")))
        if "capacity" in entry:
            kw["capacity"] = _names(entry["capacity"], f"{key}.capacity", CAPACITY_TYPES)
        if "regions" in entry:
            kw["regions"] = _names(entry["regions"], f"{key}.regions")
        if "discount" in entry:
            d = _number(entry["discount"], f"{key}.discount")
            if not 0 <= d < 1:
                raise ConfigError(f"{key}.discount", f"must be >= 0 and < 1 (a fraction: 0.28 is 28 % off the "
                                                     f"list price), got {entry['discount']!r}")
            kw["discount"] = d
        else:
            p = _number(entry["hourly_price"], f"{key}.hourly_price")
            if p <= 0:
                raise ConfigError(f"{key}.hourly_price", f"must be > 0 (USD per hour), got {entry['hourly_price']!r}")
            kw["hourly_price"] = p
        out.append(PriceOverride(**kw))
    return PriceBook(tuple(out))


def unused_overrides(book: PriceBook, rc: RegionCatalog) -> str | None:
    """A note naming the overrides that price no offering of `rc` (they match none here, or an earlier override
    matches first), or None. One note for all of them: 10,000 overrides for other regions are one line."""
    if not book:
        return None
    used = {book.which(rc.types[t], rc.region, CAPACITY_TYPES[c]) for t, c in zip(rc.type_ids, rc.cap_ids)}
    unused = [i for i in range(len(book.overrides)) if i not in used]
    if not unused:
        return None
    shown = ", ".join(f"{KEY}[{i}]" for i in unused[:5]) + (f" and {len(unused) - 5} more" if len(unused) > 5 else "")
    return (f"{shown} price{'s' if len(unused) == 1 else ''} no offering of {rc.cloud} {rc.region} (matching none "
            "here, or after an earlier override that matches first)")


# ----------------------------------------------------------------------------------------------- the priced catalog

class PricedRegion(RegionCatalog):
    """A region's offerings at effective prices, in the base order of those prices; `list_prices` beside them."""

    def __init__(self, base: RegionCatalog, book: PriceBook):
        rows = []
        for ti, zi, ci, p in zip(base.type_ids, base.zone_ids, base.cap_ids, base.prices):
            t, cap = base.types[ti], CAPACITY_TYPES[ci]
            rows.append((t.name, base.zones[zi], cap, book.effective(t, base.region, cap, p), p))
        entry = region_entry(base.types, [r[:4] for r in rows])
        super().__init__(base.cloud, base.region, base.types, entry)
        listed = {(r[0], r[1], r[2]): r[4] for r in rows}
        self.list_prices: list[float | None] = [
            listed[(self.types[t].name, self.zones[z], CAPACITY_TYPES[c])]
            for t, z, c in zip(self.type_ids, self.zone_ids, self.cap_ids)]

    def offering(self, i: int) -> Offering:
        o = super().offering(i)
        return Offering(o.instance_type, o.region, o.zone, o.capacity, o.hourly_price, self.list_prices[i])


class PricedCatalog:
    """`base` seen through `book`: every region re-priced on first use. Everything else is the base catalog's."""

    def __init__(self, base: Catalog, book: PriceBook):
        self.base = base
        self.book = book
        self.catalog_id = f"{base.catalog_id}+prices@{book.digest}"
        self._regions: dict[tuple[str, str], PricedRegion] = {}
        self._lock = threading.Lock()

    # Any: a transparent proxy, each attribute is whatever the base Catalog's is (priced() returns it as one).
    def __getattr__(self, name: str) -> Any:
        return getattr(self.base, name)

    def region(self, cloud: str, region: str) -> PricedRegion:
        key = (cloud, region)
        hit = self._regions.get(key)
        if hit is None:
            base = self.base.region(cloud, region)
            with self._lock:
                hit = self._regions.get(key)
                if hit is None:
                    hit = self._regions[key] = PricedRegion(base, self.book)
        return hit


_priced: dict[tuple[str, str], PricedCatalog] = {}
_priced_lock = threading.Lock()


def priced(catalog: Catalog, book: PriceBook | None) -> Catalog:
    """The catalog at effective prices (the catalog itself when there are no overrides). Idempotent: a catalog
    already priced by `book` is returned as is, one priced by other overrides is re-priced from its base. One
    object per (catalog, overrides) per process, so `planner_for` keeps one plan cache for it."""
    base = catalog.base if isinstance(catalog, PricedCatalog) else catalog
    if not book:
        return base
    if isinstance(catalog, PricedCatalog) and catalog.book == book:
        return catalog
    key = (base.catalog_id, book.digest)
    with _priced_lock:
        hit = _priced.get(key)
        if hit is None or hit.base is not base:
            hit = _priced[key] = PricedCatalog(base, book)
    return hit  # type: ignore[return-value]
