"""Ordered rules: the first rule whose `match` holds for a node type decides its constraints.

    provider:
      exclude: {families: [t2], gpus: [M60, K80], instance_types: ["p5.*"]}     # always hold
      rules:
        - name: gpu-workers
          match: {node_type: "gpu-*", GPU: ">=1"}      # every condition must hold; {} matches everything
          capacity: [spot, on-demand]
          families: [g4dn, g5, g6]
        - name: everything-else
          match: {}
          capacity: [on-demand]

`match` keys: `node_type` (a glob or a list of globs on the node type name), `node_kind` (`head` | `worker`),
and resource predicates on the node type's `resources`: `CPU`, `GPU`, `memory_gib` (memory in GiB) or any custom
resource name, each a number (equality) or a string `">=1"`, `"<= 4"`, `">2"`, `"<8"`, `"==1"`, `"!=0"`.
A resource the node type does not declare counts as 0. When no rule matches, the node type gets the defaults.
"""
from __future__ import annotations

import fnmatch
import operator
import re
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from ray_nodeless.core.requirements import GIB, OPEN_SHAPE_KEY, REQUIREMENT_KEYS, Requirements, parse_requirements
from ray_nodeless.core.schema import suggest_key, unknown_key
from ray_nodeless.errors import ConfigError, ConfigErrors

_OPS: dict[str, Callable[[float, float], bool]] = {
    ">=": operator.ge, "<=": operator.le, "==": operator.eq, "!=": operator.ne, ">": operator.gt, "<": operator.lt,
}
_PRED = re.compile(r"^\s*(>=|<=|==|!=|>|<)?\s*(-?\d+(?:\.\d+)?)\s*$")
DEFAULT_RULE = "default"
# The match keys with a meaning of their own; any other key is a custom Ray resource (e.g. `TPU`, `my_accel`).
_STANDARD_MATCH_KEYS = ("CPU", "GPU", "memory_gib", "node_type", "node_kind", "object_store_memory")


@dataclass(frozen=True)
class Predicate:
    resource: str
    op: str
    value: float

    def holds(self, resources: Mapping[str, float]) -> bool:
        if self.resource == "memory_gib":
            have = float(resources.get("memory", 0)) / GIB
        else:
            have = float(resources.get(self.resource, 0))
        return _OPS[self.op](have, self.value)

    def __str__(self) -> str:
        return f"{self.resource} {self.op} {self.value:g}"


@dataclass(frozen=True)
class Rule:
    name: str
    node_types: tuple[str, ...]          # globs; empty = any
    node_kind: str | None                # "head" | "worker" | None
    predicates: tuple[Predicate, ...]
    requirements: Requirements
    index: int

    def matches(self, node_type: str, resources: Mapping[str, float], is_head: bool) -> bool:
        if self.node_types and not any(fnmatch.fnmatchcase(node_type, g) for g in self.node_types):
            return False
        if self.node_kind is not None and (self.node_kind == "head") != is_head:
            return False
        return all(p.holds(resources) for p in self.predicates)


def _parse_predicate(resource: str, spec: object, key: str) -> Predicate:
    if resource == "memory":
        raise ConfigError(key, "use `memory_gib` (GiB) to match on memory; `memory` in bytes is ambiguous here")
    if isinstance(spec, bool) or not isinstance(spec, (int, float, str)):
        raise ConfigError(key, f"must be a number or a comparison such as \">=1\", got {spec!r}")
    if isinstance(spec, (int, float)):
        return Predicate(resource, "==", float(spec))
    m = _PRED.match(spec)
    if not m:
        raise ConfigError(key, f"{spec!r} is not a comparison such as \">=1\", \"<= 4\" or \"==0\"")
    return Predicate(resource, m.group(1) or "==", float(m.group(2)))


# The keys of a rule: its name, its match and the constraint keys (core/requirements.py), save the one
# ray_nodeless writes on generated node types.
RULE_KEYS = frozenset({"name", "match"} | (REQUIREMENT_KEYS - {OPEN_SHAPE_KEY}))


