"""What a node type asks for: its resource shape, and the constraint keys of rules and node_config.

The same constraint keys are accepted in three places, and combine in a fixed way:
- `provider.exclude` (global exclusions: always hold),
- the first matching rule of `provider.rules`,
- the node type's `node_config` (narrows the rule further: allow-lists intersect, exclusions add up, minimums
  take the larger value, `max_hourly_price` the smaller, `capacity` must be a subset of the rule's and gives the
  order).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Mapping, TypeGuard

from ray_nodeless.core.documents import Document, DocumentView
from ray_nodeless.core.catalog import CAPACITY_TYPES
from ray_nodeless.core.gpus import KNOWN_GPU_MODELS, canonical_gpu
from ray_nodeless.core.schema import suggest_key, unknown_key
from ray_nodeless.errors import ConfigError, ConfigErrors

GIB = 1024 ** 3

LIST_KEYS = ("instance_types", "exclude_instance_types", "families", "exclude_families", "gpus", "exclude_gpus",
             "zones")
# `open_shape` is written by ray_nodeless itself on the node types it generates for demands (core/open_plan.py):
# the demand a type was opened for, whose rule the launch must follow. Never a backend launch key.
OPEN_SHAPE_KEY = "open_shape"
REQUIREMENT_KEYS = frozenset(LIST_KEYS + ("arch", "min_vcpus", "min_memory_gib", "capacity", "max_hourly_price",
                                          "allow_gpu_instances", OPEN_SHAPE_KEY))
ARCHES = ("x86_64", "arm64")
DEFAULT_CAPACITY = ("on-demand",)
# `reserved`: the cloud's capacity reservations the cluster may use (AWS On-Demand Capacity Reservations), listed at
# run time (launch/reservations.py), not in the catalog: a rule's capacity list may name it beside the catalog's.
RESERVED = "reserved"
RULE_CAPACITY_TYPES = (*CAPACITY_TYPES, RESERVED)
DEFAULT_ARCH = ("x86_64",)


@dataclass(frozen=True)
class Shape:
    """The Ray resources of one node type: what one machine must hold."""

    cpu: float = 0.0
    gpu: int = 0
    memory_gib: float = 0.0
    accelerator_type: str = ""          # from a `accelerator_type:<MODEL>` resource: the GPU model Ray expects

    @classmethod
    def from_resources(cls, resources: object, key: str) -> "Shape":
        if not isinstance(resources, Mapping):
            raise ConfigError(key, f"must be a mapping of resource name to amount (CPU: 4), got {resources!r}")
        accel = ""
        for name in sorted(resources, key=str):
            if not isinstance(name, str) or not name.strip() or name != name.strip():
                raise ConfigError(f"{key}.{name}", f"resource names must be non-empty strings without spaces "
                                                   f"around them, got {name!r}")
            v = resources[name]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ConfigError(f"{key}.{name}", f"must be a finite number >= 0, got {v!r}")
            if str(name).startswith("accelerator_type:"):
                if accel:
                    raise ConfigError(f"{key}.{name}", "a node type can carry only one accelerator_type resource")
                accel = canonical_gpu(name.split(":", 1)[1])
            elif str(name).lower() in ("cpu", "gpu", "memory") and name not in ("CPU", "GPU", "memory"):
                spelled = "memory" if str(name).lower() == "memory" else str(name).upper()
                raise ConfigError(f"{key}.{name}", f"Ray's resource is spelled `{spelled}`")
        gpu = resources.get("GPU", 0)
        if int(gpu) != gpu:
            raise ConfigError(f"{key}.GPU", f"must be a whole number of GPUs, got {gpu!r}")
        return cls(cpu=float(resources.get("CPU", 0)), gpu=int(gpu),
                   memory_gib=float(resources.get("memory", 0)) / GIB, accelerator_type=accel)

    def describe(self) -> str:
        parts = [f"CPU: {self.cpu:g}", f"GPU: {self.gpu}"]
        if self.memory_gib:
            parts.append(f"memory: {self.memory_gib:g} GiB")
        if self.accelerator_type:
            parts.append(f"accelerator_type: {self.accelerator_type}")
        return "{" + ", ".join(parts) + "}"


def only_amounts(resources: Mapping[str, object]) -> TypeGuard[Mapping[str, float]]:
    """Whether every value of `resources` is a number (what a rule's predicates compare): true of any mapping
    Shape.from_resources accepted, which is how Resolver.request narrows a node type's resources."""
    return all(isinstance(v, (int, float)) for v in resources.values())


@dataclass(frozen=True)
class Requirements:
    """Constraint keys as parsed. `None` for an allow-list means "not restricted".

    `instance_types` is a tuple of allow-lists that must *all* match (a rule's list and a node_config's list
    intersect without having to intersect glob patterns).
    """

    instance_types: tuple[tuple[str, ...], ...] = ()
    exclude_instance_types: tuple[str, ...] = ()
    families: frozenset[str] | None = None
    exclude_families: frozenset[str] = frozenset()
    gpus: frozenset[str] | None = None
    exclude_gpus: frozenset[str] = frozenset()
    zones: frozenset[str] | None = None
    arch: tuple[str, ...] | None = None
    min_vcpus: float = 0.0
    min_memory_gib: float = 0.0
    capacity: tuple[str, ...] | None = None
    max_hourly_price: float | None = None
    allow_gpu_instances: bool = False

    def narrowed_by(self, other: "Requirements", key: str) -> "Requirements":
        """Combine: `other` (node_config) narrows `self` (the rule). `key` names other's place for errors."""

        def both(a: frozenset[str] | None, b: frozenset[str] | None, name: str) -> frozenset[str] | None:
            if a is None or b is None:
                return b if a is None else a
            out = a & b
            if not out:
                raise ConfigError(f"{key}.{name}", f"{sorted(b)} leaves nothing of the rule's {sorted(a)}")
            return out

        capacity = self.capacity
        if other.capacity is not None:
            if self.capacity is not None and not set(other.capacity) <= set(self.capacity):
                raise ConfigError(f"{key}.capacity",
                                  f"{list(other.capacity)} is not within the rule's {list(self.capacity)}")
            capacity = other.capacity
        arch = self.arch
        if other.arch is not None:
            arch = other.arch if self.arch is None else tuple(a for a in other.arch if a in self.arch)
            if not arch:
                raise ConfigError(f"{key}.arch",
                                  f"{list(other.arch)} conflicts with the rule's {list(self.arch or ())}")
        prices = [p for p in (self.max_hourly_price, other.max_hourly_price) if p is not None]
        return Requirements(
            instance_types=self.instance_types + other.instance_types,
            exclude_instance_types=tuple(sorted(set(self.exclude_instance_types + other.exclude_instance_types))),
            families=both(self.families, other.families, "families"),
            exclude_families=self.exclude_families | other.exclude_families,
            gpus=both(self.gpus, other.gpus, "gpus"),
            exclude_gpus=self.exclude_gpus | other.exclude_gpus,
            zones=both(self.zones, other.zones, "zones"),
            arch=arch,
            min_vcpus=max(self.min_vcpus, other.min_vcpus),
            min_memory_gib=max(self.min_memory_gib, other.min_memory_gib),
            capacity=capacity,
            max_hourly_price=min(prices) if prices else None,
            allow_gpu_instances=self.allow_gpu_instances or other.allow_gpu_instances,
        )


def known_gpu(name: str, key: str) -> str:
    """The canonical model of a GPU name, which must be a known one (a typo would otherwise exclude nothing)."""
    model = canonical_gpu(name)
    if model not in KNOWN_GPU_MODELS:
        close = suggest_key(model, KNOWN_GPU_MODELS, cutoff=0.5)
        hint = f"; did you mean {close}?" if close else f"; known models: {', '.join(sorted(KNOWN_GPU_MODELS))}"
        raise ConfigError(key, f"{name!r} is not a known GPU model{hint}")
    return model


def _str_list(value: object, key: str, *, allow_empty: bool = True) -> list[str]:
    """A list of names. A name with spaces around it (`'A100 '`) is refused, not trimmed: in a YAML it is a quoted
    typo, and what it was meant to match is then said in the message. An allow-list (`allow_empty=False`) must name
    something: `families: []` would allow nothing, which no user means."""
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) and v.strip() for v in value):
        raise ConfigError(key, f"must be a list of non-empty strings, got {value!r}")
    for i, v in enumerate(value):
        if v != v.strip():
            raise ConfigError(f"{key}[{i}]", f"{v!r} has spaces around it; did you mean {v.strip()!r}?")
    if not value and not allow_empty:
        raise ConfigError(key, "an empty list allows nothing; remove the key to allow any")
    return list(value)


