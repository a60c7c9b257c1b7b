"""The provider's view of its machines: one shared listing per update, what vanished, and what was interrupted.

Ray asks `non_terminated_nodes` once per update and then `node_tags` / `is_running` / `internal_ip` per node, many
times; all of them read one listing, refreshed at most every `list_cache_s`. No lock is held across a backend call.

What the view answers is the truth or an error, never a guess:
- A failed listing answers from the last good one; with no good listing yet it raises `ListingError` (a fresh
  provider must not tell `ray down` there is nothing to terminate).
- A page is not believed short: a fresh object's first listing is checked by a second query by the cluster tag
  (`ray down` and `sweep` build a fresh object: an empty first page must not read as "nothing to end"), and later a
  known machine the page does not show is asked about by id (`MachineBackend.recheck`) before it counts as gone;
  one the cloud shows nothing of at all is kept for `ttls.UNSEEN_GONE_S`. So a page missing some live machines
  neither makes them terminated for Ray nor marks their offering interrupted.
- A machine a launch just returned is visible at once, and stays visible while the cloud's eventually consistent
  listing does not show it yet (`ttls.LAUNCH_GRACE_S`), unless the cloud, asked by id, says it ended (a spot
  reclaim, EC2 ending a pending instance, another object's terminate): then it is gone at once, for Ray
  (`non_terminated_nodes`, `is_terminated`) and for the cost cap alike.
- After this object ended the cluster's head (`ray down`), an empty listing is believed only once one taken
  `ttls.TEARDOWN_WATCH_S` after that terminate is empty too: a worker launched just before the teardown and not
  listed yet is listed, so Ray's teardown loop ends it.
- A terminate that failed leaves the machines visible; the next refresh retries it. Ids the backend refuses as
  not this cluster's (`ForeignMachineError`) are logged and left alone; the rest of the call stands. Tags whose
  write failed are kept as pending, shown to Ray and written again at the next refresh.
- A machine that left the listing is remembered (bounded) so Ray's questions about it after the fact still
  answer. It counts as interrupted (a reclaimed spot machine) only if no provider object of this cluster was
  terminating it: not by this object's memory, nor by the `nodeless-terminating` tag that any of them sets first,
  nor by the cloud's own reason where it gives one (EC2's StateReason: `Client.*` is a terminate call from anyone,
  `Server.SpotInstanceTermination` a reclaim).
"""
from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from dataclasses import replace
from typing import Callable, Iterable

