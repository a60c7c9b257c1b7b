"""The fault matrix's engine: seeded steps of Ray v2's call pattern against one world (a backend and the cloud it
talks to, see `world.py`), with the invariants checked after every step and after every create_node call.

Invariants (the cloud's own state, read out of band by the world, against what the provider answered):
- after every step the cloud holds exactly the machines the provider returned, less those terminated or taken
  back (none lost, none doubled, none leaked), and the provider lists exactly those;
- every create_node call adds to the cloud exactly the machines it returned (all of them when it succeeds, none
  when it raises) and creates at most `count` machines per offering it tried (no duplicate from a retry);
- no machine of another cluster (nor an untagged one) changed in any way;
- no query method raised (a provider that never listed successfully may raise ListingError: that is the
  contract, and the matrix asserts it is raised exactly then);
- no machine runs on an offering the rules forbid;
- no offering is marked interrupted but one whose machine the cloud took back: terminations by another provider
  object of the cluster (an overlapping monitor, a laptop's `ray down --workers-only`) and pages that miss live
  machines never read as spot interruptions (where the world's cloud tells why a machine went: `judges_reasons`;
  elsewhere such marks are counted, not asserted).
Counted too, and asserted 0: machines a batch made beyond its count (duplicates), ids a create_node call
returned that were not running afterwards (returned-but-terminated), machines the provider reported terminated
while the cloud ran them, launches refused for the cap while what the provider counted exceeded what the cloud
runs (refusals caused by phantoms: machines ended outside still counted), and Ray retries that failed.

Issue 28's cases are steps of their own: machines ended from outside moments after their launch, before any
listing showed them (a spot reclaim, another object's terminate: gone at once, for Ray and for the cap); runs
of 2-3 empty pages in a row (`glitch_listing`, per world); and Ray's retry of a request whose machines were
listed and then ended from outside (`retry_after_outside_end`: the launcher's clock is moved past Ray's retry
round, and the retry must launch anew, not fail nor answer with the ended ids).
At the end, teardown leaves nothing and a restarted provider sees nothing.

Capped (`cap`: the provider block gets `max_hourly_cost`), the matrix also runs bursts of concurrent create_node
calls (Ray v2's parallel batches of one request, or several requests at once; on a fresh provider object before
its first listing 30 % of the time; several requests spread over 2-4 provider objects of the cluster half the
time: an old and a new monitor, each with its own reservations, sharing them through the cost cap's ledger) and
launches that raise with their machines running (orphans: the answer is lost and every retry fails; on the
in-memory world the listing does not show them until the step ends), and
asserts that the cloud's hourly cost never exceeds the cap, sampled after every create_node call (from the
calling thread, while a burst's other calls are in flight) and every step; `Stats.max_cost` is the highest.
"""
from __future__ import annotations

import random
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ray.autoscaler.node_launch_exception import NodeLaunchException

from ray_nodeless.errors import BackendError, ListingError
from ray_nodeless.launch.shared_holds import SharedHolds
from ray_nodeless.metrics.events import holds_path
from ray_nodeless.testing.fault_matrix.world import CLUSTER
from ray_nodeless.providers.base import TAG_CAPACITY, TAG_INSTANCE_TYPE, TAG_ZONE

if TYPE_CHECKING:
    from ray_nodeless.testing.fault_matrix.world import World

WORKER_TAGS = {"ray-node-type": "worker", "ray-node-status": "uninitialized", "ray-node-name": "ray-c1-worker",
               "ray-launch-config": "abc"}
BATCH = 5                      # Ray's AUTOSCALER_MAX_LAUNCH_BATCH


@dataclass
class Stats:
    backend: str = ""
    steps: int = 0
    requests: int = 0
    calls: int = 0
    launched: int = 0
    faults: dict[str, int] = field(default_factory=dict)
    refused: int = 0
    launch_wall_s: list[float] = field(default_factory=list)     # per create_node call
    wall_s: float = 0.0
    duplicates: int = 0                  # machines a batch made beyond its count
    returned_terminated: int = 0         # ids a create_node call returned that were not running after it
    misread_interruptions: int = 0       # offerings marked interrupted though no machine of theirs was taken back
    cap: float | None = None             # max_hourly_cost of a capped run
    max_cost: float = 0.0                # the highest hourly cost the cloud held at any sample
    cost_refused: int = 0                # create_node calls refused as MaxHourlyCostExceeded
    bursts: int = 0
    several_objects: int = 0             # bursts spread over several provider objects
    orphans: int = 0                     # machines of calls that raised, running
    terminated_while_running: int = 0    # ids the provider called terminated while the cloud ran them
    phantom_refusals: int = 0            # cap refusals while the provider counted more than the cloud runs
    young_ended: int = 0                 # machines ended outside before any listing showed them
    outside_retries: int = 0             # Ray retries of a request whose machines were ended outside
    failed_retries: int = 0              # ... of them that raised

    def fault(self, name: str | None) -> None:
        if name:
            self.faults[name] = self.faults.get(name, 0) + 1


