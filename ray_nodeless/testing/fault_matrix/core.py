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
Counted too, and asserted 0: machines a batch made beyond its count (duplicates) and ids a create_node call
returned that were not running afterwards (returned-but-terminated).
At the end, teardown leaves nothing and a restarted provider sees nothing.
"""
from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ray.autoscaler.node_launch_exception import NodeLaunchException

from ray_nodeless.errors import BackendError, ListingError
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

    def fault(self, name: str | None) -> None:
        if name:
            self.faults[name] = self.faults.get(name, 0) + 1


class Matrix:
    def __init__(self, world: "World", seed: int):
        self.world = world
        self.rng = random.Random(seed)
        world.start()
        self.provider = world.new_provider()
        self.expected: set[str] = set()          # machines the provider returned and has not ended
        self.reclaimed: set[tuple[str, str, str]] = set()    # offerings of machines the cloud took back
        self.misread: set[tuple[str, str, str]] = set()      # offerings counted as misread already
        self.stats = Stats(backend=world.name)

    # ----- actions ---------------------------------------------------------------------------------------------

    def launch_request(self) -> None:
        w = self.world
        if len(self.expected) >= w.max_live:
            self.scale_down()                    # Ray ends idle nodes; keeps every listing cheap on slow fakes
        node_type = self.rng.choice(sorted(w.shapes))
        count = self.rng.randint(1, w.max_count)
        request = f"req-{self.stats.requests}"
        self.stats.requests += 1
        while count > 0:
            n = min(count, BATCH)
            count -= n
            self.stats.fault(w.inject_launch_fault(self.rng))
            tags = dict(WORKER_TAGS, **{"ray-user-node-type": node_type, "ray-launch-request": request})
            before = set(w.ours())
            mark = w.batch_mark()
            self.stats.calls += 1
            t0 = time.perf_counter()
            try:
                out = self.provider.create_node_with_resources_and_labels({}, tags, n, w.shapes[node_type], {})
            except NodeLaunchException:
                self.stats.refused += 1
                out = None
            finally:
                w.clear_launch_faults()
            self.stats.launch_wall_s.append(time.perf_counter() - t0)
            made_per_batch = w.batch_made(mark)
            self.stats.duplicates += sum(max(0, made - n) for made in made_per_batch.values())
            for key, made in made_per_batch.items():
                assert made <= n, f"{w.name}: batch {key} made {made} machines > {n}"
            after = set(w.ours())
            self.stats.returned_terminated += len(set(out or ()) - after)
            assert before <= after, f"{w.name}: a launch ended machines {sorted(before - after)}"
            assert after - before == set(out or ()), \
                f"{w.name}: the cloud gained {sorted(after - before)}, the call returned {sorted(out or ())}"
            if out:
                assert len(out) == n
                self.expected |= set(out)
                self.stats.launched += n

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
        self.provider = self.world.new_provider()
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

    # ----- invariants ------------------------------------------------------------------------------------------

    def query(self) -> list[str]:
        ids = self.provider.non_terminated_nodes({})
        for i in ids:
            self.provider.node_tags(i), self.provider.internal_ip(i), self.provider.is_running(i)
        return ids

    def check(self) -> None:
        w = self.world
        ids = set(self.query())
        ours = w.ours()
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
            actions = [(0.57, self.launch_request), (0.18, self.terminate_some), (0.07, self.reclaim),
                       (0.06, self.restart), (0.08, self.glitch_listing), (0.04, self.overlap)]
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
            self.provider.terminate_nodes(self.query())
            self.expected.clear()
            self.check()
            assert self.world.new_provider().non_terminated_nodes({}) == []
        finally:
            self.world.close()
        self.stats.wall_s = time.perf_counter() - t0
        return self.stats
