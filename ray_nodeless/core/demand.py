"""What Ray asks for, as plain data: resource demands with label selectors, gangs, and the labels a node carries.

Pure (no Ray): the adapter's compat module turns Ray's protobufs (`ClusterResourceState`) into these, the CLI turns
`--demand '{"GPU": 2}' --label-selector '{"ray.io/availability-zone": "us-west-2b"}'` into the same, and
`core/open_plan.py` decides what to launch for them.

Label vocabulary (Ray 2.60 `ray._raylet`): every machine ray_nodeless launches carries these, for what it really
got, so a selector on them can be served and is never served by a machine that does not match.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Iterable, Mapping

from ray_nodeless.core.documents import DocumentView
from ray_nodeless.core.catalog import Offering
from ray_nodeless.core.gpus import canonical_gpu
from ray_nodeless.errors import ConfigError

MARKET_TYPE = "ray.io/market-type"
ZONE = "ray.io/availability-zone"
REGION = "ray.io/availability-region"
ACCELERATOR_TYPE = "ray.io/accelerator-type"
# The keys a generated node type can promise (ray.io/node-group and ray.io/node-id are Ray's own, per node).
PROMISABLE = (MARKET_TYPE, ZONE, REGION, ACCELERATOR_TYPE)
ACCELERATOR_RESOURCE = "accelerator_type:"
# Ray's label values for the two markets are our capacity names (spot, on-demand).
IN, NOT_IN = "in", "!in"
EPS = 1e-9


def offering_labels(offering: Offering) -> dict[str, str]:
    """Ray's default labels of a machine of `offering`: what it is, not what was asked."""
    # A reservation is on-demand capacity (Ray's market types are spot and on-demand).
    market = "on-demand" if offering.capacity == "reserved" else offering.capacity
    labels = {MARKET_TYPE: market, ZONE: offering.zone, REGION: offering.region}
    if offering.instance_type.gpu_count:
        labels[ACCELERATOR_TYPE] = offering.instance_type.gpu_model
    return labels


@dataclass(frozen=True)
class Constraint:
    key: str
    op: str                          # IN or NOT_IN
    values: tuple[str, ...]

    def holds(self, labels: Mapping[str, str]) -> bool:
        have = labels.get(self.key)
        return (have in self.values) if self.op == IN else (have not in self.values)

    def describe(self) -> str:
        vals = ",".join(self.values)
        return f"{self.key} {self.op} ({vals})"


