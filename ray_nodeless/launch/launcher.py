"""The ordered-candidate launcher: plan -> candidates in the documented total order -> the first one the backend
accepts. A capacity error marks that offering unavailable (`core/availability.py`) and the walk moves on in the
same call; only when every candidate fails does the launch fail, with the cloud's category.

No Ray here: the Ray adapter translates Ray's call into `launch(...)` and `LaunchError` into Ray's exception.
"""
from __future__ import annotations

import copy
import hashlib
import logging
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable

from cachetools import TTLCache

from ray_nodeless.core import ttls
from ray_nodeless.core.availability import UnavailableOfferings
from ray_nodeless.core.catalog import Catalog, Offering
from ray_nodeless.core.demand import offering_labels
from ray_nodeless.core.node_resources import instance_resources
from ray_nodeless.core.planner import Plan, Planner
from ray_nodeless.core.requirements import split_node_config
from ray_nodeless.core.settings import Resolver
from ray_nodeless.errors import (
    BackendError, CapacityError, CapacityScope, ConfigError, LaunchError, NoFeasibleOffering, TransientBackendError,
)
from ray_nodeless.launch.catalog import PlanningCatalog
from ray_nodeless.providers.base import (
    TAG_CAPACITY, TAG_CATALOG, TAG_CLUSTER, TAG_INSTANCE_TYPE, TAG_PRICE, TAG_RULE, TAG_ZONE, LaunchSpec,
    MachineBackend,
)
from ray_nodeless.registrations.base import Registration

logger = logging.getLogger(__name__)


def request_token(cluster: str, launch_request: str, node_type: str, batch: int, offering: Offering,
                  count: int) -> str:
    """A deterministic idempotency key per (launch request, node type, batch, offering): every batch Ray v2 sends
    under one request id gets its own machines, a retry of the same batch and offering reuses the key (the cloud
    returns the same machines), a fallback to the next offering gets a new one. 32 hex chars fit both EC2's
    ClientToken (<= 64) and GCE's requestId (a UUID)."""
    text = f"{cluster}|{launch_request}|{node_type}|{batch}|{'|'.join(offering.key)}|{count}"
    return str(uuid.UUID(hashlib.sha256(text.encode()).hexdigest()[:32]))


def decision_tags(cluster: str, catalog_id: str, offering: Offering, rule: str) -> dict[str, str]:
    """The tags that record a launch decision on the machine (the state rebuilt after a restart)."""
    return {
        TAG_CLUSTER: cluster,
        TAG_INSTANCE_TYPE: offering.instance_type.name,
        TAG_ZONE: offering.zone,
        TAG_CAPACITY: offering.capacity,
        TAG_PRICE: f"{offering.hourly_price:.6f}" if offering.hourly_price is not None else "unknown",
        TAG_RULE: rule,
        TAG_CATALOG: catalog_id,
    }


@dataclass(frozen=True)
class Launched:
    offering: Offering
    machine_ids: list[str]
    spec: LaunchSpec


