"""What `ray-nodeless convert` prints: per node type the instance before (Ray's own provider) and after
(ray_nodeless) with the hourly price of each, the idle and ceiling cost before and after, and the notes; or, with
`--json`, one document with exactly `node_types` (name -> `before` / `after`, each `instance_type`, `capacity`,
`hourly_price`) and `summary` (`idle_cost_per_hour_before/after`, `ceiling_cost_per_hour_before/after`).
A price the catalog does not know is `unknown` (null in JSON); a cost figure that depends on one is too.
"""
from __future__ import annotations

import json

from ray_nodeless.swapin.convert import Conversion, Side


def _price(p: float | None) -> str:
    return "unknown" if p is None else f"${p:.4f}/h"


def _side(s: Side) -> str:
    if s.instance_type is None:
        return "(no instance type)"
    return f"{s.instance_type} {s.capacity} {_price(s.hourly_price)}"


def table(conv: Conversion, output: str | None) -> str:
    where = output or "stdout"
    lines = [f"converted {conv.source} (Ray type: {conv.cloud}, {conv.region}) -> {where} "
             f"(type: external, cloud: {conv.cloud}); Ray {conv.ray_version}'s {conv.cloud} defaults merged"
             + ("" if conv.comments_kept else "; comments not kept")]
    rows = [("node type", "role", "before (Ray's provider)", "after (ray_nodeless)")]
    for name in sorted(conv.node_types, key=lambda n: (not conv.node_types[n].is_head, n)):
        c = conv.node_types[name]
        role = "head" if c.is_head else f"workers {c.min_workers}..{c.max_workers}"
        after = _side(c.after) + ("  [freed]" if c.freed else "")
        rows.append((name, role, _side(c.before), after))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    for r in rows:
        lines.append("  ".join(r[i].ljust(widths[i]) for i in range(3)) + "  " + r[3])
    s = conv.summary
    lines.append(f"idle cost:    {_price(s['idle_cost_per_hour_before'])} -> {_price(s['idle_cost_per_hour_after'])}"
                 " (head + min_workers)")
    lines.append(f"ceiling cost: {_price(s['ceiling_cost_per_hour_before'])} -> "
                 f"{_price(s['ceiling_cost_per_hour_after'])} (at max_workers)")
    if conv.notes:
        lines.append("notes:")
        lines += [f"  - {n}" for n in conv.notes]
    return "\n".join(lines)


def json_text(conv: Conversion) -> str:
    return json.dumps(conv.to_dict(), indent=2, sort_keys=True)