class Matrix:
    def __init__(self, world: "World", seed: int, cap: float | None = None):
        self.world = world
        self.rng = random.Random(seed)
        self.cap = cap
        if cap is not None:
            world.provider_config = dict(world.provider_config, max_hourly_cost=cap)
        # Each run's own state directory: the cost cap's ledger (launch/shared_holds.py) is per cluster name, and
        # a run's fresh cloud must not inherit an earlier run's launches of the same name.
        self._state = tempfile.TemporaryDirectory(prefix="fault-matrix-state-")
        world.provider_config = dict(world.provider_config, events_dir=self._state.name)
        world.start()
        self.offset = 0.0                        # the launchers' clock runs ahead by this (Ray's retry rounds)
        self.last_refusal = ""                   # the category of the last create_node call refused
        self.provider = self.new_provider()
        self.expected: set[str] = set()          # machines the provider returned and has not ended
        self.reclaimed: set[tuple[str, str, str]] = set()    # offerings of machines the cloud took back
        self.misread: set[tuple[str, str, str]] = set()      # offerings counted as misread already
        self.stats = Stats(backend=world.name, cap=cap)
        self.over_cap: list[float] = []          # samples above the cap (from any thread)
        self._sample_lock = threading.Lock()

    def new_provider(self):
        """A new provider object of the world whose launcher reads the matrix's clock (real time + `offset`)."""
        p = self.world.new_provider()
        p.launcher._clock = lambda: time.monotonic() + self.offset
        return p

    # ----- actions ---------------------------------------------------------------------------------------------

    def request_id(self) -> str:
        """A new launch request id (Ray's TAG_RAY_LAUNCH_REQUEST), counted."""
        request = f"req-{self.stats.requests}"
        self.stats.requests += 1
        return request

    def next_request(self) -> tuple[str, str]:
        """Room for a new launch (Ray ends idle nodes: keeps every listing cheap on slow fakes), the node type it
        asks for and its request id."""
        if len(self.expected) >= self.world.max_live:
            self.scale_down()
        return self.rng.choice(sorted(self.world.shapes)), self.request_id()

    def launch_request(self) -> None:
        w = self.world
        node_type, request = self.next_request()
        count = self.rng.randint(1, w.max_count)
        while count > 0:
            n = min(count, BATCH)
            count -= n
            orphan = self.cap is not None and self.rng.random() < 0.05 and w.arm_orphan()
            if orphan:
                self.stats.fault("orphan")
            else:
                self.stats.fault(w.inject_launch_fault(self.rng))
            self.call(node_type, request, n, orphan)

    def call(self, node_type: str, request: str, n: int, orphan: bool = False) -> list[str] | None:
        """One create_node call of `n` machines under `request`, with the per-call invariants."""
        w = self.world
        tags = dict(WORKER_TAGS, **{"ray-user-node-type": node_type, "ray-launch-request": request})
        before = set(w.ours())
        mark = w.batch_mark()
        self.stats.calls += 1
        t0 = time.perf_counter()
        try:
            out = self.provider.create_node_with_resources_and_labels({}, tags, n, w.shapes[node_type], {})
        except NodeLaunchException as e:
            self.stats.refused += 1
            self.stats.cost_refused += int(e.category == "MaxHourlyCostExceeded")
            self.last_refusal = e.category
            b = self.provider.launcher.budget
            if e.category == "MaxHourlyCostExceeded" and b is not None:
                # The machines the provider counts as running (reservations aside: an unknown outcome is counted
                # by design), against what the cloud runs: more means a phantom kept the launch out.
                shown = sum(b.price_of(m) for m in b.view.cost_view()[1].values())
                self.stats.phantom_refusals += int(shown > w.cost() + 1e-6)
            out = None
        finally:
            w.clear_launch_faults()
        self.stats.launch_wall_s.append(time.perf_counter() - t0)
        self.sample_cost()
        made_per_batch = w.batch_made(mark)
        self.stats.duplicates += sum(max(0, made - n) for made in made_per_batch.values())
        for key, made in made_per_batch.items():
            assert made <= n, f"{w.name}: batch {key} made {made} machines > {n}"
        after = set(w.ours())
        self.stats.returned_terminated += len(set(out or ()) - after)
        assert before <= after, f"{w.name}: a launch ended machines {sorted(before - after)}"
        orphans = after - before - set(out or ())
        if orphans and orphan and out is None and len(orphans) <= n:
            self.expected |= orphans        # ours, running: the provider lists them (Ray adopts or ends them)
            self.stats.orphans += len(orphans)
            after -= orphans
        assert after - before == set(out or ()), \
            f"{w.name}: the cloud gained {sorted(after - before)}, the call returned {sorted(out or ())}"
        if out:
            assert len(out) == n
            self.expected |= set(out)
            self.stats.launched += n
        return list(out) if out else None

    def young_ended_outside(self) -> None:
        """A launch, then its machines ended from outside before any listing showed them (a spot reclaim, EC2
        ending a pending instance, another object's terminate): gone for Ray at once, and not counted by the cap
        (a replacement launched right after must not be refused for them)."""
        w = self.world
        node_type, request = self.next_request()
        out = self.call(node_type, request, self.rng.randint(1, 3))
        if not out:
            return
        self.end_outside(out)
        self.stats.young_ended += len(out)
        self.stats.fault("young_ended_outside")
        ids = set(self.query())
        assert not ids & set(out), f"{w.name}: young machines ended outside still listed: {sorted(ids & set(out))}"
        assert all(self.provider.is_terminated(i) for i in out)
        self.call(node_type, self.request_id(), len(out))       # the replacement

    def end_outside(self, ids: list[str]) -> None:
        """End these machines from outside: a reclaim, or another object's terminate."""
        if self.rng.random() < 0.5:
            for mid in ids:
                m = self.provider.view.known(mid)
                if m is not None:
                    self.reclaimed.add((m.tags.get(TAG_INSTANCE_TYPE, ""), m.tags.get(TAG_ZONE, ""),
                                        m.tags.get(TAG_CAPACITY, "")))
                self.world.reclaim(mid)
        else:
            self.world.new_provider().terminate_nodes(list(ids))
        self.expected -= set(ids)

    def retry_after_outside_end(self) -> None:
        """Ray's retry of a request whose machines were listed, then ended from outside before Ray saw them: the
        same request id and count after request_status_timeout_s. It must launch anew (a new token generation),
        never fail nor return the ended ids."""
        from ray_nodeless.core.ttls import retry_round_s

        w = self.world
        node_type, request = self.next_request()
        n = self.rng.randint(1, BATCH)
        out = self.call(node_type, request, n)
        if not out:
            return
        self.query()                            # listed
        self.end_outside(out)
        self.query()
        self.offset += retry_round_s() + 1      # Ray's request_status_timeout_s passes
        self.stats.outside_retries += 1
        self.stats.fault("retry_after_outside_end")
        self.last_refusal = ""
        again = self.call(node_type, request, n)
        if again is None and self.last_refusal not in ("MaxHourlyCostExceeded", ""):
            self.stats.failed_retries += 1      # before: PartialLookup after aws_settle_wait_s, every time
            self.stats.fault(f"retry_failed_{self.last_refusal}")
        assert again is None or not set(again) & set(out), f"{w.name}: a retry returned ended ids"

    def sample_cost(self) -> None:
        """The cloud's hourly cost now, against the cap (callable from a burst's threads)."""
        c = self.world.cost()
        with self._sample_lock:
            self.stats.max_cost = max(self.stats.max_cost, c)
            if self.cap is not None and c > self.cap + 1e-9:
                self.over_cap.append(c)

    def burst(self) -> None:
        """Concurrent create_node calls on the capped provider: Ray v2's batches of one request (1 or 2 node
        types) in parallel, as its launcher pool runs them, or 2 to 6 requests at once; sometimes on a provider
        object that has not listed yet (a restarted monitor's first calls); with one launch fault or orphan."""
        w, rng = self.world, self.rng
        if len(self.expected) >= w.max_live:
            self.scale_down()
        if rng.random() < 0.3:
            self.provider = self.new_provider()     # no listing before the burst: the capped launch lists first
            self.reclaimed.clear()
            self.stats.fault("fresh_provider_burst")
        calls: list[tuple[str, str, int]] = []      # (node type, request id, count)
        if rng.random() < 0.5:
            request = f"req-{self.stats.requests}"
            self.stats.requests += 1
            for node_type in rng.sample(sorted(w.shapes), rng.randint(1, min(2, len(w.shapes)))):
                count = rng.randint(1, w.max_count)
                while count > 0:
                    calls.append((node_type, request, min(count, BATCH)))
                    count -= BATCH
            self.stats.fault("parallel_batches")
        else:
            for _ in range(rng.randint(2, 6)):
                calls.append((rng.choice(sorted(w.shapes)), f"req-{self.stats.requests}", rng.randint(1, BATCH)))
                self.stats.requests += 1
            self.stats.fault("concurrent_create_node")
        # Several requests at once spread over several objects of the cluster (fresh ones: before their first
        # listing, the capped launch lists first), or all on the main one. (One request's batches are one object's:
        # Ray runs a request in one autoscaler.)
        objects = [self.provider]
        if len({r for _, r, _ in calls}) == len(calls) > 1 and rng.random() < 0.5:
            objects = [self.new_provider() for _ in range(rng.randint(2, 4))]
            self.stats.several_objects += 1
            self.stats.fault("several_objects_burst")
        orphan = rng.random() < 0.15 and w.arm_orphan()
        if orphan:
            self.stats.fault("orphan")
        else:
            self.stats.fault(w.inject_launch_fault(rng))
        before = set(w.ours())
        outs: list[list[str] | None] = [None] * len(calls)
        errors: list[BaseException] = []
        start = threading.Barrier(len(calls))

        def one(i: int) -> None:
            node_type, request, n = calls[i]
            tags = dict(WORKER_TAGS, **{"ray-user-node-type": node_type, "ray-launch-request": request})
            try:
                start.wait(timeout=30)
                out = objects[i % len(objects)].create_node_with_resources_and_labels(
                    {}, tags, n, w.shapes[node_type], {})
                outs[i] = list(out or ())
            except NodeLaunchException as e:
                with self._sample_lock:
                    self.stats.refused += 1
                    self.stats.cost_refused += int(e.category == "MaxHourlyCostExceeded")
            except BaseException as e:  # noqa: BLE001 - re-raised in the matrix's thread
                errors.append(e)
            self.sample_cost()

        t0 = time.perf_counter()
        threads = [threading.Thread(target=one, args=(i,), name=f"burst-{i}") for i in range(len(calls))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        w.clear_launch_faults()
        self.stats.launch_wall_s.append(time.perf_counter() - t0)
        if errors:
            raise errors[0]
        self.stats.bursts += 1
        self.stats.calls += len(calls)
        returned = [i for out in outs if out for i in out]
        for (_, _, n), out in zip(calls, outs):
            assert out is None or len(out) == n, f"{w.name}: a call for {n} returned {out}"
        assert len(returned) == len(set(returned)), f"{w.name}: an id was returned to two calls: {returned}"
        after = set(w.ours())
        assert before <= after, f"{w.name}: a burst ended machines {sorted(before - after)}"
        self.stats.returned_terminated += len(set(returned) - after)
        gained = after - before
        orphans = gained - set(returned)
        assert not orphans or orphan, f"{w.name}: the cloud gained {sorted(orphans)} no call returned"
        self.stats.duplicates += 0 if orphan else len(orphans)
        self.stats.orphans += len(orphans)
        self.expected |= gained
        self.stats.launched += len(returned)
        self.sample_cost()

    def scale_down(self) -> None:
        ours = sorted(self.expected)
        victims = self.rng.sample(ours, len(ours) // 2 + 1)
        self.provider.terminate_nodes(victims)
        self.expected -= set(victims)

    def terminate_some(self) -> None:
        ours = sorted(self.expected)
        if not ours:
            return
        victims = self.rng.sample(ours, self.rng.randint(1, min(4, len(ours))))
        victims.append(self.rng.choice(self.world.foreign_ids))     # Ray never does this; a bug might
        if self.rng.random() < 0.2:
            self.world.fail_terminates()
            self.stats.fault("terminate_failed")
            try:
                self.provider.terminate_nodes(victims)
                raise AssertionError("a refused terminate must raise")
            except BackendError:
                pass
            finally:
                self.world.clear_terminate_fault()
            self.query()            # the next refresh retries the terminate
        else:
            self.provider.terminate_nodes(victims)
        self.expected -= set(victims)

    def reclaim(self) -> None:
        ours = sorted(self.expected)
        if ours:
            victim = self.rng.choice(ours)
            m = self.provider.view.known(victim)
            if m is not None:
                self.reclaimed.add((m.tags.get(TAG_INSTANCE_TYPE, ""), m.tags.get(TAG_ZONE, ""),
                                    m.tags.get(TAG_CAPACITY, "")))
            self.world.reclaim(victim)
            self.expected.discard(victim)
            self.stats.fault("reclaimed")

    def restart(self) -> None:
        self.provider = self.new_provider()
        self.reclaimed.clear()              # the new object's capacity memory starts empty
        self.stats.fault("restart")
        r = self.rng.random()
        if r >= 0.3:
            if r < 0.6 and self.world.empty_first_listing():
                # The fresh object's first page comes back empty while the cluster runs (what `ray down` saw).
                self.stats.fault("empty_first_listing")
        else:
            self.world.fail_next_listing()
            self.stats.fault("list_failure_after_restart")
            try:
                self.provider.non_terminated_nodes({})
                raise AssertionError("a provider that never listed must raise, not answer empty")
            except ListingError:
                pass
        self.query()      # Ray keeps asking; the first good listing is the restarted provider's state

    def glitch_listing(self) -> None:
        self.stats.fault(self.world.glitch_next_listing(self.rng))

    def overlap(self) -> None:
        """Another provider object of the cluster (an old monitor still running, `ray down --workers-only` from a
        laptop) ends some machines: the main object must not read that as spot interruptions."""
        ours = sorted(self.expected)
        if not ours:
            return
        victims = self.rng.sample(ours, self.rng.randint(1, min(3, len(ours))))
        other = self.world.new_provider()
        other.non_terminated_nodes({})
        other.terminate_nodes(victims)
        self.expected -= set(victims)
        self.stats.fault("overlapping_provider_terminate")

    def _lag_ends_in_the_ledger(self) -> None:
        """The cost cap's ledger hands landed machines over for the listing's lag (launch/shared_holds.py); the
        matrix ends that lag with each step (`unhide`), and its worlds forget ended machines at once (`tidy`, as
        EC2 does after an hour): so the ledger's hand-overs end with the step too, as they would by then."""
        h = SharedHolds(holds_path(CLUSTER, self._state.name), max_hold_s=0)
        with h.locked() as entries:
            if entries is not None:
                entries[:] = [e for e in entries if e.state == "holding"]

    # ----- invariants ------------------------------------------------------------------------------------------

    def query(self) -> list[str]:
        ids = self.provider.non_terminated_nodes({})
        for i in ids:
            self.provider.node_tags(i), self.provider.internal_ip(i), self.provider.is_running(i)
        return ids

    def check(self) -> None:
        w = self.world
        w.unhide()                  # the listing's lag ends with the step
        self._lag_ends_in_the_ledger()
        self.sample_cost()
        assert not self.over_cap, f"{w.name}: hourly cost {max(self.over_cap):.4f} over the cap {self.cap}"
        ids = set(self.query())
        ours = w.ours()
        self.stats.terminated_while_running += sum(1 for i in ours if i in self.expected
                                                   and self.provider.is_terminated(i))
        assert set(ours) == self.expected, \
            f"{w.name}: cloud {sorted(set(ours) ^ self.expected)} differ from what the provider returned"
        assert ids == self.expected, f"{w.name}: provider lists {sorted(ids ^ self.expected)} wrongly"
        w.check_foreign()
        bad = {i: t for i, t in ours.items() if t in w.forbidden}
        assert not bad, f"{w.name}: forbidden offerings run: {bad}"
        marked = {key for key, why in self.provider.unavailable.snapshot().items() if why == "interrupted"}
        misread = marked - self.reclaimed - self.misread
        self.misread |= misread
        self.stats.misread_interruptions += len(misread)
        if w.judges_reasons:
            assert not misread, f"{w.name}: offerings marked interrupted with no machine taken back: {misread}"

    def run(self, steps: int) -> Stats:
        t0 = time.perf_counter()
        try:
            self.query()
            actions = [(0.51, self.launch_request), (0.17, self.terminate_some), (0.07, self.reclaim),
                       (0.06, self.restart), (0.08, self.glitch_listing), (0.04, self.overlap),
                       (0.04, self.young_ended_outside), (0.03, self.retry_after_outside_end)]
            if self.cap is not None:        # a quarter of the launch steps are bursts
                actions[0:1] = [(0.38, self.launch_request), (0.13, self.burst)]
            for _ in range(steps):
                r, acc = self.rng.random(), 0.0
                for weight, action in actions:
                    acc += weight
                    if r < acc:
                        action()
                        break
                self.check()
                self.world.tidy()
            self.stats.steps = steps
            assert self.stats.duplicates == 0 and self.stats.returned_terminated == 0, self.stats
            assert (self.stats.terminated_while_running, self.stats.phantom_refusals,
                    self.stats.failed_retries) == (0, 0, 0), self.stats
            self.provider.terminate_nodes(self.query())
            self.expected.clear()
            self.check()
            assert self.new_provider().non_terminated_nodes({}) == []
        finally:
            self.world.close()
            self._state.cleanup()
        self.stats.wall_s = time.perf_counter() - t0
        return self.stats
