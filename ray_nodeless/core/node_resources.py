"""The Ray resources of a node, from its instance type.

Two different questions, two functions:
- `ray_filled_resources`: what a node type's `resources` become at `ray up` when the node type is pinned to one
  instance type, exactly as Ray's own AWS provider computes it (`AWSNodeProvider.
  fillout_available_node_types_resources` in ray/autoscaler/_private/aws/node_provider.py): CPU = the type's
  vCPUs; for worker node types only, memory = int(SizeInMiB * 2**20 * (1 - DEFAULT_OBJECT_STORE_MEMORY_PROPORTION));
  each accelerator manager's count (`GPU` for NVIDIA GpuInfo, `neuron_cores` for Inferentia2/Trainium) and one
  `accelerator_type:<name>`; then the declared resources override the detected ones.
- `instance_resources`: the logical resources a launched machine advertises (what a local player node starts with).

Pure: Ray's constants are copied here (tests check them against the installed Ray).
"""
from __future__ import annotations

import logging
from typing import Any

from ray_nodeless.core import ttls
from ray_nodeless.core.catalog import InstanceType
from ray_nodeless.core.gpus import canonical_gpu

logger = logging.getLogger(__name__)

MIB = 1024 ** 2
# ray._private.ray_constants.DEFAULT_OBJECT_STORE_MEMORY_PROPORTION (Ray's default, without its env override).
OBJECT_STORE_MEMORY_PROPORTION = 0.3
# ray._private.accelerators.neuron.AWS_NEURON_INSTANCE_MAP: NeuronCores per instance type (Ray's resource
# `neuron_cores`, accelerator type `aws-neuron-core`); Ray knows no other Neuron types.
AWS_NEURON_CORES = {
    "trn1.2xlarge": 2, "trn1.32xlarge": 32, "trn1n.32xlarge": 32,
    "inf2.xlarge": 2, "inf2.8xlarge": 2, "inf2.24xlarge": 12, "inf2.48xlarge": 24,
}
NEURON_CORES_RESOURCE = "neuron_cores"
AWS_NEURON_CORE = "aws-neuron-core"        # ray.util.accelerators.AWS_NEURON_CORE
# Canonical GPU model (core/gpus.py) -> the `GpuInfo.Gpus[0].Name` EC2 reports, which is what Ray puts in
# `accelerator_type:<name>`. Models not listed are spelled the same.
AWS_GPU_NAMES = {
    "A100-80GB": "A100",
    "T4G": "T4g",
    "RTX-PRO-4500": "RTX PRO 4500",
    "RTX-PRO-6000": "RTX PRO Server 6000",
    "RADEON-PRO-V520": "Radeon Pro V520",
}


def size_in_mib(t: InstanceType) -> int:
    """The type's memory in MiB, as EC2's `MemoryInfo.SizeInMiB` (the catalog stores GiB rounded to 4 decimals)."""
    return int(round(t.memory_gib * 1024))


def task_memory_bytes(t: InstanceType) -> int:
    """Ray's `memory` resource of a node of type `t`: its memory less the object store's default share."""
    return int(size_in_mib(t) * MIB * (1 - OBJECT_STORE_MEMORY_PROPORTION))


def ray_accelerator_name(t: InstanceType) -> str:
    """The `accelerator_type:` name Ray gives this type's GPUs (EC2's GpuInfo name on AWS, the model elsewhere)."""
    if t.cloud == "aws":
        return AWS_GPU_NAMES.get(t.gpu_model, t.gpu_model)
    return t.gpu_model


def ray_autodetected_resources(t: InstanceType, is_head: bool) -> dict[str, int]:
    """What Ray's AWS provider detects for a node type pinned to `t`, before the declared resources override it.

    One deliberate difference: `accelerator_type:<name>` is left out when Ray's name would not select this very
    type under ray_nodeless's GPU vocabulary (p4de.24xlarge: EC2 names its GPUs `A100`, the catalog `A100-80GB`),
    because the planner reads that resource as the GPU model the node must have and would then refuse the type.
    """
    out: dict[str, int] = {"CPU": int(t.vcpus)}
    if not is_head:
        # Ray: "we only autodetect worker node type memory resource"
        out["memory"] = task_memory_bytes(t)
    if t.gpu_count:
        out["GPU"] = int(t.gpu_count)
        name = ray_accelerator_name(t)
        if canonical_gpu(name) == t.gpu_model:
            out[f"accelerator_type:{name}"] = 1
        else:
            logger.warning("%s: not adding Ray's accelerator_type:%s (ray_nodeless calls this GPU %s and would "
                           "refuse the type for that resource)", t.name, name, t.gpu_model)
    cores = AWS_NEURON_CORES.get(t.name.lower()) if t.cloud == "aws" else None
    if cores:
        out[NEURON_CORES_RESOURCE] = cores
        out[f"accelerator_type:{AWS_NEURON_CORE}"] = 1
    return out


def ray_filled_resources(t: InstanceType, declared: dict[str, Any] | None, is_head: bool) -> dict[str, Any]:
    """A node type's resources after Ray's fill-in for instance type `t`: detected, then declared on top."""
    out: dict[str, Any] = ray_autodetected_resources(t, is_head)
    out.update(declared or {})
    return out


def instance_resources(t: InstanceType, declared: dict[str, Any] | None) -> dict[str, float]:
    """The Ray resources a machine of type `t` advertises: its CPUs, GPUs and memory, plus declared custom ones."""
    out: dict[str, float] = {k: float(v) for k, v in sorted((declared or {}).items())
                             if k not in ("CPU", "GPU", "memory")}
    out["CPU"] = float(t.vcpus)
    if t.gpu_count:
        out["GPU"] = float(t.gpu_count)
        out.setdefault(f"accelerator_type:{t.gpu_model}", 1.0)
    out["memory"] = float(int(t.memory_gib * (1024 ** 3) * ttls.TASK_MEMORY_FRACTION))
    return out