class Launcher:
    def __init__(self, cluster_name: str, catalog: PlanningCatalog, resolver: Resolver,
                 backend: MachineBackend, registration: Registration, unavailable: UnavailableOfferings,
                 terminate: Callable[[list[str]], None], hourly_cost: Callable[[], float] = lambda: 0.0,
                 clock: Callable[[], float] = time.monotonic):
        self.cluster_name = cluster_name
        self.settings = resolver.settings
        self._hourly_cost = hourly_cost    # what the cluster's live machines cost now, USD per hour
        self._clock = clock
        self._batches: TTLCache = TTLCache(maxsize=100_000, ttl=ttls.REQUEST_MEMORY_S)
        self._batches_lock = threading.Lock()
        self._catalog = catalog          # loaded at the first plan: listing and terminating never need it
        self.resolver = resolver
        self.backend = backend
        self.registration = registration
        self.unavailable = unavailable
        self._terminate = terminate     # ends machines whose registration failed, through the provider's path

    @property
    def catalog(self) -> Catalog:
        return self._catalog.catalog

    @property
    def planner(self) -> Planner:
        return self._catalog.planner

    def plan(self, node_type: str, resources: dict[str, Any], node_config: dict[str, Any] | None,
             is_head: bool) -> Plan:
        try:
            return self.planner.plan(self.resolver.request(node_type, resources, node_config, is_head))
        except (ConfigError, NoFeasibleOffering) as e:
            raise LaunchError(str(e), type(e).__name__) from e

    def launch(self, node_type: str, node_config: dict[str, Any] | None, ray_tags: dict[str, str], count: int,
               resources: dict[str, float], labels: dict[str, str], is_head: bool,
               launch_request: str | None = None) -> Launched:
        plan = self.plan(node_type, resources, node_config, is_head)
        _, backend_config = split_node_config(node_config or {})
        launch_request = launch_request or uuid.uuid4().hex
        batch = self._next_batch(launch_request, node_type)
        started = self._clock()
        failures: list[str] = []
        skipped = over_budget = capped = 0
        tried: dict[str, int] = {}      # capacity type -> candidates tried
        last_category = "NoCapacity"
        for offering in plan.candidates():
            if self.unavailable.reason(offering) is not None:
                skipped += 1
                continue
            elapsed = self._clock() - started
            if elapsed > self.settings.launch_timeout_s:
                last_category = "LaunchTimeout"
                failures.append(f"stopped after {elapsed:.0f} s (launch_timeout_s)")
                break
            if tried.get(offering.capacity, 0) >= self.settings.max_candidates_per_launch:
                # This capacity type has had its share: go on to the next one (spot -> on-demand) rather than
                # walk every remaining spot offering in a drought.
                capped += 1
                continue
            if self._exceeds_budget(offering, count):
                over_budget += 1
                continue
            tags = dict(ray_tags)
            tags.update(decision_tags(self.cluster_name, self.catalog.catalog_id, offering, plan.request.rule))
            spec = LaunchSpec(
                cluster_name=self.cluster_name, node_type=node_type, offering=offering, count=count, tags=tags,
                node_config=copy.deepcopy(backend_config),
                request_token=request_token(self.cluster_name, launch_request, node_type, batch, offering, count),
                resources=instance_resources(offering.instance_type, resources),
                # Ray's default labels say what the machine really is (market type, zone, region, GPU model),
                # whatever the node type declared: a label we report is true.
                labels={**dict(labels or {}), **offering_labels(offering)},
                is_head=is_head,
            )
            spec = self.registration.prepare(spec)
            try:
                ids = self._launch_once(spec)
            except CapacityError as e:
                tried[offering.capacity] = tried.get(offering.capacity, 0) + 1
                self._mark_unavailable(plan, offering, e)
                failures.append(f"{offering.instance_type.name}/{offering.zone}/{offering.capacity}: {e.category}")
                last_category = e.category
                logger.warning("%s: %s %s %s unavailable (%s); trying the next candidate", node_type,
                               offering.instance_type.name, offering.zone, offering.capacity, e.category)
                continue
            except BackendError as e:   # throttling that outlasted retries, auth, bad request: not a capacity miss
                raise LaunchError(f"{node_type}: {e}", e.category) from e
            try:
                self.registration.after_launch(spec, ids)
            except BackendError as e:
                # The machines exist but could not join: terminate them rather than leak them.
                logger.error("%s: registration failed for %s (%s); terminating them", node_type, ids, e)
                self._terminate(ids)
                raise LaunchError(f"{node_type}: {e}", e.category) from e
            logger.info(
                "launched %d x %s for node type %s %s in %s (%s, $%.4f/h) by rule %r; %d candidates, "
                "%d failed, %d skipped as recently unavailable; catalog %s; ids %s",
                len(ids), offering.instance_type.name, node_type, plan.request.shape.describe(), offering.zone,
                offering.capacity, offering.hourly_price or 0.0, plan.request.rule, len(plan), len(failures),
                skipped, self.catalog.catalog_id, ",".join(ids))
            return Launched(offering=offering, machine_ids=list(ids), spec=spec)
        if over_budget and not failures:
            desc = (f"{node_type}: refused: {count} more machine(s) would take the cluster over "
                    f"provider.max_hourly_cost = ${self.settings.max_hourly_cost:.4f}/h (now "
                    f"${self._hourly_cost():.4f}/h; cheapest allowed candidate ${self._cheapest(plan):.4f}/h each)")
            logger.warning(desc)
            raise LaunchError(desc, "MaxHourlyCostExceeded")
        desc = (f"{node_type}: every candidate failed for capacity ({len(failures)} tried, {skipped} skipped as "
                f"recently unavailable, {capped} beyond max_candidates_per_launch, {over_budget} over "
                f"max_hourly_cost): " + "; ".join(failures[:10]))
        logger.error(desc)
        raise LaunchError(desc, last_category)

    def _launch_once(self, spec: LaunchSpec) -> list[str]:
        """backend.launch, retried with the same request token when the outcome is unknown (a lost response,
        throttling that outlasted the backend's own retries): the token makes the cloud answer a retry with the
        machines it already created, so a retry never doubles a launch."""
        for attempt in range(ttls.TRANSIENT_LAUNCH_RETRIES + 1):
            try:
                return self.backend.launch(spec)
            except TransientBackendError as e:
                if attempt == ttls.TRANSIENT_LAUNCH_RETRIES:
                    raise
                logger.warning("%s: launch outcome unknown (%s); retrying with the same request token",
                               spec.node_type, e)
                time.sleep(self.settings.launch_retry_backoff_s * (2 ** attempt))
        raise AssertionError("unreachable")

    def _next_batch(self, launch_request: str, node_type: str) -> int:
        """The batch number of this call within (launch request, node type): 0, 1, 2, ... in call order."""
        with self._batches_lock:
            n = self._batches.get((launch_request, node_type), 0)
            self._batches[(launch_request, node_type)] = n + 1
            return n

    def _exceeds_budget(self, offering: Offering, count: int) -> bool:
        cap = self.settings.max_hourly_cost
        if cap is None:
            return False
        return self._hourly_cost() + (offering.hourly_price or 0.0) * count > cap + 1e-9

    def _cheapest(self, plan: Plan) -> float:
        return min((o.hourly_price or 0.0 for o in plan.candidates()), default=0.0)

    def _mark_unavailable(self, plan: Plan, offering: Offering, e: CapacityError) -> None:
        self.unavailable.mark(offering, e.category)
        if e.scope is CapacityScope.REGION:
            # A regional limit: the same type and capacity type fails in every zone of the region.
            for other in plan.candidates():
                if (other.instance_type.name, other.capacity) == (offering.instance_type.name, offering.capacity):
                    self.unavailable.mark(other, e.category)

    def on_interrupted(self, tags: dict[str, str], machine_id: str) -> None:
        """A machine vanished without a terminate from us: if it was spot, skip its offering for a while."""
        offering = self._offering_of(tags)
        if offering is not None and offering.capacity == "spot":
            self.unavailable.mark(offering, "interrupted")
        logger.warning("machine %s (%s %s %s) disappeared without being terminated by the autoscaler: "
                       "treating it as preempted", machine_id, tags.get(TAG_INSTANCE_TYPE), tags.get(TAG_ZONE),
                       tags.get(TAG_CAPACITY))

    def _offering_of(self, tags: dict[str, str]) -> Offering | None:
        try:
            return self.catalog.region(self.resolver.settings.price_cloud, self.resolver.settings.region).find(
                tags.get(TAG_INSTANCE_TYPE, ""), tags.get(TAG_ZONE, ""), tags.get(TAG_CAPACITY, ""))
        except Exception:   # a machine from another catalog or region: nothing to mark
            return None
