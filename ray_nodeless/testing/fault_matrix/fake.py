"""The matrix on the in-memory backend (`cloud: fake`, ray_nodeless/testing/fake_backend.py): the provider's own
cost, with many more requests per second than a wire-level fake allows."""
from __future__ import annotations

import random
from typing import Any, Callable

from ray_nodeless.core import ttls
from ray_nodeless.errors import BackendError, TransientBackendError
from ray_nodeless.launch.budget import TAG_REQUEST
from ray_nodeless.launch.decisions import decision_tags
from ray_nodeless.providers.base import TAG_CLUSTER, TAG_INSTANCE_TYPE, TAG_PRICE, LaunchSpec
from ray_nodeless.testing import fake_backend
from ray_nodeless.testing.fault_matrix.world import CLUSTER, World

PROVIDER = {
    "type": "external", "module": "ray_nodeless.NodelessProvider", "cloud": "fake", "simulate_cloud": "aws",
    "region": "us-west-2", "list_cache_s": 0, "max_candidates_per_launch": 6, "launch_retry_backoff_s": 0,
    "exclude": {"gpus": ["M60", "K80"], "families": ["g5"]},
    "rules": [
        {"name": "gpu-spot-first", "match": {"GPU": ">=1"}, "capacity": ["spot", "on-demand"]},
        {"name": "cpu", "match": {}, "capacity": ["on-demand"]},
    ],
}
SHAPES: dict[str, dict[str, float]] = {"gpu": {"CPU": 4, "GPU": 1}, "cpu": {"CPU": 8}, "big_gpu": {"CPU": 16, "GPU": 1}}


class FakeWorld(World):
    name = "fake"
    shapes = SHAPES

    def __init__(self, provider_config: dict[str, Any] | None = None):
        super().__init__(dict(provider_config or PROVIDER))
        self.forbidden = self.forbidden_types("aws", "us-west-2", {"M60", "K80"}, {"g5"})
        self.cloud = fake_backend.CLOUD

    def start(self) -> None:
        self.cloud = fake_backend.reset()
        foreign = fake_backend.FakeBackend.from_provider(dict(self.provider_config), "other")
        o = self.new_provider().launcher.plan("cpu", SHAPES["cpu"], {}, False).chosen
        self.foreign_ids = foreign.launch(LaunchSpec(
            cluster_name="other", node_type="cpu", offering=o, count=2,
            tags=decision_tags("other", "x", o, "r"), node_config={}, request_token="foreign"))
        self.foreign_tags = {i: dict(self.cloud.machines[i].tags) for i in self.foreign_ids}

    def ours(self) -> dict[str, str]:
        return {mid: m.tags.get(TAG_INSTANCE_TYPE, "") for mid, m in self.cloud.machines.items()
                if m.tags.get(TAG_CLUSTER) == CLUSTER}

    def cost(self) -> float:
        with self.cloud.lock:
            return sum(float(m.tags.get(TAG_PRICE, 0)) for m in self.cloud.machines.values()
                       if m.tags.get(TAG_CLUSTER) == CLUSTER)

    def arm_orphan(self) -> bool:
        """The next launch makes its machines and loses the answer, the launcher's retries with the same token
        fail (an outage), and the listing does not show those machines until the step ends (EC2's listing lag):
        only the orphan reservation keeps the cap meanwhile."""
        c = self.cloud
        mark = len(c.launches)
        calls = {"n": 0}

        def hook() -> None:
            calls["n"] += 1
            if calls["n"] == 2:
                c.next_errors["launch"] = [TransientBackendError("timeout", "RequestTimeout")
                                           for _ in range(ttls.TRANSIENT_LAUNCH_RETRIES)]

        def lagging(m: Any) -> bool:
            return len(c.launches) > mark and m.tags.get(TAG_REQUEST) == c.launches[mark].request_token
        c.lost_responses = 1
        c.hooks["launch"] = hook
        self._lagging: Callable[[Any], bool] | None = lagging
        c.hide = lagging
        return True

    def hidden(self) -> set[str]:
        lag = getattr(self, "_lagging", None)
        if lag is None:
            return set()
        with self.cloud.lock:
            return {mid for mid, m in self.cloud.machines.items() if lag(m)}

    def unhide(self) -> None:
        lag = getattr(self, "_lagging", None)
        if lag is not None and self.cloud.hide is lag:
            self.cloud.hide = None
        self._lagging = None

    def check_foreign(self) -> None:
        for i in self.foreign_ids:
            assert i in self.cloud.machines and self.cloud.machines[i].tags == self.foreign_tags[i]

    def batch_mark(self) -> int:
        return len(self.cloud.launches)

    def batch_made(self, mark: int) -> dict[str, int]:
        return {s.request_token: len(self.cloud.tokens.get(s.request_token, []))
                for s in self.cloud.launches[mark:]}

    def inject_launch_fault(self, rng: random.Random) -> str | None:
        r = rng.random()
        if r < 0.15:
            cap = rng.choice(["spot", "on-demand", "*"])
            self.cloud.capacity_faults[("*", rng.choice(["*", "us-west-2a", "us-west-2b"]), cap)] = \
                "InsufficientInstanceCapacity"
            return "capacity"
        if r < 0.20:
            self.cloud.lost_responses = 1
            return "lost_response"
        if r < 0.23:
            # More than the launcher's same-token retries: the batch fails cleanly (Ray retries the request).
            self.cloud.next_errors["launch"] = [TransientBackendError("Throttling", "RequestLimitExceeded")] * 3
            return "throttling_storm"
        return None

    def clear_launch_faults(self) -> None:
        self.cloud.capacity_faults.clear()
        self.cloud.lost_responses = 0
        self.cloud.next_errors.pop("launch", None)
        self.cloud.hooks.pop("launch", None)

    def fail_terminates(self) -> None:
        self.cloud.next_errors["terminate"] = [BackendError("throttled", "RequestLimitExceeded")]

    def clear_terminate_fault(self) -> None:
        self.cloud.next_errors.pop("terminate", None)

    def reclaim(self, machine_id: str) -> None:
        fake_backend.FakeBackend.from_provider(dict(self.provider_config), CLUSTER).reclaim(machine_id)

    def fail_next_listing(self) -> None:
        self.cloud.list_failures = 1

    def glitch_next_listing(self, rng: random.Random) -> str:
        r = rng.random()
        if r < 0.4:
            self.fail_next_listing()
            return "list_failure"
        if r < 0.8:
            self.cloud.next_errors["list"] = [RuntimeError("NoCredentialsError: unable to locate credentials")]
            return "list_exception"
        times = rng.choice([1, 2, 3])
        self._empty_pages(times)
        return "list_empty" if times == 1 else f"list_empty_x{times}"

    def empty_first_listing(self) -> bool:
        return self._empty_pages(1 + len(self.cloud.launches) % 2)

    def _empty_pages(self, times: int) -> bool:
        """The next `times` listings come back empty (the lookups by id still answer)."""
        calls = {"n": 0}

        def count() -> None:
            calls["n"] += 1
        self.cloud.hooks["list"] = count
        self.cloud.hide = lambda m: calls["n"] <= times
        return True
