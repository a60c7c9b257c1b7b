"""Text shared by several commands' human-readable output."""
from __future__ import annotations


def price(p: float | None) -> str:
    """An hourly price as the commands print it; `unknown` where the catalog has none."""
    return "unknown" if p is None else f"${p:.4f}/h"
