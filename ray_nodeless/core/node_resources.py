"""The Ray resources of a node, from its instance type.

Two different questions, two functions:
- `ray_filled_resources`: what a node type's `resources` become at `ray up` when the node type is pinned to one
  instance type, exactly as Ray's own AWS provider computes it (`AWSNodeProvider.
  fillout_available_node_types_resources` in ray/autoscaler/_private/aws/node_provider.py): CPU = the type's
  vCPUs; for worker node types only, memory = int(SizeInMiB * 2**20 * (1 - DEFAULT_OBJECT_STORE_MEMORY_PROPORTION));
  each accelerator manager's count (`GPU` for NVIDIA GpuInfo, and the cores of other accelerators, e.g.
  `neuron_cores` for Inferentia2/Trainium) and one `accelerator_type:<name>`; then the declared resources override
  the detected ones. What differs per cloud (the name Ray gives a GPU model, accelerator cores per instance type,
  whether declared CPU/GPU keep Ray from filling at all) is a `FillRule`: data the backend config of the catalog's
  cloud supplies (`BackendConfig.fill_rule()`, e.g. providers/aws/ray_resources.py), so this module knows no cloud.
- `instance_resources`: the logical resources a launched machine advertises (what a local player node starts with).

Pure: Ray's constants are copied here (tests check them against the installed Ray).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Mapping

from ray_nodeless.core.documents import Document, DocumentView
from ray_nodeless.core import ttls
from ray_nodeless.core.catalog import InstanceType
from ray_nodeless.core.gpus import canonical_gpu

logger = logging.getLogger(__name__)

MIB = 1024 ** 2
# ray._private.ray_constants.DEFAULT_OBJECT_STORE_MEMORY_PROPORTION (Ray's default, without its env override).
OBJECT_STORE_MEMORY_PROPORTION = 0.3


@dataclass(frozen=True)
class FillRule:
    """The cloud's part of Ray's fill-in of a pinned node type's resources: what that cloud's own Ray provider
    detects beyond CPU, GPU and memory. The default is Ray's generic rule (GPU models named as the catalog names
    them, no other accelerators, declared resources merged on top of the detected ones)."""

    # Canonical GPU model (core/gpus.py) -> the name Ray puts in `accelerator_type:<name>`; models not listed are
    # spelled the same.
    gpu_names: Mapping[str, str] = field(default_factory=dict)
    # Accelerator cores per instance type name (lower case), advertised as `cores_resource` with one
    # `accelerator_type:<cores_accelerator>` (AWS: Neuron cores of Inferentia2 / Trainium).
    accelerator_cores: Mapping[str, int] = field(default_factory=dict)
    cores_resource: str = ""
    cores_accelerator: str = ""
    # The cloud's own provider fills nothing for a node type that declares CPU or GPU (Ray's GCP provider fills
    # nothing at all; one declaring neither still gets the rule, or the autoscaler could never scale it).
    declared_shape_kept: bool = False

    def keeps(self, declared: DocumentView) -> bool:
        """True when `declared` resources stay as written (no fill-in at all) under this rule."""
        return self.declared_shape_kept and bool({"CPU", "GPU"} & set(declared))


GENERIC_FILL = FillRule()


def size_in_mib(t: InstanceType) -> int:
    """The type's memory in MiB, as EC2's `MemoryInfo.SizeInMiB` (the catalog stores GiB rounded to 4 decimals)."""
    return int(round(t.memory_gib * 1024))


def task_memory_bytes(t: InstanceType) -> int:
    """Ray's `memory` resource of a node of type `t`: its memory less the object store's default share."""
    return int(size_in_mib(t) * MIB * (1 - OBJECT_STORE_MEMORY_PROPORTION))


def ray_accelerator_name(t: InstanceType, rule: FillRule) -> str:
    """The `accelerator_type:` name Ray gives this type's GPUs under `rule` (EC2's GpuInfo name on AWS)."""
    return rule.gpu_names.get(t.gpu_model, t.gpu_model)


def ray_autodetected_resources(t: InstanceType, is_head: bool, rule: FillRule) -> dict[str, int]:
    """What the cloud's own Ray provider detects for a node type pinned to `t` (Ray's AWS provider's rule, with
    the cloud's part from `rule`), before the declared resources override it.

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
        name = ray_accelerator_name(t, rule)
        if canonical_gpu(name) == t.gpu_model:
            out[f"accelerator_type:{name}"] = 1
        else:
            logger.warning("%s: not adding Ray's accelerator_type:%s (ray_nodeless calls this GPU %s and would "
                           "refuse the type for that resource)", t.name, name, t.gpu_model)
    cores = rule.accelerator_cores.get(t.name.lower())
    if cores:
        out[rule.cores_resource] = cores
        out[f"accelerator_type:{rule.cores_accelerator}"] = 1
    return out


def ray_filled_resources(t: InstanceType, declared: Document | None, is_head: bool, *,
                         rule: FillRule) -> Document:
    """A node type's resources after Ray's fill-in for instance type `t` under the cloud's `rule` (the backend
    config of `t.cloud` supplies it): detected, then declared on top. Whether to fill at all is `rule.keeps`."""
    out: Document = ray_autodetected_resources(t, is_head, rule)
    out.update(declared or {})
    return out


def instance_resources(t: InstanceType, declared: Document | None) -> dict[str, float]:
    """The Ray resources a machine of type `t` advertises: its CPUs, GPUs and memory, plus declared custom ones."""
    out: dict[str, float] = {k: float(v) for k, v in sorted((declared or {}).items())
                             if k not in ("CPU", "GPU", "memory")}
    out["CPU"] = float(t.vcpus)
    if t.gpu_count:
        out["GPU"] = float(t.gpu_count)
        out.setdefault(f"accelerator_type:{t.gpu_model}", 1.0)
    out["memory"] = float(int(t.memory_gib * (1024 ** 3) * ttls.TASK_MEMORY_FRACTION))
    return out
