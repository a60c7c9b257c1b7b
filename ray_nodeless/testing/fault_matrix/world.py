"""What the matrix needs of a backend and its cloud: a provider to drive, the cloud's truth read out of band, and
fault injection at the cloud's side (the in-memory cloud's knobs, HTTP answers of EC2 through botocore's
`before-send` event, the fake Compute server's faults), never inside ray_nodeless's own code."""
from __future__ import annotations

import abc
import random
from typing import Any

from ray_nodeless.core.catalog import embedded
from ray_nodeless.ray_adapter.provider import NodelessProvider

CLUSTER = "c1"


class World(abc.ABC):
    name: str = ""
    shapes: dict[str, dict[str, float]] = {}
    max_count = 12               # machines per launch request (Ray splits them into batches of 5)
    max_live = 60                # above this, a launch request first scales the cluster down
    forbidden: set[str]          # catalog instance type names the rules forbid
    foreign_ids: list[str]       # machines of another cluster, or untagged, placed in the cloud
    # The backend tells why a machine went (a terminate call or the cloud reclaiming it), so the matrix asserts
    # that no offering is marked interrupted by another object's terminate; False: counted only.
    judges_reasons = True

    def __init__(self, provider_config: dict[str, Any]):
        self.provider_config = provider_config

    def forbidden_types(self, cloud: str, region: str, gpus: set[str], families: set[str]) -> set[str]:
        rc = embedded().region(cloud, region)
        return {t.name for t in rc.types if t.gpu_model in gpus or t.family in families}

    def new_provider(self) -> NodelessProvider:
        """A new provider object (the monitor restarted), instrumented where the world needs it."""
        return NodelessProvider(dict(self.provider_config), CLUSTER)

    @abc.abstractmethod
    def start(self) -> None:
        """Reset the cloud and place the foreign machines."""

    @abc.abstractmethod
    def ours(self) -> dict[str, str]:
        """Live machines tagged as this cluster's in the cloud: id -> catalog instance type name."""

    @abc.abstractmethod
    def check_foreign(self) -> None:
        """Assert the foreign machines are exactly as placed."""

    @abc.abstractmethod
    def batch_mark(self) -> Any:
        """A mark of the cloud's creations so far."""

    @abc.abstractmethod
    def batch_made(self, mark: Any) -> dict[str, int]:
        """Machines created since `mark` (still live or not), per launch token or offering."""

    @abc.abstractmethod
    def inject_launch_fault(self, rng: random.Random) -> str | None:
        """Arm a fault for the next create_node call; returns its kind (None: no fault)."""

    @abc.abstractmethod
    def clear_launch_faults(self) -> None:
        """Disarm what inject_launch_fault armed (a capacity shortage lasts one call)."""

    @abc.abstractmethod
    def fail_terminates(self) -> None:
        """The cloud refuses terminates until clear_terminate_fault."""

    @abc.abstractmethod
    def clear_terminate_fault(self) -> None: ...

    @abc.abstractmethod
    def reclaim(self, machine_id: str) -> None:
        """The cloud takes the machine back (a spot interruption), out of band."""

    @abc.abstractmethod
    def fail_next_listing(self) -> None:
        """The next listing fails (beyond the backend's retries)."""

    @abc.abstractmethod
    def glitch_next_listing(self, rng: random.Random) -> str:
        """The next listing fails, raises something unexpected, or comes back empty; returns the kind."""

    @abc.abstractmethod
    def cost(self) -> float:
        """The cluster's hourly cost in the cloud now: the decision price tag of every live machine of ours."""

    def arm_orphan(self) -> bool:
        """Arm, for the next create_node call(s), a launch that makes its machines and raises anyway (the answer is
        lost and every retry fails too: the outcome is unknown, the machines run); False: not supported."""
        return False

    def hidden(self) -> set[str]:
        """Machines of ours the cloud's listing does not show yet (the listing's lag): none by default."""
        return set()

    def unhide(self) -> None:
        """The listing catches up: what `hidden` named is listed from now on."""

    def empty_first_listing(self) -> bool:
        """Arm an empty (successful) page for the next listing, a fresh object's first; False: not supported."""
        return False

    def tidy(self) -> None:
        """Called after every step, once the invariants held: housekeeping the cloud would do by itself."""

    def close(self) -> None:
        """Release what start() took (servers stay with their owner)."""
