"""Constraint values checked against the catalog, each naming its key, with a did-you-mean.

The parsers (requirements.py, rules.py) check shapes and types without a catalog; this module checks the values
the catalog knows: instance types (names and globs), families and zones, in `provider.exclude`, every rule and
every node type's node_config (and an instance type a backend key pins, e.g. AWS `InstanceType`). A value the
catalog does not know is a typo that would otherwise match nothing: an allow-list that then allows nothing (the
node type ends with "no offering", which names neither the key nor the typo) or an exclusion that silently
excludes nothing.

- Every instance type name or glob must be known to the cloud (its whole type table, the union of its regions):
  `g4dn.xlarg`, `g4dn.[` are errors. An allow-list of types must also leave something offered in the region (a
  cloud-wide rule may list types a region lacks, as long as one of them is offered there).
- Every family must be a family of the cloud in any region or generation (the catalogs' and core/family_names.py's
  retired and unpriced ones): `zz9` is an error, `g3` and `p3` are not. A real family the region does not offer is
  fine in an exclusion and a note in an allow-list (`families: [p3]` allows nothing in a region without p3; a node
  type that rule decides then has no offering, which names the key).
- Zones must be zones of the region.
GPU models are checked by the parsers against the cross-cloud vocabulary (core/gpus.py): a model one cloud lacks
is still a real model, and excluding it is harmless.
"""
from __future__ import annotations

import fnmatch
from typing import Callable, Iterable, Mapping

from ray_nodeless.core.documents import Document, DocumentView
from ray_nodeless.core.catalog import RegionCatalog
from ray_nodeless.core.family_names import cloud_families
from ray_nodeless.core.requirements import split_node_config
from ray_nodeless.errors import CatalogError, ConfigError

_GLOB = frozenset("*?[")
# The constraint keys whose values the catalog knows: key -> (what it names, whether it is an allow-list).
RULE_KEYS = {"instance_types": ("type", True), "exclude_instance_types": ("type", False),
             "families": ("family", True), "exclude_families": ("family", False), "zones": ("zone", True)}
EXCLUDE_KEYS = {"instance_types": ("type", False), "families": ("family", False)}     # provider.exclude


def nearest(value: str, known: Iterable[str], cutoff: float = 0.6) -> str | None:
    """The closest known name (difflib), compared case-insensitively; None when nothing is close."""
    import difflib      # only an error pays its import (a cold `plan` stays fast)

    known = sorted(set(known))
    by_lower = {k.lower(): k for k in known}
    hit = difflib.get_close_matches(value.lower(), list(by_lower), n=1, cutoff=cutoff)
    return by_lower[hit[0]] if hit else None


def _a(cloud: str) -> str:
    """`an aws`, `a gcp`."""
    return f"{'an' if cloud[:1] in 'aeiou' else 'a'} {cloud}"


def _hint(value: str, known: Iterable[str]) -> str:
    close = nearest(value, known)
    return f"; did you mean {close!r}?" if close else ""


