"""Ray's v1 autoscaler's ResourceDemandScheduler (`ray.autoscaler._private.resource_demand_scheduler`): the
decision `ray-nodeless simulate` replays, called as the v1 autoscaler calls it."""
from __future__ import annotations

import contextlib
import logging
from typing import Any, Iterator, Mapping

_RDS = "ray.autoscaler._private.resource_demand_scheduler"
RAY_NAMES = ((_RDS, "ResourceDemandScheduler"),
             ("ray.autoscaler._private.node_provider_availability_tracker", "NodeAvailabilitySummary"))


def demand_scheduler(provider: Any, node_types: Mapping[str, Any], max_workers: int, head_node_type: str,
                     upscaling_speed: float) -> Any:
    """A ResourceDemandScheduler over `provider` (anything with node_tags(id) and internal_ip(id))."""
    from ray.autoscaler._private.resource_demand_scheduler import ResourceDemandScheduler

    return ResourceDemandScheduler(provider, dict(node_types), max_workers, head_node_type, upscaling_speed)


def no_availability() -> Any:
    """The NodeAvailabilitySummary of a cluster where no launch has failed yet."""
    from ray.autoscaler._private.node_provider_availability_tracker import NodeAvailabilitySummary

    return NodeAvailabilitySummary(node_availabilities={})


@contextlib.contextmanager
def quiet_scheduler() -> Iterator[None]:
    """The scheduler's warnings silenced (it warns on every call while demand exceeds max_workers: in a replay that
    is expected, not news)."""
    rds_logger = logging.getLogger(_RDS)
    level = rds_logger.level
    rds_logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        rds_logger.setLevel(level)
