"""The subset of GCE's list filter syntax the fake understands (`labels.k = "v"`, `status != X`, `name eq re`)."""
from __future__ import annotations

import re
from typing import Any

from ray_nodeless.testing.fake_gce.schema import ApiError

_FILTER_TERM = re.compile(
    r"""\(?\s*(?P<field>[A-Za-z][\w.\-]*)\s*(?P<op>!=|=|:|\beq\b|\bne\b)\s*(?P<value>"[^"]*"|[^\s()"]+)\s*\)?""")


def parse_filter(expr: str) -> list[tuple[str, str, str]]:
    """GCE list filter subset: `field = value`, `field != value`, `labels.k = "v"`, `labels.k=v`, `field eq regex`,
    joined by whitespace or AND. Anything else answers 400, like GCE's "Invalid list filter expression"."""
    terms: list[tuple[str, str, str]] = []
    rest = expr.strip()
    while rest:
        m = _FILTER_TERM.match(rest)
        if not m:
            raise ApiError(400, f"Invalid list filter expression '{expr}'.")
        value = m.group("value")
        if value.startswith('"'):
            value = value[1:-1]
        terms.append((m.group("field"), m.group("op"), value))
        rest = rest[m.end():].strip()
        if rest.upper().startswith("AND "):
            rest = rest[4:].strip()
    return terms


def _field_value(obj: dict, path: str) -> Any:
    cur: Any = obj
    for part in path.split("."):
        if not isinstance(cur, dict):
            return None
        cur = cur.get(part)
    return cur


def filter_match(obj: dict, terms: list[tuple[str, str, str]]) -> bool:
    for fld, op, value in terms:
        actual = _field_value(obj, fld)
        actual_s = None if actual is None else str(actual)
        if op == "=":
            # `=` is exact with `*` as a wildcard
            ok = actual_s is not None and re.fullmatch(re.escape(value).replace(r"\*", ".*"), actual_s) is not None
        elif op == "!=":
            ok = actual_s is None or re.fullmatch(re.escape(value).replace(r"\*", ".*"), actual_s) is None
        elif op == ":":
            ok = actual_s is not None and (value == "*" or actual_s == value)
        elif op == "eq":
            ok = actual_s is not None and re.fullmatch(value, actual_s) is not None
        else:  # ne
            ok = actual_s is None or re.fullmatch(value, actual_s) is None
        if not ok:
            return False
    return True