def _number(value: object, key: str, minimum: float = 0.0) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < minimum:
        raise ConfigError(key, f"must be a finite number >= {minimum:g}, got {value!r}")
    return float(value)


def parse_requirements(data: DocumentView, key: str, *, allow_unknown: bool = False) -> Requirements:
    """Parse the constraint keys of `data` (a rule, a node_config, or `provider.exclude`).

    Unknown keys raise unless `allow_unknown` (node_config also holds the backend's launch keys).
    """
    if not isinstance(data, Mapping):
        raise ConfigError(key, f"must be a mapping, got {type(data).__name__}")
    if not allow_unknown:
        unknown = sorted(k for k in data if k not in REQUIREMENT_KEYS)
        if unknown:
            raise unknown_key(f"{key}.{unknown[0]}", str(unknown[0]), REQUIREMENT_KEYS - {OPEN_SHAPE_KEY})
    kw: Document = {}
    if "instance_types" in data:
        kw["instance_types"] = (tuple(_str_list(data["instance_types"], f"{key}.instance_types", allow_empty=False)),)
    if "exclude_instance_types" in data:
        kw["exclude_instance_types"] = tuple(sorted(set(
            _str_list(data["exclude_instance_types"], f"{key}.exclude_instance_types"))))
    for name in ("families", "exclude_families", "zones"):
        if name in data:
            kw[name] = frozenset(_str_list(data[name], f"{key}.{name}", allow_empty=name.startswith("exclude_")))
    for name in ("gpus", "exclude_gpus"):
        if name in data:
            names = _str_list(data[name], f"{key}.{name}", allow_empty=name == "exclude_gpus")
            kw[name] = frozenset(known_gpu(g, f"{key}.{name}[{i}]") for i, g in enumerate(names))
    if "arch" in data:
        arches = _str_list(data["arch"], f"{key}.arch")
        if arches == ["any"]:
            arches = list(ARCHES)
        bad = [a for a in arches if a not in ARCHES]
        if bad:
            raise ConfigError(f"{key}.arch", f"{bad[0]!r} is not one of {list(ARCHES)} or 'any'")
        kw["arch"] = tuple(arches)
    if "capacity" in data:
        caps = _str_list(data["capacity"], f"{key}.capacity")
        bad = [c for c in caps if c not in RULE_CAPACITY_TYPES]
        if bad:
            raise ConfigError(f"{key}.capacity", f"{bad[0]!r} is not one of {list(RULE_CAPACITY_TYPES)}")
        if not caps:
            raise ConfigError(f"{key}.capacity", "must list at least one capacity type (reserved, spot, on-demand)")
        if len(set(caps)) != len(caps):
            raise ConfigError(f"{key}.capacity", f"lists a capacity type twice: {caps}")
        kw["capacity"] = tuple(caps)
    if "min_vcpus" in data:
        kw["min_vcpus"] = _number(data["min_vcpus"], f"{key}.min_vcpus")
    if "min_memory_gib" in data:
        kw["min_memory_gib"] = _number(data["min_memory_gib"], f"{key}.min_memory_gib")
    if "max_hourly_price" in data:
        kw["max_hourly_price"] = _number(data["max_hourly_price"], f"{key}.max_hourly_price")
        if kw["max_hourly_price"] <= 0:
            raise ConfigError(f"{key}.max_hourly_price", "must be > 0")
    if "allow_gpu_instances" in data:
        if not isinstance(data["allow_gpu_instances"], bool):
            raise ConfigError(f"{key}.allow_gpu_instances",
                              f"must be true or false, got {data['allow_gpu_instances']!r}")
        kw["allow_gpu_instances"] = data["allow_gpu_instances"]
    return Requirements(**kw)


