"""`NodelessProvider`: the thin adapter between Ray's autoscaler (v1 and v2) and the planner + a machine backend.

What Ray calls, and what happens (see the README's "How it works"):
- `bootstrap_config` (on `ray up`): validates the provider block and plans every node type, so a bad key or an
  infeasible shape fails `ray up` before anything launches; records each node type's resources in the provider
  block so the head (created by `create_node`, which gets no resources) is planned on its real shape.
- `create_node_with_resources_and_labels` / `create_node`: plan -> ordered candidates -> launch the first one the
  backend accepts; a capacity error marks that offering unavailable for `unavailable_ttl_s` and moves on. Only
  when every candidate fails does it raise `NodeLaunchException`, so v2 demotes the node type.
- `non_terminated_nodes` refreshes one shared listing at most every `list_cache_s`; `node_tags`, `is_running`,
  `is_terminated`, `internal_ip`, `external_ip` read that listing. None of them raises on a transient backend
  error or a vanished node (they answer from the last good listing). No lock is held across a backend call.
"""
from __future__ import annotations

import copy
import hashlib
import logging
import threading
import time
import uuid
from collections import OrderedDict
from typing import Any, Iterable

from ray.autoscaler.node_launch_exception import NodeLaunchException
from ray.autoscaler.node_provider import NodeProvider
from ray.autoscaler.tags import TAG_RAY_LAUNCH_REQUEST, TAG_RAY_NODE_KIND, TAG_RAY_USER_NODE_TYPE, NODE_KIND_HEAD

from ray_nodeless.core.availability import UnavailableOfferings
from ray_nodeless.core.catalog import Catalog, InstanceType, Offering
from ray_nodeless.core.cluster_plan import load_catalog, plan_cluster, planner_for
from ray_nodeless.core.settings import Resolver, parse_provider
from ray_nodeless.errors import BackendError, CapacityError, ConfigError, NoFeasibleOffering
from ray_nodeless.providers import backend_class, make_backend
from ray_nodeless.registrations import make_registration
from ray_nodeless.registrations.boot_script import BOOT_KEY, worker_boot_script
from ray_nodeless.providers.base import (
    MACHINE_RUNNING, TAG_CAPACITY, TAG_CATALOG, TAG_CLUSTER, TAG_INSTANCE_TYPE, TAG_PRICE, TAG_RULE, TAG_ZONE,
    LaunchSpec, Machine,
)
from ray_nodeless.core.requirements import GIB, split_node_config

logger = logging.getLogger(__name__)

NODE_TYPE_RESOURCES_KEY = "node_type_resources"   # filled by bootstrap_config
LAST_KNOWN_LIMIT = 10_000
# Fraction of an instance's memory Ray offers to tasks (the rest is object store and the OS), as Ray's AWS
# provider computes it when it autofills resources.
TASK_MEMORY_FRACTION = 0.7


def instance_resources(t: InstanceType, declared: dict[str, Any] | None) -> dict[str, float]:
    """The Ray resources a machine of type `t` advertises: its CPUs, GPUs and memory, plus declared custom ones."""
    out: dict[str, float] = {k: float(v) for k, v in sorted((declared or {}).items())
                             if k not in ("CPU", "GPU", "memory")}
    out["CPU"] = float(t.vcpus)
    if t.gpu_count:
        out["GPU"] = float(t.gpu_count)
        out.setdefault(f"accelerator_type:{t.gpu_model}", 1.0)
    out["memory"] = float(int(t.memory_gib * GIB * TASK_MEMORY_FRACTION))
    return out


def _request_token(cluster: str, launch_request: str, offering: Offering, count: int) -> str:
    """A deterministic idempotency key per (launch request, offering): a retried call reuses it, a fallback to
    the next offering gets a new one. 32 hex chars fit both EC2's ClientToken (<=64) and GCE's requestId (UUID)."""
    digest = hashlib.sha256(f"{cluster}|{launch_request}|{'|'.join(offering.key)}|{count}".encode()).hexdigest()
    return str(uuid.UUID(digest[:32]))


