"""A seeded fault matrix through NodelessProvider on the in-memory backend, checking invariants after every step.
Shared by tests/launch/test_fault_matrix.py and benches/bench_fault_matrix.py.

Ray v2's call pattern (one request id, batches of at most 5 per node type), with capacity errors, throttling that
outlasts retries, lost launch responses, failed and empty listings, provider restarts (a new object, as when the
monitor restarts) and machines the cloud takes back. After every step:
- the cloud holds exactly the machines the provider returned, less those terminated or taken back (none lost, none
  doubled, none leaked), and every (request, node type, batch) has at most the machines it asked for;
- no machine of another cluster was touched;
- no query method raised (a provider that never listed successfully may raise ListingError: that is the contract);
- no machine runs on an offering the rules forbid.
At the end, teardown leaves nothing and a restarted provider sees nothing.
"""
from __future__ import annotations

import random
import time
from dataclasses import dataclass, field

from ray.autoscaler.node_launch_exception import NodeLaunchException

from ray_nodeless.core.catalog import embedded
from ray_nodeless.errors import BackendError, ListingError, TransientBackendError
from ray_nodeless.providers.base import TAG_CLUSTER, TAG_INSTANCE_TYPE
from ray_nodeless.ray_adapter.provider import NodelessProvider
from ray_nodeless.testing import fake_backend

PROVIDER = {
    "type": "external", "module": "ray_nodeless.NodelessProvider", "cloud": "fake", "simulate_cloud": "aws",
    "region": "us-west-2", "list_cache_s": 0, "max_candidates_per_launch": 6, "launch_retry_backoff_s": 0,
    "exclude": {"gpus": ["M60", "K80"], "families": ["g5"]},
    "rules": [
        {"name": "gpu-spot-first", "match": {"GPU": ">=1"}, "capacity": ["spot", "on-demand"]},
        {"name": "cpu", "match": {}, "capacity": ["on-demand"]},
    ],
}
WORKER_TAGS = {"ray-node-type": "worker", "ray-node-status": "uninitialized", "ray-node-name": "ray-c1-worker",
               "ray-launch-config": "abc"}
SHAPES = {"gpu": {"CPU": 4, "GPU": 1}, "cpu": {"CPU": 8}, "big_gpu": {"CPU": 16, "GPU": 1}}
BATCH = 5                      # Ray's AUTOSCALER_MAX_LAUNCH_BATCH


@dataclass
class Stats:
    requests: int = 0
    calls: int = 0
    launched: int = 0
    faults: dict[str, int] = field(default_factory=dict)
    refused: int = 0
    launch_wall_s: list[float] = field(default_factory=list)     # per create_node call

    def fault(self, name: str) -> None:
        self.faults[name] = self.faults.get(name, 0) + 1


