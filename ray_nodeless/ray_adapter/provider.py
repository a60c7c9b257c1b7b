"""`NodelessProvider`: the thin adapter between Ray's autoscaler (v1 and v2) and the launch layer.

It translates Ray's calls and tags and nothing else: planning and the candidate walk are `launch/launcher.py`,
the shared listing and interruption detection `launch/machine_view.py`, the machines a backend of
`providers/`, how they join Ray a registration of `registrations/`.

- `bootstrap_config` / `fillout_available_node_types_resources` (on `ray up`): `bootstrap.py`.
- `create_node_with_resources_and_labels` / `create_node`: launch; a failure reaches Ray as NodeLaunchException
  with the cloud's category, so v2 demotes the node type.
- `non_terminated_nodes` and the per-node queries read one shared listing; none raises on a transient backend
  error or a vanished node.

Where the work runs depends on the process (`MonitorContext`, ray_adapter/context.py):
- In the cluster's monitor (`acts_on_cluster`: Ray's monitor of a `ray up` cluster, or the KubeRay bridge's) the
  provider's periodic work runs on its own loop (ray_adapter/loop.py), started at Ray's first listing call: the
  *listing* lane refreshes the view every `list_cache_s`, then polls the spot interruption queue
  (`interruption_queue_url`, AWS; it drains the warned machines' Ray nodes: interruptions/queue.py), packs
  shape-open demands (open_driver.py), lets the registration observe the listing and ends the machines it gave up
  on; the *reversion* lane runs the reverter (launch/reversion.py), whose launches may walk the cloud for minutes.
  `non_terminated_nodes` reads the latest snapshot (plus what this object just launched or terminated, which the
  view shows at once) and returns: its first call waits up to FIRST_SNAPSHOT_TIMEOUT_S for the first listing.
  Ray's own launches (`create_node*`) go to the launcher on Ray's threads, as before, never through the loop.
- Everywhere else (`ray up`, `ray down`, `sweep`, `plan`) there is no loop and no thread: each listing call asks
  the cloud (within `list_cache_s`), so `ray down` terminates what really runs.
"""
from __future__ import annotations

import logging
import threading
import time
import weakref
from types import ModuleType
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from ray.autoscaler.node_launch_exception import NodeLaunchException
from ray.autoscaler.node_provider import NodeProvider
from ray.autoscaler.tags import NODE_KIND_HEAD, TAG_RAY_LAUNCH_REQUEST, TAG_RAY_NODE_KIND, TAG_RAY_USER_NODE_TYPE

from ray_nodeless.core.requirements import only_amounts
from ray_nodeless.core.availability import UnavailableOfferings
from ray_nodeless.core.catalog import Catalog
from ray_nodeless.core.documents import Document
from ray_nodeless.core.planner import Planner
from ray_nodeless.core.settings import Resolver
from ray_nodeless.errors import LaunchError, ListingError
from ray_nodeless.interruptions.drain import RayDrainer, RayNode
from ray_nodeless.interruptions.block_ends import BlockEnds
from ray_nodeless.interruptions.queue import InterruptionQueue
from ray_nodeless.launch.catalog import PlanningCatalog, catalog_result
from ray_nodeless.operate.config import load_provider
from ray_nodeless.launch.launcher import Launcher
from ray_nodeless.launch.decisions import machine_labels
from ray_nodeless.launch.machine_view import MachineView, pending_machine
from ray_nodeless.metrics.events import holds_path
from ray_nodeless.metrics.wiring import ProviderInstruments
from ray_nodeless.launch.reversion import Reverter
from ray_nodeless.launch.idle_release import LearnedRelease
from ray_nodeless.core.idle_gaps import GapLearner
from ray_nodeless.ray_adapter.idle_driver import ConfigIdlePlan, GcsIdleSource
from ray_nodeless.providers.base import MACHINE_RUNNING, TAG_PRICE, TAG_UNSERVED, Machine
from ray_nodeless.ray_adapter import bootstrap
from ray_nodeless.ray_adapter.start_labels import FactLabelsRunner
from ray_nodeless.core.open_pack import Packer
from ray_nodeless.core.open_plan import OpenFitter
from ray_nodeless.launch.open_types import OpenTypes
from ray_nodeless.ray_compat.demand import autoscaler_event_sink
from ray_nodeless.ray_compat.ray_status import StatusSlot
from ray_nodeless.ray_adapter.context import MonitorContext
from ray_nodeless.ray_adapter.loop import Clock, Lane, ProviderLoop
from ray_nodeless.ray_adapter.open_driver import OpenDriver, YamlFileStore

