"""On-demand -> spot reversion: its settings (`provider.reversion`) and the interruption history that turns it off
for a node type that keeps being preempted. Pure: the launch layer (launch/reversion.py) acts on them.

    provider:
      reversion:
        enabled: true                # replace on-demand fallbacks with spot when spot is back
        min_age_s: 600               # a fallback runs this long first (Anyscale waits 60 min by default)
        interval_s: 60               # how often the provider looks for fallbacks to replace
        max_in_flight: 1             # replacements under way at once (a spot launched, its on-demand not gone)
        ready_timeout_s: 900         # a replacement whose spot node has not joined Ray by then is ended
        drain_patience_s: 3600       # a fallback Ray keeps refusing to drain (busy) is kept after this long
        interruption_limit: 3        # this many spot interruptions of a node type ...
        interruption_window_s: 3600  # ... within this window ...
        prefer_on_demand_s: 3600     # ... and the type launches on-demand first (and is not reverted) this long
"""
from __future__ import annotations

import threading
from collections import defaultdict, deque

from pydantic import ConfigDict, Field

from ray_nodeless.core.schema import Section


class ReversionSettings(Section):
    # A nested block of our own: a key it does not declare is a mistake (Section ignores them for the shared block).
    model_config = ConfigDict(**{**Section.model_config, "extra": "forbid"})

    enabled: bool = True
    min_age_s: float = Field(600.0, ge=0)
    interval_s: float = Field(60.0, ge=0)
    max_in_flight: int = Field(1, ge=1)
    ready_timeout_s: float = Field(900.0, gt=0)
    drain_patience_s: float = Field(3600.0, gt=0)
    interruption_limit: int = Field(3, ge=1)
    interruption_window_s: float = Field(3600.0, gt=0)
    prefer_on_demand_s: float = Field(3600.0, ge=0)

    def describe(self) -> str:
        """One line for `ray-nodeless plan`."""
        if not self.enabled:
            return "reversion: off"
        # Every key with the value in force (defaults included), named as in the YAML.
        values = ", ".join(f"{k}={v:g}" + (" s" if k.endswith("_s") else "")
                           for k, v in self.model_dump().items() if k != "enabled")
        return (f"reversion: on-demand fallbacks go back to spot when it returns, spot machine first, then the "
                f"on-demand one drained idle ({values})")


class InterruptionHistory:
    """Spot interruptions per node type; `prefers_on_demand` after `interruption_limit` within the window, for
    `prefer_on_demand_s` from the last one that reached the limit (ray#39861)."""

    def __init__(self, settings: ReversionSettings):
        self.settings = settings
        self._times: dict[str, deque[float]] = defaultdict(deque)
        self._until: dict[str, float] = {}
        self._lock = threading.Lock()

    def record(self, node_type: str, now: float) -> bool:
        """One interruption of `node_type` at `now`; True when it (re)starts the on-demand preference."""
        s = self.settings
        with self._lock:
            q = self._times[node_type]
            q.append(now)
            while q and q[0] < now - s.interruption_window_s:
                q.popleft()
            if len(q) >= s.interruption_limit:
                self._until[node_type] = now + s.prefer_on_demand_s
                return True
            return False

    def prefers_on_demand(self, node_type: str, now: float) -> bool:
        with self._lock:
            return self._until.get(node_type, float("-inf")) > now