class NodelessProvider(NodeProvider):
    """Ray NodeProvider: cheapest-fit instances under ordered rules, on a pluggable machine backend."""

    def __init__(self, provider_config: dict[str, Any], cluster_name: str):
        super().__init__(provider_config, cluster_name)
        self.settings = parse_provider(provider_config)
        self.catalog: Catalog = self._load_catalog()
        self.planner = planner_for(self.catalog)
        self.backend = make_backend(self.settings.cloud, provider_config, cluster_name)
        self.registration = make_registration(self.settings.registration, provider_config, cluster_name)
        self.resolver = Resolver(self.settings, lambda nc: type(self.backend).requirement_overrides(provider_config, nc))
        self.unavailable = UnavailableOfferings(self.settings.unavailable_ttl_s)
        self._node_type_resources: dict[str, dict] = dict(provider_config.get(NODE_TYPE_RESOURCES_KEY) or {})
        self._lock = threading.Lock()            # guards the fields below; never held across a backend call
        self._refresh_lock = threading.Lock()    # one listing at a time
        self._machines: dict[str, Machine] = {}
        # Machines that left the listing, so node_tags/internal_ip of a vanished node still answer (Ray asks after
        # the fact). Bounded: the oldest are forgotten first.
        self._last_known: OrderedDict[str, Machine] = OrderedDict()
        self._listed_at = -1.0e9
        self._terminating: set[str] = set()
        # Workers on a cloud with node updaters disabled start Ray from their own boot script (see boot_script.py).
        self._boots_itself = bool(provider_config.get("disable_node_updaters")) and \
            self.settings.cloud in ("aws", "gcp") and self.settings.registration == "vm"
        self._gcs_port = int(str(provider_config.get("gcs_address", ":6379")).rsplit(":", 1)[1])

    def _load_catalog(self) -> Catalog:
        if self.settings.catalog != "live":
            return load_catalog(self.settings.catalog)
        try:
            if self.settings.price_cloud == "aws":
                from ray_nodeless.providers.aws.catalog import refresh_aws_catalog
                return refresh_aws_catalog(self.settings.region,
                                           session_kwargs=self.provider_config.get("aws_credentials"),
                                           endpoint_url=self.provider_config.get("endpoint_url"))
            from ray_nodeless.providers.gcp.catalog import refresh_gcp_catalog
            return refresh_gcp_catalog(self.settings.region, self.provider_config.get("project_id", ""),
                                       api_endpoint=self.provider_config.get("api_endpoint"),
                                       credentials=self.provider_config.get("credentials"))
        except Exception as e:  # a live catalog is an optimisation: never fail the cluster for it
            logger.warning("live catalog unavailable (%s); using the embedded catalog", e)
            return load_catalog("embedded")

    # ----- listing ---------------------------------------------------------------------------------------------

    def _refresh(self, force: bool = False) -> dict[str, Machine]:
        with self._lock:
            fresh = time.monotonic() - self._listed_at < self.settings.list_cache_s
            if fresh and not force:
                return self._machines
        if not self._refresh_lock.acquire(blocking=False):
            # Another thread is listing right now: answer from the last listing rather than queue behind it.
            with self._lock:
                return self._machines
        try:
            try:
                listed = self.backend.list_machines()
            except BackendError as e:   # TransientBackendError included
                logger.warning("listing machines failed (%s); answering from the last listing", e)
                with self._lock:
                    return self._machines
            machines = {}
            for m in listed:
                if m.tags.get(TAG_CLUSTER) != self.cluster_name:
                    continue   # a backend bug must not make us adopt another cluster's machine
                machines[m.id] = self.registration.describe(m)
            with self._lock:
                vanished = [mid for mid in self._machines if mid not in machines]
                interrupted = [mid for mid in vanished if mid not in self._terminating]
                self._terminating -= set(vanished)
                for mid in vanished:
                    self._remember(mid, self._machines[mid])
                self._machines = machines
                self._listed_at = time.monotonic()
            for mid in interrupted:
                self._on_interrupted(mid)
            return machines
        finally:
            self._refresh_lock.release()

    def _remember(self, machine_id: str, machine: Machine) -> None:
        """Keep a vanished machine's last listing (caller holds self._lock)."""
        self._last_known[machine_id] = machine
        self._last_known.move_to_end(machine_id)
        while len(self._last_known) > LAST_KNOWN_LIMIT:
            self._last_known.popitem(last=False)

    def _on_interrupted(self, machine_id: str) -> None:
        m = self._last_known.get(machine_id)
        tags = m.tags if m else {}
        offering = self._offering_of(tags)
        if offering is not None and offering.capacity == "spot":
            self.unavailable.mark(offering, "interrupted")
        logger.warning("machine %s (%s %s %s) disappeared without being terminated by the autoscaler: "
                       "treating it as preempted", machine_id, tags.get(TAG_INSTANCE_TYPE), tags.get(TAG_ZONE),
                       tags.get(TAG_CAPACITY))
        # Whatever the registration keeps for it (a local player process, a Kubernetes Node) goes with it.
        try:
            self.registration.after_terminate([machine_id])
        except Exception as e:  # never let clean-up of a vanished machine break the listing
            logger.warning("clean-up after vanished machine %s failed: %s", machine_id, e)

    def _offering_of(self, tags: dict[str, str]) -> Offering | None:
        try:
            return self.catalog.region(self.settings.price_cloud, self.settings.region).find(
                tags.get(TAG_INSTANCE_TYPE, ""), tags.get(TAG_ZONE, ""), tags.get(TAG_CAPACITY, ""))
        except Exception:
            return None

    def _known(self, node_id: str) -> Machine | None:
        with self._lock:
            return self._machines.get(node_id) or self._last_known.get(node_id)

    def non_terminated_nodes(self, tag_filters: dict[str, str]) -> list[str]:
        machines = self._refresh()
        return sorted(mid for mid, m in machines.items()
                      if all(m.tags.get(k) == v for k, v in tag_filters.items()))

    def is_running(self, node_id: str) -> bool:
        with self._lock:
            m = self._machines.get(node_id)
        return m is not None and m.state == MACHINE_RUNNING

    def is_terminated(self, node_id: str) -> bool:
        with self._lock:
            return node_id not in self._machines

    def node_tags(self, node_id: str) -> dict[str, str]:
        m = self._known(node_id)
        return dict(m.tags) if m else {}

    def internal_ip(self, node_id: str) -> str | None:
        m = self._known(node_id)
        return m.internal_ip if m else None

    def external_ip(self, node_id: str) -> str | None:
        m = self._known(node_id)
        return (m.external_ip or m.internal_ip) if m else None

    def set_node_tags(self, node_id: str, tags: dict[str, str]) -> None:
        with self._lock:
            m = self._machines.get(node_id)
            if m is not None:
                m.tags.update(tags)
        try:
            self.backend.set_tags(node_id, dict(tags))
        except BackendError as e:
            logger.warning("could not set tags on %s: %s", node_id, e)

    # ----- launching -------------------------------------------------------------------------------------------

    def create_node(self, node_config: dict[str, Any], tags: dict[str, str], count: int) -> dict | None:
        node_type = tags.get(TAG_RAY_USER_NODE_TYPE, "")
        return self.create_node_with_resources_and_labels(
            node_config, tags, count, dict(self._node_type_resources.get(node_type) or {}), {})

    def create_node_with_resources_and_labels(self, node_config: dict[str, Any], tags: dict[str, str], count: int,
                                              resources: dict[str, float], labels: dict[str, str]) -> dict | None:
        node_type = tags.get(TAG_RAY_USER_NODE_TYPE, "")
        is_head = tags.get(TAG_RAY_NODE_KIND) == NODE_KIND_HEAD
        if not resources:
            resources = dict(self._node_type_resources.get(node_type) or {})
        try:
            request = self.resolver.request(node_type, resources, node_config, is_head)
            plan = self.planner.plan(request)
        except (ConfigError, NoFeasibleOffering) as e:
            raise NodeLaunchException(type(e).__name__, str(e), src_exc_info=None) from e
        _, backend_config = split_node_config(node_config or {})
        launch_request = tags.get(TAG_RAY_LAUNCH_REQUEST) or uuid.uuid4().hex
        failures: list[str] = []
        skipped = 0
        last_category = "NoCapacity"
        for offering in plan.candidates():
            reason = self.unavailable.reason(offering)
            if reason is not None:
                skipped += 1
                continue
            spec = LaunchSpec(
                cluster_name=self.cluster_name, node_type=node_type, offering=offering, count=count,
                tags=self._launch_tags(tags, offering, plan.request.rule), node_config=copy.deepcopy(backend_config),
                request_token=_request_token(self.cluster_name, launch_request, offering, count),
                resources=instance_resources(offering.instance_type, resources), labels=dict(labels or {}),
                is_head=is_head,
            )
            if self._boots_itself and not is_head:
                spec.boot_script = worker_boot_script(self.settings.cloud, spec, self._head_ip(), self._gcs_port,
                                                      self.provider_config.get(BOOT_KEY))
            spec = self.registration.prepare(spec)
            try:
                ids = self.backend.launch(spec)
            except CapacityError as e:
                self.unavailable.mark(offering, e.category)
                if e.scope == "region":
                    for other in plan.candidates():
                        if (other.instance_type.name, other.capacity) == (offering.instance_type.name,
                                                                          offering.capacity):
                            self.unavailable.mark(other, e.category)
                failures.append(f"{offering.instance_type.name}/{offering.zone}/{offering.capacity}: {e.category}")
                last_category = e.category
                logger.warning("%s: %s %s %s unavailable (%s); trying the next candidate", node_type,
                               offering.instance_type.name, offering.zone, offering.capacity, e.category)
                continue
            except BackendError as e:   # throttling that outlasted retries, auth, bad request: not a capacity miss
                raise NodeLaunchException(e.category, f"{node_type}: {e}", src_exc_info=None) from e
            try:
                self.registration.after_launch(spec, ids)
            except BackendError as e:
                # The machines exist but could not join Ray: terminate them rather than leak them.
                logger.error("%s: registration failed for %s (%s); terminating them", node_type, ids, e)
                self.terminate_nodes(ids)
                raise NodeLaunchException(e.category, f"{node_type}: {e}", src_exc_info=None) from e
            with self._lock:
                self._listed_at = -1.0e9   # the next listing must show the new machines
            logger.info(
                "launched %d x %s for node type %s %s: %s in %s (%s, $%.4f/h) by rule %r; %d candidates, "
                "%d failed, %d skipped as recently unavailable; catalog %s; ids %s",
                len(ids), offering.instance_type.name, node_type, plan.request.shape.describe(),
                offering.instance_type.name, offering.zone, offering.capacity, offering.hourly_price or 0.0,
                plan.request.rule, len(plan), len(failures), skipped, self.catalog.catalog_id, ",".join(ids))
            return {i: {"instance_type": offering.instance_type.name, "zone": offering.zone} for i in ids}
        desc = (f"{node_type}: every candidate failed for capacity ({len(failures)} tried, {skipped} skipped as "
                f"recently unavailable): " + "; ".join(failures[:10]))
        logger.error(desc)
        raise NodeLaunchException(last_category, desc, src_exc_info=None)

    def _head_ip(self) -> str:
        """The head's address for workers: `provider.head_ip`, else this process's (the monitor runs on the head)."""
        if self.provider_config.get("head_ip"):
            return str(self.provider_config["head_ip"])
        from ray._private.services import get_node_ip_address
        return get_node_ip_address()

    def _launch_tags(self, ray_tags: dict[str, str], offering: Offering, rule: str) -> dict[str, str]:
        tags = dict(ray_tags)
        tags.update({
            TAG_CLUSTER: self.cluster_name,
            TAG_INSTANCE_TYPE: offering.instance_type.name,
            TAG_ZONE: offering.zone,
            TAG_CAPACITY: offering.capacity,
            TAG_PRICE: f"{offering.hourly_price:.6f}" if offering.hourly_price is not None else "unknown",
            TAG_RULE: rule,
            TAG_CATALOG: self.catalog.catalog_id,
        })
        return tags

    # ----- terminating -----------------------------------------------------------------------------------------

    def terminate_node(self, node_id: str) -> dict | None:
        return self.terminate_nodes([node_id])

    def terminate_nodes(self, node_ids: Iterable[str]) -> dict | None:
        ids = sorted(set(node_ids))
        if not ids:
            return None
        with self._lock:
            self._terminating.update(ids)
        try:
            self.backend.terminate(ids)
        finally:
            self.registration.after_terminate(ids)
            with self._lock:
                for i in ids:
                    m = self._machines.pop(i, None)
                    if m is not None:
                        self._remember(i, m)
        logger.info("terminated %d machine(s): %s", len(ids), ",".join(ids))
        return None

    # ----- ray up / commands -----------------------------------------------------------------------------------

    def get_command_runner(self, log_prefix, node_id, auth_config, cluster_name, process_runner, use_internal_ip,
                           docker_config=None):
        runner = self.backend.command_runner(log_prefix, node_id, auth_config, cluster_name, process_runner,
                                             use_internal_ip, docker_config)
        if runner is None:
            hook = getattr(self.registration, "command_runner", None)
            runner = hook(log_prefix, node_id, auth_config, cluster_name, process_runner, use_internal_ip,
                          docker_config) if hook is not None else None
        if runner is not None:
            return runner
        return super().get_command_runner(log_prefix, node_id, auth_config, cluster_name, process_runner,
                                          use_internal_ip, docker_config)

    @staticmethod
    def bootstrap_config(cluster_config: dict[str, Any]) -> dict[str, Any]:
        config = copy.deepcopy(cluster_config)
        provider = config.get("provider") or {}
        settings = parse_provider(provider)
        cls = backend_class(settings.cloud)
        for name, nt in sorted((config.get("available_node_types") or {}).items()):
            _, backend_keys = split_node_config(nt.get("node_config") or {})
            cls.check_node_config(provider, name, backend_keys, f"available_node_types.{name}.node_config")
        cp = plan_cluster(config, backend_overrides=lambda nc: cls.requirement_overrides(provider, nc))
        for name, p in cp.plans.items():
            o = p.chosen
            logger.info("%s: %s in %s (%s) at $%.4f/h by rule %r", name, o.instance_type.name, o.zone, o.capacity,
                        o.hourly_price or 0.0, p.request.rule)
        provider[BOOT_KEY] = {"setup": list(config.get("setup_commands") or []) +
                              list(config.get("worker_setup_commands") or []),
                              "start": list(config.get("worker_start_ray_commands") or [])}
        provider[NODE_TYPE_RESOURCES_KEY] = {
            name: dict(nt.get("resources") or {}) for name, nt in sorted(config["available_node_types"].items())}
        config["provider"] = provider
        return config

    @staticmethod
    def fillout_available_node_types_resources(cluster_config: dict[str, Any]) -> dict[str, Any]:
        """Fill CPU/GPU/memory of node types that state only requirements, from the instance they would get."""
        config = copy.deepcopy(cluster_config)
        types = config.get("available_node_types") or {}
        missing = {n for n, t in types.items() if not {"CPU", "GPU"} & set((t or {}).get("resources") or {})}
        if not missing:
            return config
        cp = plan_cluster(config)
        for name in sorted(missing):
            declared = types[name].get("resources") or {}
            filled = instance_resources(cp.plans[name].chosen.instance_type, declared)
            out = {k: int(v) for k, v in filled.items() if not k.startswith("accelerator_type:")}
            out.update(declared)
            types[name]["resources"] = out
        return config