@dataclass(frozen=True)
class Selector:
    """All constraints must hold (one of Ray's `label_selector` / fallback entries)."""

    constraints: tuple[Constraint, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(c.holds(labels) for c in self.constraints)

    def describe(self) -> str:
        return " and ".join(c.describe() for c in self.constraints) or "any node"


def canonical_resources(resources: DocumentView) -> tuple[tuple[str, float], ...]:
    """Resources as a sorted tuple without zero amounts (hashable: equal demands are one shape)."""
    out = []
    for k in sorted(resources, key=str):
        v = float(resources[k])
        if v > 0:
            out.append((str(k), v))
    return tuple(out)


@dataclass(frozen=True)
class Demand:
    """One pending resource request of Ray (a task, an actor, a placement-group bundle), `count` times.

    `selectors` are Ray's label selector and its fallbacks in order: a node serves the demand when it matches any
    of them (the first is preferred); none means any node. `gang` names the placement group of a bundle;
    `spread` says each bundle of the gang needs its own node (STRICT_SPREAD), `packed` that they share one
    (STRICT_PACK)."""

    resources: tuple[tuple[str, float], ...]
    selectors: tuple[Selector, ...] = ()
    count: int = 1
    gang: str = ""
    spread: bool = False
    packed: bool = False

    @property
    def res(self) -> dict[str, float]:
        return dict(self.resources)

    def accepts(self, labels: Mapping[str, str]) -> bool:
        return not self.selectors or any(s.matches(labels) for s in self.selectors)

    def describe(self) -> str:
        parts = ", ".join(f"{k}: {fmt_amount(k, v)}" for k, v in self.resources) or "nothing"
        text = "{" + parts + "}"
        if self.selectors:
            text += " where " + " or else ".join(s.describe() for s in self.selectors)
        return text

    @property
    def accelerator(self) -> str:
        """The GPU model the demand names (`accelerator_type:<model>`), canonical, or ''."""
        for k, _ in self.resources:
            if k.startswith(ACCELERATOR_RESOURCE):
                return canonical_gpu(k[len(ACCELERATOR_RESOURCE):])
        return ""


def fmt_amount(key: str, v: float) -> str:
    if key == "memory" or key == "object_store_memory":
        return f"{v / 1024 ** 3:g} GiB"
    return f"{v:g}"


def fits(free: Mapping[str, float], want: Mapping[str, float]) -> bool:
    return all(free.get(k, 0.0) + EPS >= v for k, v in want.items())


def take(free: dict[str, float], want: Mapping[str, float]) -> None:
    for k, v in want.items():
        free[k] = free.get(k, 0.0) - v


def accelerator_satisfied(node_resources: Mapping[str, float], labels: Mapping[str, str], want: str) -> bool:
    return not want or labels.get(ACCELERATOR_TYPE) == want or node_resources.get(ACCELERATOR_RESOURCE + want, 0) > 0


# ----- the CLI's form (`ray-nodeless plan --demand ... --label-selector ...`), Ray's own syntax -------------------

def parse_selector(text_or_map: object, key: str = "--label-selector") -> Selector:
    """A label selector as Ray writes one: {"k": "v"}, {"k": "!v"}, {"k": "in(a,b)"}, {"k": "!in(a,b)"}."""
    data = _json_map(text_or_map, key)
    out = []
    for k in sorted(data):
        v = data[k]
        if not isinstance(v, str) or not v.strip():
            raise ConfigError(f"{key}.{k}", f"must be a string like 'v', '!v', 'in(a,b)' or '!in(a,b)', got {v!r}")
        v = v.strip()
        op = IN
        if v.startswith("!"):
            op, v = NOT_IN, v[1:].strip()
        if v.startswith("in(") and v.endswith(")"):
            values = tuple(x.strip() for x in v[3:-1].split(",") if x.strip())
        else:
            values = (v,)
        if not values:
            raise ConfigError(f"{key}.{k}", "names no value")
        out.append(Constraint(str(k), op, values))
    return Selector(tuple(out))


# `--demand` in the spellings of Ray's task options (`@ray.remote(num_cpus=..., memory=..., accelerator_type=...)`).
_RAY_OPTIONS = {"num_cpus": "CPU", "num_gpus": "GPU"}
# Memory units: Kubernetes' and Ray users' (Gi = 2**30, G = 10**9).
_MEMORY_UNITS = (("gib", 1024 ** 3), ("gi", 1024 ** 3), ("gb", 10 ** 9), ("g", 10 ** 9), ("mib", 1024 ** 2),
                 ("mi", 1024 ** 2), ("mb", 10 ** 6), ("m", 10 ** 6))
# Ray's resource names are case sensitive: a lower-case one is almost surely meant as Ray's.
_CASE = {"cpu": "CPU", "gpu": "GPU"}


def _memory_bytes(v: object, key: str) -> object:
    if not isinstance(v, str):
        return v
    text = v.strip().lower()
    for unit, scale in _MEMORY_UNITS:
        if text.endswith(unit):
            try:
                return float(text.removesuffix(unit)) * scale
            except ValueError:
                break
    raise ConfigError(key, f"must be bytes or a size like '64Gi', '64GiB' or '64G', got {v!r}")


def parse_demand(text_or_map: object, selectors: Iterable[object] = (), key: str = "--demand") -> Demand:
    """`{"GPU": 2}` (Ray's resource names; memory in bytes or "64Gi"/"64GiB"/"64G") plus label selectors, as one
    Demand. Ray's task-option spellings are read too: `num_cpus`, `num_gpus`, `accelerator_type: "L4"` (what
    `@ray.remote(accelerator_type="L4")` asks: `accelerator_type:L4: 0.001`)."""
    data = _json_map(text_or_map, key)
    res: dict[str, float] = {}
    for k, v in data.items():
        name = _RAY_OPTIONS.get(str(k), str(k))
        if name in _CASE:
            raise ConfigError(f"{key}.{k}", f"Ray's resource names are case sensitive: write {_CASE[name]!r} (or "
                                            f"{'num_cpus' if name == 'cpu' else 'num_gpus'}), not {name!r}")
        if name == "accelerator_type":
            if not isinstance(v, str) or not v.strip():
                raise ConfigError(f"{key}.accelerator_type", f"must be a GPU model such as \"L4\", got {v!r}")
            name, v = f"accelerator_type:{v.strip()}", 0.001
        if name == "memory":
            v = _memory_bytes(v, f"{key}.memory")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise ConfigError(f"{key}.{k}", f"must be a number >= 0, got {v!r}")
        if name in res:
            raise ConfigError(f"{key}.{k}", f"{name} is given twice ({k!r} is Ray's {name})")
        res[name] = float(v)
    return Demand(canonical_resources(res), tuple(parse_selector(s) for s in selectors))


# The right form, shown when a demand is not one (`--demand '"64Gi"'`, `--demand 64Gi`).
DEMAND_EXAMPLE = '\'{"CPU": 4, "GPU": 1, "memory": "64Gi", "accelerator_type": "L4"}\''


def _json_map(text_or_map: object, key: str) -> dict[str, object]:
    if isinstance(text_or_map, str):
        try:
            text_or_map = json.loads(text_or_map)
        except json.JSONDecodeError as e:
            raise ConfigError(key, f"is not JSON: {e}; write a JSON object of Ray's resources, e.g. "
                                   f"{DEMAND_EXAMPLE}") from None
    if not isinstance(text_or_map, Mapping):
        raise ConfigError(key, f"must be a JSON object of Ray's resources, e.g. {DEMAND_EXAMPLE}; got "
                               f"{text_or_map!r}")
    return dict(text_or_map)


@dataclass
class NodeCapacity:
    """A node (alive in Ray, or launched and not yet joined) as packing sees it: what is free and its labels."""

    name: str
    free: dict[str, float]
    labels: dict[str, str]
    node_type: str = ""
    zone: str = ""
    hosts: set[str] = field(default_factory=set)     # gangs with a bundle placed here (spread needs distinct)
    has_gpu: bool = False                            # Ray keeps work that needs no GPU off GPU nodes