from ray_nodeless.core import ttls
from ray_nodeless.errors import BackendError, ForeignMachineError, ListingError
from ray_nodeless.providers.base import (
    MACHINE_PENDING, TAG_CLUSTER, TAG_RAY_NODE_KIND, TAG_TERMINATING, Machine, MachineBackend,
)
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
        self.clock = clock          # read at each use: a test may swap in a FakeClock after construction
        self._lock = threading.Lock()            # guards the fields below; never held across a backend call
        self._refresh_lock = threading.Lock()    # one listing at a time
        self._machines: dict[str, Machine] = {}
        self._last_known: OrderedDict[str, Machine] = OrderedDict()
        self._listed_at = -1.0e9
        self._listed_ok = False
        self._terminating: set[str] = set()
        self._expected: dict[str, float] = {}          # launched, not yet listed: id -> when
        self._pending_tags: dict[str, dict[str, str]] = {}
        self._failed_terminates: set[str] = set()
        self._unseen: dict[str, float] = {}            # known, shown by neither query: id -> since when
        self._theirs: set[str] = set()                 # another object's launches this view has not listed yet
        # When this object terminated the cluster's head (a teardown: `ray down`), on `clock`; see `_late_launches`.
        self._teardown_at: float | None = None
        self.teardown_watch_s = ttls.TEARDOWN_WATCH_S

    # ----- reading ---------------------------------------------------------------------------------------------

    def refresh(self, force: bool = False) -> dict[str, Machine]:
        """The current machines of this cluster, from a listing at most `list_cache_s` old."""
        with self._lock:
            if not force and self._listed_ok and self.clock() - self._listed_at < self.list_cache_s:
                return dict(self._machines)
        if not self._refresh_lock.acquire(blocking=False):
            # Another thread is listing right now: answer from the last listing rather than queue behind it.
            with self._lock:
                if self._listed_ok:
                    return dict(self._machines)
            self._refresh_lock.acquire()     # nothing to answer from yet: wait for that listing
            self._refresh_lock.release()
            return self.refresh()
        try:
            answer = self._list()
            if answer is None:
                with self._lock:
                    return dict(self._machines)
            listed, gone = answer
            if not listed:
                listed = self._late_launches(listed)
            self._retry_pending(listed)
            return self._apply(listed, gone)
        finally:
            self._refresh_lock.release()

    def _late_launches(self, listed: dict[str, Machine]) -> dict[str, Machine]:
        """An empty listing after this object ended the head (`ray down`: Ray's teardown stops at the first empty
        answer) is believed only once a listing `teardown_watch_s` after that terminate is empty too: a worker the
        monitor launched just before it was stopped may not be listed yet, and would survive the teardown (Ray's
        own AWS provider leaves it running). Listed again every `ttls.TEARDOWN_WATCH_POLL_S` until then; the first
        listing that shows machines is the answer (Ray then ends them)."""
        with self._lock:
            since = self._teardown_at
        while since is not None and self.clock() - since < self.teardown_watch_s and not listed:
            time.sleep(ttls.TEARDOWN_WATCH_POLL_S)
            try:
                listed = self._list_once()
                if not listed:
                    listed = {m.id: self.registration.describe(m) for m in self.backend.recheck(None).live
                              if m.tags.get(TAG_CLUSTER) == self.cluster_name}
            except Exception as e:   # noqa: BLE001 - a failed look is no answer: keep watching
                logger.warning("teardown: listing for late launches failed: %s", e)
                listed = {}
            if listed:
                logger.warning("teardown: %d machine(s) appeared after the head was ended (launched just before "
                               "`ray down`): %s", len(listed), ",".join(sorted(listed)[:20]))
        return listed

    def _list(self) -> tuple[dict[str, Machine], dict[str, str]] | None:
        """One listing of this cluster's machines, confirmed where it may be short, and why machines it confirmed
        gone went (id -> "terminated" | "interrupted" | ""); or None (after a warning) to answer from the last one.

        Confirmed means asked again by a second query (`MachineBackend.recheck`): a fresh object's first listing
        by the cluster tag (it knows nothing to compare the page with, and `ray down` and `sweep` build a fresh
        one); later, every known machine the page does not show, by id. One the second query shows live stays;
        one it does not show at all stays too, for `ttls.UNSEEN_GONE_S` (EC2 keeps a terminated instance listed
        for about an hour: "nothing" about a machine listed moments ago is a glitch, not an end)."""
        try:
            listed = self._list_once()
            with self._lock:
                first = not self._listed_ok
                missing = sorted(mid for mid in self._machines if mid not in listed and mid not in self._expected)
                # Launched moments ago and not listed yet: the listing's lag, or ended already (a spot reclaim, EC2
                # ending a pending instance, another object's terminate). Asked by id like the others, so one the
                # cloud says ended goes at once instead of counting as running for LAUNCH_GRACE_S.
                young = sorted(mid for mid in self._expected if mid not in listed and mid in self._machines)
            gone: dict[str, str] = {}
            if first:
                self._add_live(listed, self.backend.recheck(None).live, "the first listing")
                missing = [mid for mid in missing if mid not in listed]
                young = [mid for mid in young if mid not in listed]
            ask = sorted(set(missing) | set(young))
            if ask:
                logger.info("listing does not show %d known machine(s) %s; asking again by id", len(ask), ask[:20])
                rc = self.backend.recheck(ask)
                self._add_live(listed, rc.live, "the listing")
                gone = {mid: rc.gone[mid] for mid in ask if mid in rc.gone}
                self._keep_unseen(listed, [mid for mid in missing if mid not in listed and mid not in gone])
            return listed, gone
        except Exception as e:
            if not isinstance(e, BackendError):
                logger.exception("listing machines raised %s", type(e).__name__)
            with self._lock:
                ok = self._listed_ok
            if not ok:
                raise ListingError(f"cannot list the machines of cluster {self.cluster_name!r}: {e}",
                                   getattr(e, "category", type(e).__name__)) from e
            logger.warning("listing machines failed (%s); answering from the last listing", e)
            return None

    def _add_live(self, listed: dict[str, Machine], live: Iterable[Machine], what: str) -> None:
        """Machines a second query shows live: the page missed them (never another cluster's)."""
        added = []
        for m in live:
            if m.tags.get(TAG_CLUSTER) == self.cluster_name and m.id not in listed:
                listed[m.id] = self.registration.describe(m)
                added.append(m.id)
        if added:
            logger.warning("%s did not show %d machine(s) of cluster %s that a second query shows live: %s", what,
                           len(added), self.cluster_name, ",".join(sorted(added)[:20]))
        with self._lock:
            for mid in listed:
                self._unseen.pop(mid, None)

    def _keep_unseen(self, listed: dict[str, Machine], unseen: list[str]) -> None:
        """Known machines neither query shows: kept as last listed, until `ttls.UNSEEN_GONE_S` have passed."""
        now = self.clock()
        with self._lock:
            for mid in unseen:
                since = self._unseen.setdefault(mid, now)
                if now - since < ttls.UNSEEN_GONE_S and mid in self._machines:
                    listed[mid] = self._machines[mid]
                else:
                    self._unseen.pop(mid, None)
        if unseen:
            logger.warning("the cloud shows nothing of known machine(s) %s (not listed, not found by id); kept for "
                           "up to %.0f s", sorted(unseen)[:20], ttls.UNSEEN_GONE_S)

    def _list_once(self) -> dict[str, Machine]:
        out = {}
        for m in self.backend.list_machines():
            if m.tags.get(TAG_CLUSTER) != self.cluster_name:
                continue   # a backend bug must not make us adopt another cluster's machine
            out[m.id] = self.registration.describe(m)
        return out

    def _apply(self, listed: dict[str, Machine], gone: dict[str, str]) -> dict[str, Machine]:
        now = self.clock()
        with self._lock:
            machines = dict(listed)
            for mid, tags in self._pending_tags.items():
                if mid in machines:
                    machines[mid] = replace(machines[mid], tags={**machines[mid].tags, **tags})
            for mid, since in list(self._expected.items()):
                if mid in listed:
                    del self._expected[mid]
                elif mid in gone:
                    del self._expected[mid]     # the cloud says it ended before its listing caught up
                    logger.warning("machine %s ended %.0f s after its launch, before it was listed (%s)", mid,
                                   now - since, gone[mid] or "reason not told")
                elif now - since < ttls.LAUNCH_GRACE_S and mid in self._machines:
                    machines[mid] = self._machines[mid]     # the cloud's listing lags the launch
                else:
                    del self._expected[mid]
                    logger.warning("machine %s was launched but never listed within %.0f s", mid,
                                   ttls.LAUNCH_GRACE_S)
            vanished = [mid for mid in self._machines if mid not in machines]
            for mid in [m for m in self._unseen if m not in machines]:
                del self._unseen[mid]
            self._theirs -= set(listed)
            interrupted = [self._machines[mid] for mid in vanished
                           if mid not in self._terminating and mid not in self._theirs
                           and TAG_TERMINATING not in self._machines[mid].tags]
            self._terminating -= set(vanished)
            self._theirs -= set(vanished)
            self._failed_terminates -= set(vanished)
            for mid in vanished:
                self._pending_tags.pop(mid, None)
                self._remember(mid, self._machines[mid])
            self._machines = machines
            self._listed_at = now
            self._listed_ok = True
        if interrupted:
            # Another provider object of the cluster may have ended them before its tag reached our listing: the
            # cloud's reason and the machine's current tags (the second look's, else asked now) tell.
            reasons = {mid: r for mid, r in gone.items() if r}
            ask = sorted(m.id for m in interrupted if m.id not in reasons)
            if ask:
                try:
                    reasons.update(self.backend.vanished_reasons(ask))
                except Exception as e:
                    logger.warning("could not tell why %d machine(s) vanished: %s", len(ask), e)
            for m in interrupted:
                if reasons.get(m.id) != "terminated":
                    self.on_interrupted(m)
        return dict(machines)

    def _retry_pending(self, listed: dict[str, Machine]) -> None:
        """Write tags whose write failed, and end machines whose terminate failed, again (outside the lock)."""
        with self._lock:
            tags = {mid: dict(t) for mid, t in self._pending_tags.items() if mid in listed}
            ends = sorted(mid for mid in self._failed_terminates if mid in listed)
        for mid, t in sorted(tags.items()):
            try:
                self.backend.set_tags(mid, t)
            except Exception as e:
                logger.warning("tags of %s still not written: %s", mid, e)
                continue
            with self._lock:
                if self._pending_tags.get(mid) == t:
                    del self._pending_tags[mid]
        if ends:
            try:
                self.backend.terminate(ends)
                logger.info("retried terminate of %s", ",".join(ends))
            except Exception as e:
                logger.warning("terminate of %s failed again: %s", ",".join(ends), e)

    def current(self, machine_id: str) -> Machine | None:
        with self._lock:
            return self._machines.get(machine_id)

    def known(self, machine_id: str) -> Machine | None:
        """The machine as last listed, also after it left the listing."""
        with self._lock:
            return self._machines.get(machine_id) or self._last_known.get(machine_id)

    def hourly_cost(self, price_of: Callable[[Machine], float]) -> float:
        with self._lock:
            return sum(price_of(m) for m in self._machines.values())

    def cost_view(self) -> tuple[float, dict[str, Machine]]:
        """(when the last good listing was applied, on `clock`; the machines shown now): what the cost cap counts
        (launch/budget.py), read in one step."""
        with self._lock:
            return self._listed_at, dict(self._machines)

    # ----- writing ---------------------------------------------------------------------------------------------

    def set_tags(self, machine_id: str, tags: dict[str, str]) -> None:
        """Merge `tags` into the machine (shown at once) and write them; a failed write is retried later."""
        with self._lock:
            m = self._machines.get(machine_id)
            if m is not None:
                m.tags.update(tags)
        try:
            self.backend.set_tags(machine_id, dict(tags))
        except Exception as e:
            logger.warning("could not set tags on %s (%s); retrying at the next listing", machine_id, e)
            with self._lock:
                self._pending_tags.setdefault(machine_id, {}).update(tags)

    def launched(self, machines: Iterable[Machine], theirs: bool = False) -> None:
        """Machines a launch just returned: visible now, kept while the cloud's listing catches up. `theirs`:
        another provider object's launch (handed over by the cost cap's ledger, launch/shared_holds.py): until this
        view lists one, its end is that object's to judge, never an interruption here (it may be a reclaim that
        object saw already, or its own terminate)."""
        now = self.clock()
        with self._lock:
            for m in machines:
                if m.id not in self._machines:
                    self._machines[m.id] = m
                    if theirs:
                        self._theirs.add(m.id)
                self._expected[m.id] = now

    def terminate(self, machine_ids: list[str]) -> None:
        """End these machines: tag them as ours to end, terminate, then drop them from the view. A failed terminate
        leaves them visible (and retried at the next refresh) and raises."""
        with self._lock:
            self._terminating.update(machine_ids)
            listed = [mid for mid in machine_ids if mid in self._machines]   # never tag a machine not ours
            if any(self._machines[mid].tags.get(TAG_RAY_NODE_KIND) == "head" for mid in listed):
                self._teardown_at = self.clock()    # a teardown: watch for late launches (`_late_launches`)
        try:   # best effort: lets every other provider object of the cluster tell this from an interruption
            for mid in listed:
                self.backend.set_tags(mid, {TAG_TERMINATING: "1"})
        except Exception as e:
            logger.debug("could not mark %s as terminating: %s", listed, e)
        try:
            self.backend.terminate(machine_ids)
        except ForeignMachineError as e:
            # The others were ended; these are not this cluster's machines (never Ray's nodes of this cluster), so
            # there is nothing to end or retry: said loudly, not raised into Ray's update loop.
            logger.error("terminate: %s are not machines of cluster %s; left alone", e.machine_ids,
                         self.cluster_name)
            with self._lock:
                self._terminating -= set(e.machine_ids)
        except Exception:
            with self._lock:
                self._failed_terminates.update(machine_ids)
            raise
        with self._lock:
            self._failed_terminates -= set(machine_ids)
            for mid in machine_ids:
                self._expected.pop(mid, None)
                self._theirs.discard(mid)
                self._pending_tags.pop(mid, None)
                m = self._machines.pop(mid, None)
                if m is not None:
                    self._remember(mid, m)

    def _remember(self, machine_id: str, machine: Machine) -> None:
        """Keep a vanished machine's last listing (caller holds self._lock). Oldest forgotten first."""
        self._last_known[machine_id] = machine
        self._last_known.move_to_end(machine_id)
        while len(self._last_known) > ttls.LAST_KNOWN_LIMIT:
            self._last_known.popitem(last=False)


def pending_machine(machine_id: str, tags: dict[str, str]) -> Machine:
    return Machine(id=machine_id, tags=dict(tags), state=MACHINE_PENDING, launched_at=time.time())