class CatalogValues:
    """One region's names, computed once per check."""

    def __init__(self, rc: RegionCatalog, unlisted_families: Iterable[str] = ()):
        self.rc = rc
        self.unlisted_families = frozenset(unlisted_families)     # the cloud's real families no catalog lists
        self.cloud, self.region = rc.cloud, rc.region
        self.types = sorted({t.name for t in rc.types})
        self.offered = sorted({rc.types[i].name for i in set(rc.type_ids)})
        self.families = sorted({t.family for t in rc.types})
        self.offered_families = sorted({rc.types[i].family for i in set(rc.type_ids)})
        self.zones = sorted(rc.zones)
        self._cloud_families: frozenset[str] | None = None
        self._cloud_regions: frozenset[str] | None = None

    def matching(self, pattern: str, names: list[str]) -> list[str]:
        if _GLOB & set(pattern):
            return [n for n in names if fnmatch.fnmatchcase(n, pattern)]
        return [pattern] if pattern in set(names) else []

    def check_types(self, values: list[str], key: str, allow: bool) -> None:
        for i, v in enumerate(values):
            if self.matching(v, self.types):
                continue
            if _GLOB & set(v):
                raise ConfigError(f"{key}[{i}]", f"the pattern {v!r} matches no {self.cloud} instance type (a glob: "
                                                 f"`*`, `?`, `[...]`){_hint(v.replace('*', ''), self.types)}")
            raise ConfigError(f"{key}[{i}]", f"{v!r} is not {_a(self.cloud)} instance type in {self.region}"
                                             f"{_hint(v, self.offered)}")
        if allow and not any(self.matching(v, self.offered) for v in values):
            raise ConfigError(key, f"none of {values} is offered in {self.cloud} {self.region}")

    def cloud_families(self) -> frozenset[str]:
        """Every family of the cloud, not of the region: this catalog's, the embedded catalog's (the union of all
        its regions: a live or file catalog may hold fewer) and the real ones no catalog prices
        (core/family_names.py: previous generation, dedicated hosts, ...). Computed only when a name is not in
        this catalog's own families (an unusual name), so a plain check reads nothing more."""
        if self._cloud_families is None:
            from ray_nodeless.core.catalog import embedded

            known = set(self.families)
            try:
                known |= {t.family for t in embedded().types(self.cloud)}
            except CatalogError:
                pass                     # a cloud the embedded catalog has not: this catalog's names only
            self._cloud_families = cloud_families(known, self.unlisted_families)
        return self._cloud_families

    def check_families(self, values: list[str], key: str, allow: bool) -> list[str]:
        """A name must be a family of the cloud (any region, or retired); a real family the region does not offer
        is fine in an exclusion and a note (returned) in an allow-list, which then allows nothing of it."""
        for i, v in enumerate(values):
            if v not in set(self.families) and v not in self.cloud_families():
                raise ConfigError(f"{key}[{i}]", f"{v!r} is not {_a(self.cloud)} instance family in any region "
                                                 f"or generation{_hint(v, self.cloud_families())}")
        if not allow:
            return []
        absent = [v for v in values if v not in set(self.offered_families)]
        if not absent:
            return []
        rest = "" if len(absent) < len(values) else ": the list allows nothing here"
        what = f"is {_a(self.cloud)} family" if len(absent) == 1 else f"are {self.cloud} families"
        return [f"{key}: {', '.join(absent)} {what} {self.region} does not offer (another region's, or retired)"
                f"{rest}"]

    def cloud_regions(self) -> frozenset[str]:
        """The cloud's regions the embedded catalog knows (and this catalog's own), read once, and only when a name
        is not this region's (10,000 price overrides name regions 10,000 times)."""
        if self._cloud_regions is None:
            from ray_nodeless.core.catalog import embedded

            try:
                self._cloud_regions = frozenset(embedded().regions(self.cloud)) | {self.region}
            except CatalogError:
                self._cloud_regions = frozenset({self.region})
        return self._cloud_regions

    def check_regions(self, values: list[str], key: str) -> None:
        for i, v in enumerate(values):
            if v != self.region and v not in self.cloud_regions():
                raise ConfigError(f"{key}[{i}]", f"{v!r} is not {_a(self.cloud)} region"
                                                 f"{_hint(v, self.cloud_regions())}")

    def check_zones(self, values: list[str], key: str) -> None:
        for i, v in enumerate(values):
            if v not in set(self.zones):
                raise ConfigError(f"{key}[{i}]", f"{v!r} is not a zone of {self.cloud} {self.region} (zones: "
                                                 f"{', '.join(self.zones)}){_hint(v, self.zones)}")


