"""The provider's view of its machines: one shared listing per update, what vanished, and what was interrupted.

Ray asks `non_terminated_nodes` once per update and then `node_tags` / `is_running` / `internal_ip` per node, many
times; all of them read one listing, refreshed at most every `list_cache_s`. A machine that left the listing is
remembered (bounded) so Ray's questions about it after the fact still answer. A machine that vanished without a
terminate from this view is reported as interrupted (a reclaimed spot machine), so the launcher can skip that
offering for a while. No lock is held across a backend call.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from typing import Callable, Iterable

from ray_nodeless.core import ttls
from ray_nodeless.errors import BackendError
from ray_nodeless.providers.base import TAG_CLUSTER, Machine, MachineBackend
from ray_nodeless.registrations.base import Registration

logger = logging.getLogger(__name__)


class MachineView:
    def __init__(self, backend: MachineBackend, registration: Registration, cluster_name: str,
                 list_cache_s: float, on_interrupted: Callable[[Machine], None],
                 clock: Callable[[], float] = time.monotonic):
        self.backend = backend
        self.registration = registration
        self.cluster_name = cluster_name
        self.list_cache_s = list_cache_s
        self.on_interrupted = on_interrupted
        self._clock = clock
        self._lock = threading.Lock()            # guards the fields below; never held across a backend call
        self._refresh_lock = threading.Lock()    # one listing at a time
        self._machines: dict[str, Machine] = {}
        self._last_known: OrderedDict[str, Machine] = OrderedDict()
        self._listed_at = -1.0e9
        self._terminating: set[str] = set()

    # ----- reading ---------------------------------------------------------------------------------------------

    def refresh(self, force: bool = False) -> dict[str, Machine]:
        """The current machines of this cluster, from a listing at most `list_cache_s` old. A failed listing
        answers from the last good one."""
        with self._lock:
            if not force and self._clock() - self._listed_at < self.list_cache_s:
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
                interrupted = [self._machines[mid] for mid in vanished if mid not in self._terminating]
                self._terminating -= set(vanished)
                for mid in vanished:
                    self._remember(mid, self._machines[mid])
                self._machines = machines
                self._listed_at = self._clock()
            for m in interrupted:
                self.on_interrupted(m)
            return machines
        finally:
            self._refresh_lock.release()

    def current(self, machine_id: str) -> Machine | None:
        with self._lock:
            return self._machines.get(machine_id)

    def known(self, machine_id: str) -> Machine | None:
        """The machine as last listed, also after it left the listing."""
        with self._lock:
            return self._machines.get(machine_id) or self._last_known.get(machine_id)

    def last_known(self, machine_id: str) -> Machine | None:
        with self._lock:
            return self._last_known.get(machine_id)

    # ----- writing ---------------------------------------------------------------------------------------------

    def merge_tags(self, machine_id: str, tags: dict[str, str]) -> None:
        with self._lock:
            m = self._machines.get(machine_id)
            if m is not None:
                m.tags.update(tags)

    def invalidate(self) -> None:
        """The next query lists again (after a launch, so the new machines show)."""
        with self._lock:
            self._listed_at = -1.0e9

    def terminating(self, machine_ids: Iterable[str]) -> None:
        """These machines are being terminated by us: their leaving the listing is not an interruption."""
        with self._lock:
            self._terminating.update(machine_ids)

    def forget(self, machine_ids: Iterable[str]) -> None:
        """These machines are gone (terminated by us): drop them from the current view, keep them as last known."""
        with self._lock:
            for mid in machine_ids:
                m = self._machines.pop(mid, None)
                if m is not None:
                    self._remember(mid, m)

    def _remember(self, machine_id: str, machine: Machine) -> None:
        """Keep a vanished machine's last listing (caller holds self._lock). Oldest forgotten first."""
        self._last_known[machine_id] = machine
        self._last_known.move_to_end(machine_id)
        while len(self._last_known) > ttls.LAST_KNOWN_LIMIT:
            self._last_known.popitem(last=False)