if TYPE_CHECKING:
    from ray.autoscaler.command_runner import CommandRunnerInterface   # Ray's public API; for annotations only

logger = logging.getLogger(__name__)

FIRST_SNAPSHOT_TIMEOUT_S = 120.0     # the first listing call in the monitor waits this long for the loop's listing
MIN_LANE_INTERVAL_S = 1.0
# The loop acting for each cluster in this process: a provider object Ray builds anew for the same cluster (a
# changed provider block) takes over, and the older one's loop stops (two reverters must not act at once).
_LOOPS: "weakref.WeakValueDictionary[str, ProviderLoop]" = weakref.WeakValueDictionary()
_LOOPS_LOCK = threading.Lock()


def machine_price(m: Machine) -> float:
    """A machine's hourly price from its decision tag (0 when unknown)."""
    try:
        return float(m.tags.get(TAG_PRICE, "0"))
    except ValueError:
        return 0.0


class NodelessProvider(NodeProvider):
    """Ray NodeProvider: cheapest-fit instances under ordered rules, on a pluggable machine backend."""

    def __init__(self, provider_config: dict[str, Any], cluster_name: str, *,
                 context: MonitorContext | None = None, clock: Clock = time.monotonic):
        """Ray builds the provider with (provider_config, cluster_name) only: `context` is then Ray's monitor's
        command line, read once here (MonitorContext.of_this_process); the KubeRay bridge's subclass passes the one
        the bridge built. `clock` drives the loop's lanes (a test passes a fake one)."""
        super().__init__(provider_config, cluster_name)
        # The provider block is read here once; every part below gets its parsed piece of the bundle.
        self.bundle = load_provider(provider_config)
        self.settings = self.bundle.core
        self.context = context if context is not None else MonitorContext.of_this_process()
        acts = self.context.acts_on_cluster
        gcs = self.context.gcs_address if acts else None
        # Metrics and decision events wrap the parts below (ray_nodeless/metrics/); exported only in the monitor.
        self.instruments = ProviderInstruments(
            cluster_name, self.settings, gcs_address=gcs, in_monitor=acts,
            event_sink=autoscaler_event_sink(self.context.logs_dir) if gcs else None,
            status_slot=StatusSlot(gcs) if gcs else None)
        inst = self.instruments
        # Loaded at the first launch: `ray down` and `sweep` list and terminate without it (a gone catalog file,
        # or a live catalog's price lists, must not keep machines running).
        self._catalog = inst.planning(
            PlanningCatalog(lambda: catalog_result(self.settings, self.bundle.backend_settings)))
        self.backend = self.bundle.make_backend(cluster_name)
        metered = inst.backend(self.backend)    # the view and the launcher call the cloud through the metrics
        self.registration = self.bundle.make_registration(cluster_name)
        self.resolver = Resolver(self.settings, self.bundle.requirement_overrides)
        self.unavailable = UnavailableOfferings(self.settings.unavailable_ttl_s,
                                                cap_s=self.settings.unavailable_backoff_cap_s,
                                                probes=self.settings.unavailable_probes)
        self.view = inst.view(MachineView(metered, self.registration, cluster_name, self.settings.list_cache_s,
                                          on_interrupted=inst.on_interrupted(self._on_interrupted)))
        # Machines a launch call has made before it returns (a backend that waits for their Ray: the local one)
        # are shown at once, so Ray's v2 never sees their Ray nodes before their instances (base.on_created).
        self.backend.on_created = self.view.launched
        self.launcher = inst.launcher(Launcher(cluster_name, self._catalog, self.resolver, metered,
                                               self.registration, self.unavailable, terminate=self._terminate,
                                               view=self.view, price_of=machine_price,
                                               holds_path=holds_path(cluster_name, self.settings.events_dir)))
        inst.watch(self.view, self.unavailable)
        # What bootstrap_config wrote (numbers per resource); anything else is not a node type's resources.
        self._node_type_resources: dict[str, dict[str, float]] = {
            t: dict(r) for t, r in self.settings.node_type_resources.items()
            if isinstance(r, Mapping) and only_amounts(r)}
        self.interruptions: InterruptionQueue | None = None
        # On-demand -> spot reversion (launch/reversion.py): only in the monitor, whose GCS it drains through.
        self._node_configs: dict[str, Document] = {}
        self.reverter: Reverter[RayNode] | None = None
        if gcs and self.settings.reversion.enabled:
            self.reverter = Reverter(self.settings.reversion, self.launcher, self.view, self.unavailable,
                                     RayDrainer(gcs), self.terminate_nodes,
                                     resources_of=lambda t: self._node_type_resources.get(t) or {},
                                     node_config_of=self._node_configs.get)
        config_path = self.context.config_path
        # The idle release that learns the gaps (launch/idle_release.py): only in the monitor, which reads Ray's
        # nodes and the config file Ray re-reads, and drains through Ray's idle drain.
        self.idle_release: LearnedRelease[RayNode] | None = None
        s = self.settings
        if gcs and config_path and s.cost_aware_idle and s.idle.learn_gaps:
            self.idle_release = inst.idle_release(LearnedRelease(
                GapLearner(s.expected_launch_s, s.idle.learn_window, s.idle.learn_min_gap_s), GcsIdleSource(gcs),
                ConfigIdlePlan(config_path, None, s.idle_learn_types), RayDrainer(gcs), self.terminate_nodes))
        self.open: OpenDriver | None = None
        if gcs and config_path and self.settings.open_shapes is not False:
            # Only in the monitor: shape-open node types live in the config file it re-reads (open_driver.py).
            self.open = OpenDriver(self._open_types(config_path), gcs, self.context.logs_dir,
                                   on_unserved=inst.on_unserved(self._record_unserved), on_opened=inst.opened)
        if self.settings.interruption_queue_url and gcs:
            # Only in the monitor (which has the GCS address): `ray up`/`ray down` must neither consume warnings
            # nor wait on a GCS they may not reach.
            url = self.settings.interruption_queue_url
            sqs = self.backend.interruption_queue_client(url, self.bundle.backend_settings)   # AWS: SQS
            self.interruptions = inst.interruptions(InterruptionQueue(sqs, url, RayDrainer(gcs)))
        # Capacity Blocks' machines drained before the block ends (interruptions/block_ends.py): in the monitor.
        self.block_ends = None if not gcs else BlockEnds(
            self.launcher.reservations.block_ends, RayDrainer(gcs), self.settings.reservations.block_drain_s)
        self._first_listing = threading.Event()
        self.loop: ProviderLoop | None = None
        if acts:
            lanes = [Lane("listing", self._listing_pass, max(MIN_LANE_INTERVAL_S, self.settings.list_cache_s)),
                     Lane("reversion", self._reversion_pass,
                          max(MIN_LANE_INTERVAL_S, self.settings.reversion.interval_s))]
            if self.idle_release is not None:     # a pass at least every learn_min_gap_s, at most every second
                lanes.append(Lane("idle", self._idle_pass, max(MIN_LANE_INTERVAL_S, s.idle.learn_min_gap_s / 2)))
            self.loop = ProviderLoop(cluster_name, lanes, clock)

    def _open_types(self, config_path: str) -> OpenTypes:
        fitter = OpenFitter(self.resolver, lambda: self.planner, self.unavailable, self.settings.open_node_config)
        return OpenTypes(self.settings, Packer(fitter, self.settings.single_zone_gangs), YamlFileStore(config_path))

    def _record_unserved(self, summary: str, machines: Mapping[str, Machine]) -> None:
        """What no allowed offering can serve, on the head's tags: `ray-nodeless status` shows it from anywhere."""
        heads = sorted(mid for mid, m in machines.items() if m.tags.get(TAG_RAY_NODE_KIND) == NODE_KIND_HEAD)
        if not heads:
            raise LaunchError("no head machine listed yet to record the unserved demands on", "NoHeadListed")
        self.view.set_tags(heads[0], {TAG_UNSERVED: summary})
        logger.info("unserved demands recorded on the head %s: %s", heads[0], summary or "none")

    @property
    def catalog(self) -> Catalog:
        return self._catalog.catalog

    @property
    def planner(self) -> Planner:
        return self._catalog.planner

    def _on_interrupted(self, machine: Machine) -> None:
        self.launcher.on_interrupted(machine.tags, machine.id)
        if self.reverter is not None:
            self.reverter.on_interrupted(machine.tags)
        try:   # whatever the backend (a played machine's local process) and the registration keep for it goes
            self.backend.forget([machine.id])
            self.registration.after_terminate([machine.id])
        except Exception as e:  # never let clean-up of a vanished machine break the listing
            logger.warning("clean-up after vanished machine %s failed: %s", machine.id, e)

    # ----- queries ---------------------------------------------------------------------------------------------

    def non_terminated_nodes(self, tag_filters: dict[str, str]) -> list[str]:
        if self.loop is None:
            # Outside the monitor (ray up / ray down / sweep): the cloud's listing now, and the work inline.
            machines = self._listing_pass()
            if self.reverter is not None:
                self.reverter.tick(machines)
        else:
            machines = self._snapshot(self.loop)
        return sorted(mid for mid, m in machines.items()
                      if all(m.tags.get(k) == v for k, v in tag_filters.items()))

    # ----- the provider's work: the loop's lanes in the monitor, the listing call elsewhere --------------------------

    def _listing_pass(self) -> dict[str, Machine]:
        """List (within list_cache_s), then everything that acts on a listing; the machines that remain."""
        machines = self.view.refresh()
        try:
            if self.interruptions is not None:
                self.interruptions.poll(machines)      # bounded, never raises: see interruptions/queue.py
            if self.block_ends is not None:
                self.block_ends.tick(machines)         # only machines in a reservation; never raises
            if self.open is not None:
                self.open.tick(machines)               # at most once a second, never raises: see open_driver.py
            self.registration.observe_listing(set(machines))
            doomed = {mid: why for mid, why in self.registration.machines_to_end().items() if mid in machines}
            if doomed:   # e.g. never joined Kubernetes within join_timeout_s, or its Ray pod failed for good
                for mid, why in sorted(doomed.items()):
                    logger.error("terminating %s: %s", mid, why)
                self.terminate_nodes(sorted(doomed))
                machines = {mid: m for mid, m in machines.items() if mid not in doomed}
        finally:
            self._first_listing.set()      # a listing exists: Ray's listing call may answer from the snapshot
        return machines

    def _reversion_pass(self) -> None:
        if self.reverter is not None and self._first_listing.is_set():
            self.reverter.tick(self.view.cost_view()[1])    # at most every reversion.interval_s, never raises

    def _idle_pass(self) -> None:
        if self.idle_release is not None and self._first_listing.is_set():
            self.idle_release.tick(self.view.cost_view()[1])     # never raises: see launch/idle_release.py

    def _snapshot(self, loop: ProviderLoop) -> dict[str, Machine]:
        """The view's latest machines (the loop's last listing, with this object's own launches and terminations),
        starting `loop` (this object's) at the first call and waiting (bounded) for its first listing."""
        if not loop.running:
            self._start_loop(loop)
        if not self._first_listing.wait(FIRST_SNAPSHOT_TIMEOUT_S):
            lane = loop.lanes["listing"]
            raise ListingError(f"no listing of cluster {self.cluster_name!r} within {FIRST_SNAPSHOT_TIMEOUT_S:.0f} s "
                               f"({lane.errors} failed: {lane.last_error or 'still listing'})", "ListingTimeout")
        # cost_view: the machines shown now, read under the view's lock (no cloud call).
        return self.view.cost_view()[1]

    def _start_loop(self, loop: ProviderLoop) -> None:
        with _LOOPS_LOCK:
            older = _LOOPS.get(self.cluster_name)
            if older is not None and older is not loop:
                logger.info("provider loop of %s: a new provider object takes over", self.cluster_name)
                older.stop(timeout_s=0.0)
            _LOOPS[self.cluster_name] = loop
        loop.start()

    def stop(self) -> None:
        """Stop the provider's loop (Ray never calls this; its threads are daemon threads)."""
        if self.loop is not None:
            self.loop.stop()

    def is_running(self, node_id: str) -> bool:
        m = self.view.current(node_id)
        return m is not None and m.state == MACHINE_RUNNING

    def is_terminated(self, node_id: str) -> bool:
        return self.view.current(node_id) is None

    def node_tags(self, node_id: str) -> dict[str, str]:
        m = self.view.known(node_id)
        return dict(m.tags) if m else {}

    # Ray types these `str`, yet its own providers answer None for a node without an address (AWS's
    # private_ip_address before the instance has one, KubeRay's pending pod) and its callers handle it: a machine
    # unknown here, or listed without an address yet, is None too.
    def internal_ip(self, node_id: str) -> str | None:  # type: ignore[override]
        m = self.view.known(node_id)
        return m.internal_ip if m else None

    def external_ip(self, node_id: str) -> str | None:  # type: ignore[override]  # as internal_ip
        m = self.view.known(node_id)
        return (m.external_ip or m.internal_ip) if m else None

    def set_node_tags(self, node_id: str, tags: dict[str, str]) -> None:
        self.view.set_tags(node_id, tags)

    # ----- launching and terminating ---------------------------------------------------------------------------

    # Ray's contract allows None ("no metadata"): here always each launched machine's instance type and zone.
    def create_node(self, node_config: dict[str, Any], tags: dict[str, str],
                    count: int) -> dict[str, dict[str, str]]:
        return self.create_node_with_resources_and_labels(node_config, tags, count, {}, {})

    def create_node_with_resources_and_labels(self, node_config: dict[str, Any], tags: dict[str, str], count: int,
                                              resources: dict[str, float],
                                              labels: dict[str, str]) -> dict[str, dict[str, str]]:
        node_type = tags.get(TAG_RAY_USER_NODE_TYPE, "")
        resources = resources or dict(self._node_type_resources.get(node_type) or {})
        if not tags.get(TAG_RAY_NODE_KIND) == NODE_KIND_HEAD:
            self._node_configs[node_type] = dict(node_config or {})    # what a reversion launches the type with
            if self.idle_release is not None:
                self.idle_release.launched(node_type)     # work came back for the type: a gap closes
        try:
            launched = self.launcher.launch(node_type, node_config, tags, count, resources, labels,
                                            is_head=tags.get(TAG_RAY_NODE_KIND) == NODE_KIND_HEAD,
                                            launch_request=tags.get(TAG_RAY_LAUNCH_REQUEST))
        except LaunchError as e:
            raise NodeLaunchException(e.category, str(e), src_exc_info=None) from e
        self.view.launched(pending_machine(mid, launched.spec.tags) for mid in launched.machine_ids)
        o = launched.offering
        return {i: {"instance_type": o.instance_type.name, "zone": o.zone} for i in launched.machine_ids}

    # Ray's return type (metadata about the terminated nodes, Any to Ray too); always None here.
    def terminate_node(self, node_id: str) -> dict[str, Any] | None:
        return self.terminate_nodes([node_id])

    def terminate_nodes(self, node_ids: Iterable[str]) -> dict[str, Any] | None:
        ids = sorted(set(node_ids))
        if not ids:
            return None
        self.view.terminate(ids)    # raises when the cloud refused: the machines stay visible and are retried
        if self.launcher.budget is not None:
            self.launcher.budget.ended(ids)      # no other object of the cluster takes them over any more
        self.registration.after_terminate(ids)
        logger.info("terminated %d machine(s): %s", len(ids), ",".join(ids))
        return None

    def _terminate(self, node_ids: list[str]) -> None:
        """The launcher's way to end machines (those that could not join): Ray's terminate path, whose result the
        launcher has no use for (a subclass's terminate_nodes applies: the KubeRay head is never ended)."""
        self.terminate_nodes(node_ids)

    # ----- ray up / commands -----------------------------------------------------------------------------------

    def get_command_runner(self, log_prefix: str, node_id: str, auth_config: dict[str, Any], cluster_name: str,
                           process_runner: ModuleType, use_internal_ip: bool,
                           docker_config: dict[str, Any] | None = None) -> CommandRunnerInterface:
        """The backend's runner, else the registration's (Registration.command_runner: None by default), else Ray's
        SSH runner."""
        args = (log_prefix, node_id, auth_config, cluster_name, process_runner, use_internal_ip, docker_config)
        runner = self.backend.command_runner(*args)
        if runner is None:
            runner = self.registration.command_runner(*args)
        runner = runner if runner is not None else super().get_command_runner(*args)
        # Ray's updater starts Ray with the node type's declared labels: the machine's facts win (start_labels.py)
        return FactLabelsRunner(runner, lambda declared: self._start_labels(node_id, declared))

    def _start_labels(self, node_id: str, declared: dict[str, str]) -> dict[str, str] | None:
        """The labels machine `node_id` starts Ray with (launcher.machine_labels), or None when its offering is
        not known here (no decision tags, another catalog): Ray's declared ones stand then."""
        m = self.view.known(node_id)
        if m is None:
            m = self.view.refresh(force=True).get(node_id)
        offering = None if m is None else self.launcher.offering_of(m.tags)
        if m is None or offering is None:
            logger.warning("%s: its offering is not known here; it starts Ray with its node type's declared labels",
                           node_id)
            return None
        return machine_labels(m.tags.get(TAG_RAY_USER_NODE_TYPE, ""), declared, offering)

    bootstrap_config = staticmethod(bootstrap.bootstrap_config)
    fillout_available_node_types_resources = staticmethod(bootstrap.fillout_available_node_types_resources)