def parse_rule(data: object, index: int) -> Rule:
    key = f"provider.rules[{index}]"
    if not isinstance(data, Mapping):
        raise ConfigError(key, f"must be a mapping with `name`, `match` and constraint keys, got {data!r}")
    unknown = [unknown_key(f"{key}.{k}", str(k), RULE_KEYS) for k in sorted(data, key=str) if k not in RULE_KEYS]
    if unknown:
        # A typo is named as itself (`mach`: did you mean 'match'?), before the key it leaves missing.
        raise ConfigErrors.of(unknown)
    name = data.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"{key}.name", "every rule needs a non-empty name (decisions and logs cite it)")
    match = data.get("match", {})
    if match is None:
        match = {}
    if not isinstance(match, Mapping):
        raise ConfigError(f"{key}.match", f"must be a mapping, got {match!r}")
    node_types: tuple[str, ...] = ()
    node_kind = None
    preds = []
    for k in sorted(match):
        v = match[k]
        if k == "node_type":
            globs = [v] if isinstance(v, str) else v
            if not isinstance(globs, list) or not all(isinstance(g, str) and g for g in globs):
                raise ConfigError(f"{key}.match.node_type", f"must be a glob or a list of globs, got {v!r}")
            node_types = tuple(globs)
        elif k == "node_kind":
            if v not in ("head", "worker"):
                raise ConfigError(f"{key}.match.node_kind", f"must be 'head' or 'worker', got {v!r}")
            node_kind = v
        else:
            close = suggest_key(str(k), _STANDARD_MATCH_KEYS)
            if close and close != k:
                # `GPUS` or `gpu` would never match Ray's `GPU` resource: a rule that silently never applies.
                raise ConfigError(f"{key}.match.{k}", f"unknown key {k!r}; did you mean {close!r}?")
            preds.append(_parse_predicate(k, v, f"{key}.match.{k}"))
    constraints = {k: v for k, v in data.items() if k not in ("name", "match")}
    return Rule(name=name.strip(), node_types=node_types, node_kind=node_kind, predicates=tuple(preds),
                requirements=parse_requirements(constraints, key), index=index)


@dataclass(frozen=True)
class RuleSet:
    rules: tuple[Rule, ...]
    exclude: Requirements

    def first_match(self, node_type: str, resources: Mapping[str, float], is_head: bool) -> Rule | None:
        for rule in self.rules:
            if rule.matches(node_type, resources, is_head):
                return rule
        return None


def parse_rules(data: object) -> tuple[Rule, ...]:
    if data is None:
        return ()
    if not isinstance(data, Sequence) or isinstance(data, (str, bytes)):
        raise ConfigError("provider.rules", f"must be a list of rules, got {type(data).__name__}")
    rules = tuple(parse_rule(r, i) for i, r in enumerate(data))
    seen: dict[str, int] = {}
    for r in rules:
        if r.name in seen:
            raise ConfigError(f"provider.rules[{r.index}].name",
                              f"{r.name!r} is already the name of provider.rules[{seen[r.name]}]")
        if r.name == DEFAULT_RULE:
            raise ConfigError(f"provider.rules[{r.index}].name", f"{DEFAULT_RULE!r} is reserved")
        seen[r.name] = r.index
    return rules


# The node type name a shape-open demand is resolved under (core/open_plan.py's `resolver.request("open", ...)`).
OPEN_DEMAND_NODE_TYPE = "open"


def _catch_all(rule: Rule) -> bool:
    return not rule.node_types and rule.node_kind is None and not rule.predicates


def rule_warnings(rules: RuleSet, node_types: Mapping[str, tuple[Mapping[str, float], bool]],
                  shape_open: bool = False) -> list[str]:
    """What makes a rule dead weight, one message per rule: it stands after a catch-all rule (`match: {}`, which
    matches everything first), or (a rule that is not itself a catch-all) it decides no node type
    (`node_types`: name -> (the resources it is matched on,
    whether it is the head)) and, on a shape-open cluster, no demand either. Such a rule is usually a typo in a
    glob or a predicate, or rules in the wrong order: a warning, since the cluster still plans."""
    out = []
    catch_all: Rule | None = None
    for r in rules.rules:
        key = f"provider.rules[{r.index}] ({r.name!r})"
        if catch_all is not None:
            out.append(f"{key} stands after the catch-all provider.rules[{catch_all.index}] ({catch_all.name!r}, "
                       f"match: {{}}), which matches every node type and demand first: it never applies")
            continue
        if _catch_all(r):
            catch_all = r        # a fallback for node types added later: deciding nothing today is its purpose
            continue
        decides = [n for n, (res, head) in node_types.items() if rules.first_match(n, res, head) is r]
        # A demand is matched as a worker named OPEN_DEMAND_NODE_TYPE with the demand's resources: any rule that
        # is not head-only and whose globs admit that name may decide some demand.
        demands = shape_open and r.node_kind != "head" and (
            not r.node_types or any(fnmatch.fnmatchcase(OPEN_DEMAND_NODE_TYPE, g) for g in r.node_types))
        if decides or demands:
            continue
        matched = sorted(n for n, (res, head) in node_types.items() if r.matches(n, res, head))
        if matched:
            out.append(f"{key}: every node type it matches ({', '.join(matched)}) is decided by an earlier rule: "
                       f"it never applies")
        else:
            out.append(f"{key} matches no node type ({', '.join(sorted(node_types))})"
                       + (" and no demand" if shape_open else "") + ": it never applies")
    return out
