"""Cost-aware idle release: how long each worker node type may sit idle before Ray terminates it.

The rule (break-even, the ski-rental rule): **keep an idle machine while keeping it has cost less than relaunching
it would.** Keeping a machine idle for t seconds costs `price x t`. Releasing it costs nothing now, but if work for
it comes back, a new machine is billed for `launch_latency_s` (request -> Ray node ready: boot and `ray start`)
before it can run anything, plus any fixed cost of a relaunch (`relaunch_overhead_usd`: data staging, image pulls,
minimum billing increments). So the break-even idle time is

    idle_timeout_s = launch_latency_s + 3600 x relaunch_overhead_usd / price            (price in USD/hour)

Why this and not a longer or shorter timeout: whatever the next idle gap turns out to be, a machine released at
the break-even costs at most twice what the best choice in hindsight would have cost (the classic ski-rental
bound), while a fixed cluster-wide timeout is arbitrary per machine: five minutes of an idle $32/h 8-GPU machine
and of an idle $0.10/h spot machine are the same timeout and very different money. With no fixed relaunch cost
the price cancels out and every type waits one launch latency; with one, cheap machines (spot, small types) are
kept longer because their idle time is cheap next to the fixed cost, expensive ones are let go sooner.

Precedence for a node type (first that applies): its own `idle_timeout_s` in the cluster YAML (Ray's key; the
user's choice always wins); the break-even above, when `provider.cost_aware_idle` is on (the default) and the
chosen offering's price is known, **capped at Ray's cluster-wide `idle_timeout_minutes`** (the longest idle the
user has said they will pay for: the break-even may release sooner, never later; a demo's 15-s timeout stays 15 s);
else `idle_timeout_minutes` itself. The head is never released.

Where it takes effect: Ray's autoscaler v2 reads `available_node_types.<t>.idle_timeout_s` (NodeTypeConfig; the
scheduler's idle termination overrides the cluster-wide timeout per type), so `bootstrap_config` writes the value
into every worker type that has none, and shape-open generated types get it too (launch/open_types.py). Ray's v1
`StandardAutoscaler` has one timeout, `idle_timeout_minutes`, and ignores the per-type key: under v1 the
cluster-wide timeout applies (`ray-nodeless plan` says which is used). Pure: no I/O, no Ray import.
"""
from __future__ import annotations

from dataclasses import dataclass
from ray_nodeless.core.documents import Document, DocumentView

DEFAULT_LAUNCH_LATENCY_S = 180.0     # request -> Ray node ready; the replay's default launch latency too
SOURCE_NODE_TYPE = "node type"       # the YAML's own available_node_types.<t>.idle_timeout_s
SOURCE_BREAK_EVEN = "break-even"
SOURCE_CLUSTER = "idle_timeout_minutes"


@dataclass(frozen=True)
class IdleTimeout:
    seconds: float | None        # None: never (no per-type value and no idle_timeout_minutes)
    source: str

    def to_dict(self) -> Document:
        return {"idle_timeout_s": None if self.seconds is None else round(self.seconds, 3),
                "idle_timeout_source": self.source}


def break_even_s(hourly_price: float | None, launch_latency_s: float, relaunch_overhead_usd: float) -> float | None:
    """The break-even idle time of a machine at `hourly_price` (None when the price is unknown or zero and a fixed
    relaunch cost would make the division meaningless: the cluster-wide timeout applies then)."""
    if relaunch_overhead_usd <= 0:
        return float(launch_latency_s)
    if not hourly_price or hourly_price <= 0:
        return None
    return float(launch_latency_s) + 3600.0 * relaunch_overhead_usd / hourly_price


def cluster_idle_s(cluster_config: DocumentView) -> float | None:
    """Ray's cluster-wide `idle_timeout_minutes` in seconds (None when the YAML has none: under v2, never)."""
    v = cluster_config.get("idle_timeout_minutes")
    if v is None or isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v) * 60.0


def capped_break_even_s(hourly_price: float | None, launch_latency_s: float, relaunch_overhead_usd: float,
                        cluster_s: float | None) -> float | None:
    """The break-even when it is shorter than the cluster-wide timeout (None: the cluster-wide one applies)."""
    s = break_even_s(hourly_price, launch_latency_s, relaunch_overhead_usd)
    if s is None or (cluster_s is not None and s >= cluster_s):
        return None
    return s


def idle_timeout(node_type: DocumentView, hourly_price: float | None, *, cost_aware: bool,
                 launch_latency_s: float, relaunch_overhead_usd: float, cluster_s: float | None) -> IdleTimeout:
    """One worker node type's idle timeout and where it comes from (the precedence in the module docstring)."""
    own = node_type.get("idle_timeout_s")
    if own is not None and not isinstance(own, bool) and isinstance(own, (int, float)):
        return IdleTimeout(float(own), SOURCE_NODE_TYPE)
    if cost_aware:
        s = capped_break_even_s(hourly_price, launch_latency_s, relaunch_overhead_usd, cluster_s)
        if s is not None:
            return IdleTimeout(s, SOURCE_BREAK_EVEN)
    return IdleTimeout(cluster_s, SOURCE_CLUSTER)
