"""The provider's Prometheus metrics: one registry per process, its collectors, and the HTTP endpoint on the head.

Ray's monitor exports its own `autoscaler_*` metrics from a `CollectorRegistry` private to its Monitor object (on
AUTOSCALER_METRIC_PORT, 44217); a provider object is never handed that registry, so ours has its own endpoint on the
head, `provider.metrics_port` (default 44218, next to Ray's), started once per process and only in the monitor.

Counters and histograms live for the process (Ray v1 may build a new provider object when the provider block
changes: they keep counting); the gauges (machines, hourly cost, unavailable offerings) are read at scrape time from
the current provider's view by `StateCollector`, so an autoscaler update pays nothing for them.

Label sets are bounded: node types (the config's, at most `max_open_node_types` generated ones), instance types,
zones and capacity types of the catalog, the cloud's error codes, and `result` from `RESULTS`.
"""
from __future__ import annotations

import logging
import threading
from typing import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

logger = logging.getLogger(__name__)

PREFIX = "ray_nodeless_"
DEFAULT_PORT = 44218
# launches_total's `result`: what a launch call ended in.
RESULTS = ("launched", "no_capacity", "cost_cap", "no_offering", "error")
LAUNCH_BUCKETS = (0.1, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600)
PLAN_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)


class Metrics:
    """Every collector the provider exports, in one registry."""

    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry(auto_describe=True)
        r = self.registry
        self.launches = Counter(PREFIX + "launches", "Launch calls by node type, capacity type and result.",
                                ["node_type", "capacity", "result"], registry=r)
        self.fallbacks = Counter(PREFIX + "launch_fallbacks", "Launches that succeeded on a later candidate after "
                                 "a capacity error.", ["node_type"], registry=r)
        self.capacity_errors = Counter(PREFIX + "capacity_errors", "Capacity errors by offering and cloud code.",
                                       ["instance_type", "zone", "capacity", "code"], registry=r)
        self.interruptions = Counter(PREFIX + "interruptions", "Machines that vanished without a terminate "
                                     "(spot reclaims), and interruption notices drained.", ["capacity", "source"],
                                     registry=r)
        self.cost_cap_refusals = Counter(PREFIX + "cost_cap_refusals", "Launches refused by "
                                         "provider.max_hourly_cost.", ["node_type"], registry=r)
        self.listing_errors = Counter(PREFIX + "listing_errors", "Machine listings that failed.", registry=r)
        self.launch_duration = Histogram(PREFIX + "launch_duration_seconds", "Launch call duration (plan, "
                                         "candidate walk, cloud calls).", ["result"], buckets=LAUNCH_BUCKETS,
                                         registry=r)
        self.plan_duration = Histogram(PREFIX + "plan_duration_seconds", "Planner call duration.",
                                       buckets=PLAN_BUCKETS, registry=r)
        self.state = StateCollector()
        r.register(self.state)

    def metric_names(self) -> list[str]:
        """Every series name this registry exposes, samples or not yet (counters with _total, histograms with
        _bucket/_sum/_count), as a query names them."""
        suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
        return sorted(fam.name + sfx for fam in self.registry.collect() for sfx in suffixes.get(fam.type, ("",)))


class StateCollector:
    """The gauges and the cost counter, computed at scrape time from the current provider (`set_source`)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._source: Callable[[], "StateSnapshot"] | None = None

    def set_source(self, source: Callable[[], "StateSnapshot"] | None) -> None:
        with self._lock:
            self._source = source

    def describe(self) -> Iterable:
        return list(self._families(None))

    def collect(self) -> Iterable:
        with self._lock:
            source = self._source
        snap = None
        if source is not None:
            try:
                snap = source()
            except Exception as e:     # a scrape must never break: the gauges are left out this once
                logger.warning("metrics: reading the provider's state failed: %s", e)
        return list(self._families(snap))

    @staticmethod
    def _families(snap: "StateSnapshot | None"):
        machines = GaugeMetricFamily(PREFIX + "machines", "Machines of the cluster listed now.",
                                     labels=["instance_type", "capacity", "zone"])
        cost = GaugeMetricFamily(PREFIX + "hourly_cost_dollars", "What the listed machines cost per hour (USD, "
                                 "their decision tags' prices; `ray-nodeless status`'s hourly cost).")
        total = CounterMetricFamily(PREFIX + "cost_dollars", "Cost of the listed machines accumulated over time "
                                    "(USD; continued across monitor restarts from the head's cost state).")
        unavailable = GaugeMetricFamily(PREFIX + "unavailable_offerings", "Offerings in the capacity memory "
                                        "(skipped while their capacity-error backoff runs or a probe of them is "
                                        "out).", labels=["capacity", "reason"])
        if snap is not None:
            for key, n in sorted(snap.machines.items()):
                machines.add_metric(list(key), n)
            cost.add_metric([], snap.hourly_cost)
            total.add_metric([], snap.cost_total)
            for capacity_reason, n in sorted(snap.unavailable.items()):
                unavailable.add_metric(list(capacity_reason), n)
        yield from (machines, cost, total, unavailable)


class StateSnapshot:
    __slots__ = ("machines", "hourly_cost", "cost_total", "unavailable")

    def __init__(self, machines: dict[tuple[str, str, str], int], hourly_cost: float, cost_total: float,
                 unavailable: dict[tuple[str, str], int]):
        self.machines = machines
        self.hourly_cost = hourly_cost
        self.cost_total = cost_total
        self.unavailable = unavailable


_process_lock = threading.Lock()
_process_metrics: Metrics | None = None
_server: tuple[str, int] | None = None


def process_metrics() -> Metrics:
    """The one Metrics of this process (every provider object of the monitor counts into it)."""
    global _process_metrics
    with _process_lock:
        if _process_metrics is None:
            _process_metrics = Metrics()
        return _process_metrics


def serve(metrics: Metrics, port: int, addr: str) -> tuple[str, int] | None:
    """Start the HTTP endpoint once per process; (addr, port) when it listens. A port in use is logged, not raised:
    metrics never stop the monitor."""
    global _server
    from prometheus_client import start_http_server

    with _process_lock:
        if _server is not None:
            return _server
        try:
            start_http_server(port, addr=addr, registry=metrics.registry)
        except OSError as e:
            logger.warning("metrics: cannot listen on %s:%d (%s); ray_nodeless metrics are not exported", addr,
                           port, e)
            return None
        _server = (addr, port)
        logger.info("metrics: ray_nodeless metrics on http://%s:%d/metrics", addr, port)
        return _server