class Matrix:
    def __init__(self, seed: int):
        self.rng = random.Random(seed)
        self.cloud = fake_backend.reset()
        self.provider = NodelessProvider(dict(PROVIDER), "c1")
        self.expected: set[str] = set()          # machines the provider returned and has not ended
        self.per_batch: dict[str, int] = {}      # request token -> machines created
        self.stats = Stats()
        foreign = fake_backend.FakeBackend(dict(PROVIDER), "other")
        spec = self.provider.launcher  # plan one machine for another cluster, straight through its backend
        plan = spec.plan("cpu", SHAPES["cpu"], {}, False)
        from ray_nodeless.launch.launcher import decision_tags
        from ray_nodeless.providers.base import LaunchSpec
        o = plan.chosen
        self.foreign_ids = foreign.launch(LaunchSpec(
            cluster_name="other", node_type="cpu", offering=o, count=2,
            tags=decision_tags("other", "x", o, "r"), node_config={}, request_token="foreign"))
        self.foreign_tags = {i: dict(self.cloud.machines[i].tags) for i in self.foreign_ids}
        rc = embedded().region("aws", "us-west-2")
        self.forbidden = {t.name for t in rc.types if t.gpu_model in ("M60", "K80") or t.family == "g5"}

    # ----- actions ---------------------------------------------------------------------------------------------

    def launch_request(self) -> None:
        node_type = self.rng.choice(sorted(SHAPES))
        count = self.rng.randint(1, 12)
        request = f"req-{self.stats.requests}"
        self.stats.requests += 1
        while count > 0:
            n = min(count, BATCH)
            count -= n
            self.maybe_inject()
            tags = dict(WORKER_TAGS, **{"ray-user-node-type": node_type, "ray-launch-request": request})
            before = len(self.cloud.launches)
            self.stats.calls += 1
            t0 = time.perf_counter()
            try:
                out = self.provider.create_node_with_resources_and_labels({}, tags, n, SHAPES[node_type], {})
            except NodeLaunchException:
                self.stats.refused += 1
                out = None
            self.stats.launch_wall_s.append(time.perf_counter() - t0)
            for spec in self.cloud.launches[before:]:
                made = len(self.cloud.tokens.get(spec.request_token, []))
                self.per_batch[spec.request_token] = made
                assert made <= n, f"batch token {spec.request_token} made {made} > {n}"
            if out:
                assert len(out) == n
                self.expected |= set(out)
                self.stats.launched += n
            self.cloud.capacity_faults.clear()

    def maybe_inject(self) -> None:
        r = self.rng.random()
        if r < 0.15:
            cap = self.rng.choice(["spot", "on-demand", "*"])
            self.cloud.capacity_faults[("*", self.rng.choice(["*", "us-west-2a", "us-west-2b"]), cap)] = \
                "InsufficientInstanceCapacity"
            self.stats.fault("capacity")
        elif r < 0.20:
            self.cloud.lost_responses = 1
            self.stats.fault("lost_response")
        elif r < 0.23:
            # More than the launcher's same-token retries: the batch fails cleanly (Ray retries the request).
            self.cloud.next_errors["launch"] = [TransientBackendError("Throttling", "RequestLimitExceeded")] * 3
            self.stats.fault("throttling_storm")

    def terminate_some(self) -> None:
        ours = sorted(self.expected)
        if not ours:
            return
        victims = self.rng.sample(ours, self.rng.randint(1, min(4, len(ours))))
        victims.append(self.rng.choice(self.foreign_ids))       # Ray never does this; a bug might
        if self.rng.random() < 0.2:
            self.cloud.next_errors["terminate"] = [BackendError("throttled", "RequestLimitExceeded")]
            self.stats.fault("terminate_failed")
            try:
                self.provider.terminate_nodes(victims)
                raise AssertionError("a refused terminate must raise")
            except BackendError:
                pass
            self.query()            # the next refresh retries the terminate
        else:
            self.provider.terminate_nodes(victims)
        self.expected -= set(victims)

    def reclaim(self) -> None:
        ours = sorted(self.expected)
        if ours:
            victim = self.rng.choice(ours)
            fake_backend.FakeBackend(dict(PROVIDER), "c1").reclaim(victim)
            self.expected.discard(victim)
            self.stats.fault("reclaimed")

    def restart(self) -> None:
        self.provider = NodelessProvider(dict(PROVIDER), "c1")
        self.stats.fault("restart")
        if self.rng.random() < 0.3:
            self.cloud.list_failures = 1
            self.stats.fault("list_failure_after_restart")
            try:
                self.provider.non_terminated_nodes({})
                raise AssertionError("a provider that never listed must raise, not answer empty")
            except ListingError:
                pass
        self.query()      # Ray keeps asking; the first good listing is the restarted provider's state

    def glitch_listing(self) -> None:
        if self.rng.random() < 0.5:
            self.cloud.list_failures = 1
            self.stats.fault("list_failure")
        else:
            self.cloud.next_errors["list"] = [RuntimeError("NoCredentialsError: unable to locate credentials")]
            self.stats.fault("list_exception")

    # ----- invariants ------------------------------------------------------------------------------------------

    def query(self) -> list[str]:
        ids = self.provider.non_terminated_nodes({})
        for i in ids:
            self.provider.node_tags(i), self.provider.internal_ip(i), self.provider.is_running(i)
        return ids

    def check(self) -> None:
        ids = set(self.query())
        ours = {mid for mid, m in self.cloud.machines.items() if m.tags.get(TAG_CLUSTER) == "c1"}
        assert ours == self.expected, f"cloud {sorted(ours ^ self.expected)} differ from what the provider returned"
        assert ids == self.expected
        for i in self.foreign_ids:
            assert i in self.cloud.machines and self.cloud.machines[i].tags == self.foreign_tags[i]
        for i in ours:
            assert self.cloud.machines[i].tags[TAG_INSTANCE_TYPE] not in self.forbidden

    def run(self, steps: int) -> Stats:
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
        self.provider.terminate_nodes(self.query())
        self.expected.clear()
        self.check()
        assert NodelessProvider(dict(PROVIDER), "c1").non_terminated_nodes({}) == []
        return self.stats
