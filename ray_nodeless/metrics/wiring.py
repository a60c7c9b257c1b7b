"""One provider object's instruments: the process's metrics, this cluster's event log, and the wrappers
(`instrument.py`) the provider builds its parts with. The endpoint and the event log exist only in the monitor
(`in_monitor`, the provider's MonitorContext.acts_on_cluster: ray_adapter/context.py): `ray up` and `ray down` build
provider objects too, on machines that are not the head."""
from __future__ import annotations

import ipaddress
from typing import TYPE_CHECKING, Any, Callable, Mapping

from ray_nodeless.core.availability import UnavailableOfferings
from ray_nodeless.core.settings import CoreSettings
from ray_nodeless.interruptions.queue import InterruptionQueue
from ray_nodeless.launch.catalog import PlanningCatalog
from ray_nodeless.launch.idle_release import LearnedRelease, Release
from ray_nodeless.launch.launcher import Launcher
from ray_nodeless.launch.machine_view import MachineView
from ray_nodeless.launch.open_types import Opening
from ray_nodeless.metrics.cost_store import CostStore
from ray_nodeless.metrics.events import EventLog, cost_path, events_path, read_log
from ray_nodeless.metrics.instrument import (
    MeteredBackend, MeteredInterruptions, MeteredLauncher, MeteredPlanning, MeteredView, Recorder, state_source,
)
from ray_nodeless.metrics.ray_status import RayStatusBlock
from ray_nodeless.metrics.registry import process_metrics, serve
from ray_nodeless.providers.base import Machine, MachineBackend

if TYPE_CHECKING:
    from ray_nodeless.ray_compat.ray_status import StatusSlot


def bind_address(gcs_address: str | None) -> str:
    """Where the endpoint listens: loopback for a head on loopback (a local cluster), else every interface, as Ray's
    monitor does for its own metrics."""
    host = (gcs_address or "").rsplit(":", 1)[0].strip("[]")
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    return "127.0.0.1" if loopback else "0.0.0.0"


class ProviderInstruments:
    """`status_slot`: where `ray status` prints our recent decisions (compat.ray_status.StatusSlot), in the monitor;
    `events_dir`: the log's and cost state's directory (default `settings.events_dir`, see events.events_dir)."""

    def __init__(self, cluster_name: str, settings: CoreSettings, *, gcs_address: str | None,
                 event_sink: Callable[[str], None] | None = None, status_slot: StatusSlot | None = None,
                 events_dir: str | None = None, in_monitor: bool | None = None):
        """`in_monitor`: told by the provider's context; None: whether a GCS address is given."""
        self.metrics = process_metrics()
        in_monitor = gcs_address is not None if in_monitor is None else in_monitor
        where = events_dir or settings.events_dir
        events = EventLog(events_path(cluster_name, where)) if in_monitor else None
        if events is not None:
            events.check()      # what is in the log's way is set aside now, not in a launch (never raises)
        block = None
        if in_monitor and status_slot is not None and settings.ray_status_events > 0:
            block = RayStatusBlock(status_slot, settings.ray_status_events)
        self.recorder = Recorder(self.metrics, events, event_sink if in_monitor else None, status_block=block,
                                 cost_store=CostStore(cost_path(cluster_name, where)) if in_monitor else None)
        if block is not None and events is not None:
            # A restarted monitor shows the decisions of the one before it (v1 cleared the slot at its start).
            block.seed(read_log(events.path)[-settings.ray_status_events:])
        self.endpoint = None
        if in_monitor and settings.metrics_port:
            self.endpoint = serve(self.metrics, settings.metrics_port, bind_address(gcs_address))

    # Each part comes back as the type it went in (a decorator subclasses what it wraps, instrument.py).

    def backend(self, backend: MachineBackend) -> MachineBackend:
        return MeteredBackend(backend, self.recorder)

    def planning(self, catalog: PlanningCatalog) -> PlanningCatalog:
        return MeteredPlanning(catalog, self.recorder)

    def view(self, view: MachineView) -> MachineView:
        return MeteredView(view, self.recorder)

    def launcher(self, launcher: Launcher) -> Launcher:
        return MeteredLauncher(launcher, self.recorder)

    def interruptions(self, queue: InterruptionQueue) -> InterruptionQueue:
        return MeteredInterruptions(queue, self.recorder)

    def on_interrupted(self, callback: Callable[[Machine], None]) -> Callable[[Machine], None]:
        def interrupted(machine: Machine) -> None:
            self.recorder.interrupted(machine)
            callback(machine)
        return interrupted

    def on_unserved(self, callback: Callable[[str, Mapping[str, Machine]], None],
                    ) -> Callable[[str, Mapping[str, Machine]], None]:
        def unserved(summary: str, machines: Mapping[str, Machine]) -> None:
            callback(summary, machines)      # raises when the tag write failed: tried (and recorded) next loop
            self.recorder.unserved(summary)
        return unserved

    def opened(self, opening: Opening) -> None:
        """Machines on their way for a shape-open demand (launch/open_types.Opening): an "opening" event, so Ray's
        "No available node types can fulfill" before it reads as transient."""
        o = opening.offering
        self.recorder.event("opening", opening.message(), node_type=opening.node_type,
                            instance_type=o.instance_type.name, zone=o.zone, capacity=o.capacity,
                            price=o.hourly_price, count=opening.count, demand=opening.demand)

    def idle_release(self, release: LearnedRelease[Any]) -> LearnedRelease[Any]:
        """An "idle_release" event for each machine the learned idle release ends (launch/idle_release.py)."""
        def released(r: Release) -> None:
            self.recorder.event("idle_release", r.describe(), node_type=r.node_type, machine=r.machine_id,
                                idle_s=round(r.idle_s, 1), timeout_s=round(r.timeout_s, 1))
        release.on_release = released
        return release

    def watch(self, view: MachineView, unavailable: UnavailableOfferings) -> None:
        """The scrape-time gauges read this provider object's view and capacity memory from now on."""
        self.metrics.state.set_source(state_source(view, unavailable, self.recorder))
        self.recorder.unavailable = unavailable      # capacity_error events state its backoff
