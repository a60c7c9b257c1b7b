"""What `ray-nodeless convert` prints: per node type the instance before (Ray's own provider) and after
(ray_nodeless) with the hourly price of each, the idle and ceiling cost before and after, and the notes; or, with
`--json`, one document with exactly `node_types` (name -> `before` / `after`, each `instance_type`, `capacity`,
`hourly_price`) and `summary` (`idle_cost_per_hour_before/after`, `ceiling_cost_per_hour_before/after`).
A price the catalog does not know is `unknown` (null in JSON); a cost figure that depends on one is too.
`cost_table` is the one shape of that report: `ray-nodeless convert` of a KubeRay manifest (kuberay_convert.py
`table`) prints it too.
"""
from __future__ import annotations

import json
from typing import Mapping, Sequence

from ray_nodeless.swapin.convert import Conversion, NodeTypeChange, Side


def _price(p: float | None) -> str:
    return "unknown" if p is None else f"${p:.4f}/h"


def _side(s: Side) -> str:
    if s.instance_type is None:
        return "(no instance type)"
    return f"{s.instance_type} {s.capacity} {_price(s.hourly_price)}"


def cost_table(title: str, before_heading: str, node_types: Mapping[str, NodeTypeChange],
               summary: Mapping[str, float | None], notes: Sequence[str], *, idle_scope: str, ceiling_scope: str,
               not_pinned: str = "(no instance type)", first_rows: Sequence[tuple[str, str, str, str]] = ()) -> str:
    """The before/after report of any conversion (a Ray YAML's here, a KubeRay manifest's in kuberay_convert.py):
    `title`, one row per node type (head first; `first_rows` before them), the idle and ceiling cost over
    `idle_scope` / `ceiling_scope`, the notes. `not_pinned`: the before of a node type that names no instance type."""
    lines = [title]
    rows = [("node type", "role", before_heading, "after (ray_nodeless)"), *first_rows]
    for name in sorted(node_types, key=lambda n: (not node_types[n].is_head, n)):
        c = node_types[name]
        role = "head" if c.is_head else f"workers {c.min_workers}..{c.max_workers}"
        before = _side(c.before) if c.before.instance_type else not_pinned
        after = _side(c.after) + ("  [freed]" if c.freed else "")
        rows.append((name, role, before, after))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    for r in rows:
        lines.append("  ".join(r[i].ljust(widths[i]) for i in range(3)) + "  " + r[3])
    lines.append(f"idle cost:    {_price(summary['idle_cost_per_hour_before'])} -> "
                 f"{_price(summary['idle_cost_per_hour_after'])} ({idle_scope})")
    lines.append(f"ceiling cost: {_price(summary['ceiling_cost_per_hour_before'])} -> "
                 f"{_price(summary['ceiling_cost_per_hour_after'])} ({ceiling_scope})")
    if notes:
        lines.append("notes:")
        lines += [f"  - {n}" for n in notes]
    return "\n".join(lines)


def table(conv: Conversion, output: str | None) -> str:
    title = (f"converted {conv.source} (Ray type: {conv.cloud}, {conv.region}) -> {output or 'stdout'} "
             f"(type: external, cloud: {conv.cloud}); Ray {conv.ray_version}'s {conv.cloud} defaults merged"
             + ("" if conv.comments_kept else "; comments not kept"))
    return cost_table(title, "before (Ray's provider)", conv.node_types, conv.summary, conv.notes,
                      idle_scope="head + min_workers", ceiling_scope="at max_workers")


def json_text(conv: Conversion) -> str:
    return json.dumps(conv.to_dict(), indent=2, sort_keys=True)