def _names(value: object) -> list[str] | None:
    """The names of a list value as the parsers read it (a lone string is a list of one); None when not a list
    of strings (the parsers name that error)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return list(value)
    return None


def check_constraints(values: CatalogValues, data: DocumentView, key: str,
                      keys: Mapping[str, tuple[str, bool]] = RULE_KEYS) -> list[str]:
    """Check the catalog-known keys of one mapping (a rule, a node_config's constraints, `provider.exclude`);
    the notes (names that are real but not offered in the region, in an allow-list)."""
    notes: list[str] = []
    for name, (kind, allow) in keys.items():
        names = _names(data[name]) if name in data else None
        if not names:
            continue
        if kind == "type":
            values.check_types(names, f"{key}.{name}", allow)
        elif kind == "family":
            notes += values.check_families(names, f"{key}.{name}", allow)
        else:
            values.check_zones(names, f"{key}.{name}")
    return notes


def check_catalog_values(cluster_config: DocumentView, rc: RegionCatalog,
                         backend_overrides: Callable[[Document], Document] | None = None,
                         unlisted_families: Iterable[str] = ()) -> list[str]:
    """Every catalog-checkable value of the cluster YAML (see the module docstring). Runs after the parsers, so
    shapes are known to be right where it looks. Returns the notes: real families the region does not offer, in an
    allow-list."""
    values = CatalogValues(rc, unlisted_families)
    notes: list[str] = []
    provider = cluster_config.get("provider") or {}
    exclude = provider.get("exclude")
    if isinstance(exclude, Mapping):
        check_constraints(values, exclude, "provider.exclude", EXCLUDE_KEYS)
    rules = provider.get("rules")
    if isinstance(rules, list):
        for i, rule in enumerate(rules):
            if isinstance(rule, Mapping):
                notes += check_constraints(values, rule, f"provider.rules[{i}]")
    overrides = provider.get("price_overrides")
    if isinstance(overrides, list):
        # A misspelled family, type or region in an override would price nothing, silently.
        for i, entry in enumerate(overrides):
            if isinstance(entry, Mapping):
                check_constraints(values, entry, f"provider.price_overrides[{i}]", EXCLUDE_KEYS)
                values.check_regions(_names(entry.get("regions")) or [], f"provider.price_overrides[{i}].regions")
    if backend_overrides is not None:
        # Zones the provider block's own keys imply (AWS availability_zone, subnets), named after the key.
        for zone in _names(backend_overrides({}).get("zones")) or []:
            if zone not in set(values.zones):
                raise ConfigError(provider_key_holding(provider, zone),
                                  f"{zone!r} is not a zone of {values.cloud} {values.region} (zones: "
                                  f"{', '.join(values.zones)}){_hint(zone, values.zones)}")
    types = cluster_config.get("available_node_types")
    if not isinstance(types, Mapping):
        return notes
    for name in sorted(types, key=str):
        nt = types[name]
        nc = nt.get("node_config") if isinstance(nt, Mapping) else None
        if not isinstance(nc, Mapping):
            continue
        key = f"available_node_types.{name}.node_config"
        ours, theirs = split_node_config(nc)
        notes += check_constraints(values, ours, key)
        if backend_overrides is None:
            continue
        # A backend key that pins an instance type (AWS InstanceType, GCP machineType + guestAccelerators): the
        # pinned type must be one of the cloud's, named after the key that pins it.
        pinned = _names(backend_overrides(dict(theirs)).get("instance_types")) or []
        unknown = [v for v in pinned if not values.matching(v, values.types)]
        if unknown:
            pins = [k for k in sorted(theirs, key=str) if backend_overrides({k: theirs[k]}).get("instance_types")]
            where = f"{key}.{pins[0]}" if pins else key
            raise ConfigError(where, f"{unknown[0]!r} is not {_a(values.cloud)} instance type in {values.region}"
                                     f"{_hint(unknown[0], values.offered)}")
    return notes


def provider_key_holding(provider: DocumentView, value: str) -> str:
    """The provider-block key whose value (or whose mapping's keys) holds `value`; `provider` if none does."""
    for k in sorted(provider, key=str):
        v = provider[k]
        if value in str(v) or (isinstance(v, Mapping) and value in v):
            return f"provider.{k}"
    return "provider"
