"""The Ray resources a machine advertises, from its instance type: what Ray's own cloud providers fill in."""
from __future__ import annotations

from typing import Any

from ray_nodeless.core import ttls
from ray_nodeless.core.catalog import InstanceType
from ray_nodeless.core.requirements import GIB


def instance_resources(t: InstanceType, declared: dict[str, Any] | None) -> dict[str, float]:
    """The Ray resources a machine of type `t` advertises: its CPUs, GPUs and memory, plus declared custom ones."""
    out: dict[str, float] = {k: float(v) for k, v in sorted((declared or {}).items())
                             if k not in ("CPU", "GPU", "memory")}
    out["CPU"] = float(t.vcpus)
    if t.gpu_count:
        out["GPU"] = float(t.gpu_count)
        out.setdefault(f"accelerator_type:{t.gpu_model}", 1.0)
    out["memory"] = float(int(t.memory_gib * GIB * ttls.TASK_MEMORY_FRACTION))
    return out