def parse_exclude(data: object, key: str) -> Requirements:
    """`provider.exclude: {families, gpus, instance_types}` -> exclusion-only Requirements."""
    if data is None:
        return Requirements()
    if not isinstance(data, Mapping):
        raise ConfigError(key, f"must be a mapping, got {type(data).__name__}")
    allowed = ("families", "gpus", "instance_types")
    unknown = [unknown_key(f"{key}.{k}", str(k), allowed) for k in sorted(data, key=str) if k not in allowed]
    if unknown:
        raise ConfigErrors.of(unknown)
    return Requirements(
        exclude_families=frozenset(_str_list(data.get("families", []), f"{key}.families")),
        exclude_gpus=frozenset(known_gpu(g, f"{key}.gpus[{i}]")
                               for i, g in enumerate(_str_list(data.get("gpus", []), f"{key}.gpus"))),
        exclude_instance_types=tuple(sorted(set(_str_list(data.get("instance_types", []), f"{key}.instance_types")))),
    )


def split_node_config(node_config: DocumentView) -> tuple[Document, Document]:
    """Split a node_config into (ray_nodeless requirement keys, backend launch keys)."""
    ours = {k: v for k, v in node_config.items() if k in REQUIREMENT_KEYS}
    theirs = {k: v for k, v in node_config.items() if k not in REQUIREMENT_KEYS}
    return ours, theirs


_FAMILY_PART = re.compile(r"^([^.\-+]*)")


def names_explicitly(pattern: str) -> bool:
    """Whether an instance_types pattern names a family on purpose (`t3.*` does, `*` and `t*.large` do not).

    Burstable types, GPU types for CPU-only shapes and non-GPU accelerators are allowed only when named.
    """
    fam = _FAMILY_PART.match(pattern)
    family = fam.group(1) if fam else ""
    return bool(family) and not any(c in family for c in "*?[")


@dataclass(frozen=True)
class Request:
    """Everything the planner needs for one decision. Hashable: identical requests share one cached plan."""

    cloud: str
    region: str
    shape: Shape
    requirements: Requirements
    rule: str = "default"
    node_type: str = ""

    @property
    def capacity(self) -> tuple[str, ...]:
        return self.requirements.capacity or DEFAULT_CAPACITY

    @property
    def catalog_capacity(self) -> tuple[str, ...]:
        """The catalog's capacity types the planner ranks: the rule's, without `reserved`; a rule of reserved
        capacity only plans on on-demand offerings as its stand-ins (a reservation is on-demand capacity, billed at
        the on-demand price), which the launcher does not launch (launch/reservations.py)."""
        caps = tuple(c for c in self.capacity if c != RESERVED)
        return caps or DEFAULT_CAPACITY

    @property
    def reserved_only(self) -> bool:
        return self.capacity == (RESERVED,)

    @property
    def arch(self) -> tuple[str, ...]:
        return self.requirements.arch or DEFAULT_ARCH
