"""What a worker group's scheduling becomes (`GroupRules`), and the builder the label handlers write it with.

Several keys of a pod template narrow the same constraint key (a nodeSelector and a required term on the zone,
two GPU labels): `Builder` intersects allow-lists, adds up exclusions and takes the larger minimum, and records
every key a constraint came from, so a contradiction names both keys. The helpers below it are what several label
handlers share: Kubernetes' operators on one Node's label value (`holds`), the integer of a `Gt` / `Lt`, the catalog
values an `In` names (`known`), and a set of matched instance types written as the shortest constraint keys
(`restrict`). Pure; imports only catalog_labels.py below it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from ray_nodeless.core.catalog.model import InstanceType
from ray_nodeless.errors import ConfigError
from ray_nodeless.kuberay.catalog_labels import CatalogFacts


@dataclass(frozen=True)
class Unhonoured:
    """A part of a group's scheduling ray_nodeless cannot honour. `blocking`: a requirement it would break (convert
    refuses the manifest), else a preference it drops."""

    key: str
    reason: str
    blocking: bool

    def __str__(self) -> str:
        return f"{self.key}: {self.reason}"


@dataclass
class GroupRules:
    """A worker group's scheduling as ray_nodeless sees it.

    - `node_config`: constraint keys for the group's node type (requirements.py keys); `{}` when nothing narrows.
    - `regions`: the regions the group's pods require (topology.kubernetes.io/region, ray.io/availability-region);
      None: any. The caller checks the provider's region is among them.
    - `clouds`: the clouds whose node labels the group names (GKE keys: gcp; EKS / Karpenter keys: aws).
    - `node_labels`: the label pairs the pod's nodeSelector (and single-valued required `In` terms) asks of its
      Node (every mapped one holds on a machine of the group by construction of `node_config`; the others are
      noted in `unhonoured`, and contradict a `NotIn` / `DoesNotExist` on the same label).
    - `sources`: constraint key -> the group key path it came from (for notes and errors).
    - `unhonoured`: what is not honoured, in manifest order.
    """

    node_config: dict[str, Any] = field(default_factory=dict)
    regions: tuple[str, ...] | None = None
    clouds: set[str] = field(default_factory=set)
    node_labels: dict[str, str] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    unhonoured: list[Unhonoured] = field(default_factory=list)

    def blocking(self) -> list[Unhonoured]:
        return [u for u in self.unhonoured if u.blocking]

    def check(self) -> None:
        """ConfigError naming the first blocking key, if any."""
        b = self.blocking()
        if b:
            raise ConfigError(b[0].key, b[0].reason)


@dataclass(frozen=True)
class Requirement:
    """One node requirement `label op values` at group key path `key` (a nodeSelector pair is `In [value]`)."""

    label: str
    op: str
    values: list[str]
    key: str

    @property
    def negated(self) -> bool:
        return self.op == "NotIn"


class Builder:
    """Accumulates constraints from several keys into `out`: allow-lists intersect, exclusions add up, minimums take
    the larger; a contradiction is a blocking Unhonoured naming both keys."""

    def __init__(self, out: GroupRules):
        self.out = out

    def refuse(self, key: str, reason: str) -> None:
        """A requirement ray_nodeless would break: blocking."""
        self.out.unhonoured.append(Unhonoured(key, reason, True))

    def drop(self, key: str, reason: str) -> None:
        """A part that is dropped with a note (a preference, or one that holds anyway)."""
        self.out.unhonoured.append(Unhonoured(key, reason, False))

    def _source(self, name: str, key: str) -> None:
        src = self.out.sources
        src[name] = f"{src[name]} and {key}" if name in src else key

    def allow(self, name: str, values: Sequence[str], key: str) -> None:
        nc = self.out.node_config
        if name in nc:
            kept = [v for v in nc[name] if v in values]
            if not kept:
                self.refuse(key, f"{list(values)} contradicts {self.out.sources[name]} ({nc[name]}): no machine has "
                                 "both")
                return
            nc[name] = kept
        else:
            nc[name] = list(values)
        self._source(name, key)

    def exclude(self, name: str, values: Sequence[str], key: str) -> None:
        nc = self.out.node_config
        nc[name] = sorted(set(nc.get(name, [])) | set(values))
        self._source(name, key)

    def at_least(self, name: str, value: float, key: str) -> None:
        nc = self.out.node_config
        nc[name] = max(nc.get(name, value), value)
        self._source(name, key)

    def regions(self, values: list[str], key: str) -> None:
        """The regions the group requires: intersected with those already required."""
        out = self.out
        if out.regions is not None:
            both = tuple(r for r in out.regions if r in values)
            if not both:
                self.refuse(key, f"{values} contradicts {out.sources['region']} ({list(out.regions)})")
                return
            out.regions = both
            out.sources["region"] = f"{out.sources['region']} and {key}"
        else:
            out.regions = tuple(values)
            out.sources["region"] = key


def integer(r: Requirement, b: Builder) -> int | None:
    """The one integer a `Gt` / `Lt` compares with (Kubernetes' rule), else a blocking Unhonoured."""
    try:
        if len(r.values) == 1:
            return int(r.values[0])
    except ValueError:
        pass
    b.refuse(r.key, f"{r.op} needs exactly one integer value, got {list(r.values)}")
    return None


def holds(op: str, value: str | None, values: Sequence[str], n: int | None) -> bool:
    """Kubernetes' node selector operators on one Node's label value (None: the Node has no such label)."""
    if op == "In":
        return value is not None and value in values
    if op == "NotIn":
        return value is None or value not in values
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    try:
        v = int(value) if value is not None else None
    except ValueError:
        return False
    if v is None or n is None:          # Gt / Lt: a Node without the label, or no integer to compare with
        return False
    return v > n if op == "Gt" else v < n


def restrict(r: Requirement, matched: Sequence[InstanceType], facts: CatalogFacts, b: Builder, *,
             names_families: bool) -> None:
    """Keep exactly the instance types `matched` (of facts.types) as constraint keys: nothing when it is all of them,
    else the shortest of: allowed families, excluded families (when `matched` is whole families), allowed
    instance types, excluded instance types. An allow-list names its types, and ray_nodeless launches burstable
    and non-GPU-accelerator types only when named: unless the label is a family's (`names_families`: category,
    generation select families as instance-family does), they are left out of `matched` when it holds anything
    else, so a per-type label (vCPUs, memory, size, ...) narrows ray_nodeless's defaults and never widens them.
    Machines with GPUs only: GPU instances allowed for any shape."""
    what = f"{r.label} {r.op}" + (f" {list(r.values)}" if r.op not in ("Exists", "DoesNotExist") else "")
    if not matched:
        b.refuse(r.key, f"no {facts.cloud} instance type in {facts.region} has {what}")
        return
    if len(matched) == len(facts.types):
        return                                       # every machine satisfies it
    if not names_families:
        matched = [t for t in matched if not (t.burstable or t.accelerator)] or list(matched)
    names = {t.name for t in matched}
    fam_types: dict[str, set[str]] = {}
    for t in facts.types:
        fam_types.setdefault(t.family, set()).add(t.name)
    fams = {t.family for t in matched}
    options: list[tuple[str, list[str]]] = []
    if all(fam_types[f] <= names for f in fams):
        options += [("families", sorted(fams)), ("exclude_families", sorted(set(fam_types) - fams))]
    options += [("instance_types", sorted(names)),
                ("exclude_instance_types", sorted(t.name for t in facts.types if t.name not in names))]
    name, chosen = min(options, key=lambda o: len(o[1]))       # stable: the first of equal lengths
    (b.exclude if name.startswith("exclude_") else b.allow)(name, chosen, r.key)
    if all(t.gpu_count for t in matched):
        b.out.node_config["allow_gpu_instances"] = True


def known(what: str, values: Sequence[str], catalog_values: set[str], key: str, facts: CatalogFacts | None,
          b: Builder) -> list[str] | None:
    """The `In` values the catalog has in the region (all of them without facts); the others select no Node, as in
    Kubernetes: dropped with a note, or a blocking Unhonoured when none is left."""
    if facts is None:
        return list(values)
    kept = [v for v in values if v in catalog_values]
    gone = [v for v in values if v not in catalog_values]
    if not kept:
        b.refuse(key, f"{list(values)}: no {what} of {facts.cloud} in {facts.region} (the catalog's)")
        return None
    if gone:
        b.drop(key, f"{gone}: no {what} of {facts.cloud} in {facts.region} (the catalog's): selects nothing, dropped")
    return kept


def needs_catalog(r: Requirement, facts: CatalogFacts | None, b: Builder) -> bool:
    """True (and a blocking Unhonoured) when `r` can only be resolved against catalog facts and none were given."""
    if facts is None:
        b.refuse(r.key, f"{r.label} is resolved against the catalog's instance types, and none were given")
        return True
    return False
