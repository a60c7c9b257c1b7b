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
- no machine runs on an offering the rules forbid.
At the end, teardown leaves nothing and a restarted provider sees nothing.
"""
from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ray.autoscaler.node_launch_exception import NodeLaunchException

from ray_nodeless.errors import BackendError, ListingError

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
            for key, made in w.batch_made(mark).items():
                assert made <= n, f"{w.name}: batch {key} made {made} machines > {n}"
            after = set(w.ours())
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
            self.world.reclaim(victim)
            self.expected.discard(victim)
            self.stats.fault("reclaimed")

    def restart(self) -> None:
        self.provider = self.world.new_provider()
        self.stats.fault("restart")
        if self.rng.random() < 0.3:
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

    def run(self, steps: int) -> Stats:
        t0 = time.perf_counter()
        try:
            self.query()
            actions = [(0.6, self.launch_request), (0.2, self.terminate_some), (0.07, self.reclaim),
                       (0.06, self.restart), (0.07, self.glitch_listing)]
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
            self.provider.terminate_nodes(self.query())
            self.expected.clear()
            self.check()
            assert self.world.new_provider().non_terminated_nodes({}) == []
        finally:
            self.world.close()
        self.stats.wall_s = time.perf_counter() - t0
        return self.stats
