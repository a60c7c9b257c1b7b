"""One cross-cloud vocabulary of GPU models, so `gpus: [M60, K80]` means the same on AWS and GCP.

Canonical names are upper-case, with `-` for spaces. Cloud spellings (AWS `GpuInfo` names, GCE accelerator types
such as `nvidia-tesla-t4`) map here through `canonical_gpu()`. A100 with 80 GB of memory is its own model
(`A100-80GB`), as in SkyPilot, because users pick it by memory; GCP's H100 "Mega" is the same chip as H100.
"""
from __future__ import annotations

# GCE accelerator type -> canonical model. Also used in reverse by the GCP backend to attach accelerators.
GCE_ACCELERATOR_TYPES: dict[str, str] = {
    "nvidia-tesla-k80": "K80",
    "nvidia-tesla-p4": "P4",
    "nvidia-tesla-p100": "P100",
    "nvidia-tesla-t4": "T4",
    "nvidia-tesla-v100": "V100",
    "nvidia-l4": "L4",
    "nvidia-tesla-a100": "A100",
    "nvidia-a100-80gb": "A100-80GB",
    "nvidia-h100-80gb": "H100",
    "nvidia-h100-mega-80gb": "H100",
    "nvidia-h200-141gb": "H200",
    "nvidia-b200": "B200",
}
GCE_ACCELERATOR_FOR_MODEL: dict[str, str] = {
    "K80": "nvidia-tesla-k80",
    "P4": "nvidia-tesla-p4",
    "P100": "nvidia-tesla-p100",
    "T4": "nvidia-tesla-t4",
    "V100": "nvidia-tesla-v100",
    "L4": "nvidia-l4",
    "A100": "nvidia-tesla-a100",
    "A100-80GB": "nvidia-a100-80gb",
    "H100": "nvidia-h100-80gb",
    "H200": "nvidia-h200-141gb",
    "B200": "nvidia-b200",
}

_ALIASES: dict[str, str] = {
    "TESLA-T4": "T4",
    "TESLA-V100": "V100",
    "TESLA-K80": "K80",
    "TESLA-M60": "M60",
    "TESLA-P4": "P4",
    "TESLA-P100": "P100",
    "H100-MEGA": "H100",
    "A100-40GB": "A100",
    "RTX-PRO-SERVER-6000": "RTX-PRO-6000",
    "T4G": "T4G",
}

# Accelerators that are not CUDA GPUs: they never satisfy a Ray `GPU` demand.
NON_GPU_ACCELERATORS = frozenset({"INFERENTIA", "INFERENTIA2", "TRAINIUM", "TRAINIUM2", "QUALCOMM-AI100"})
# Makers whose devices EC2 lists under `GpuInfo` but that are not CUDA/ROCm GPUs (Gaudi, AI 100).
NON_GPU_MANUFACTURERS = frozenset({"Habana", "Qualcomm"})

# Memory per GPU (GiB) by canonical model, where a cloud does not state it: GCE's machine types and the reference
# CSVs give GPU counts but not their memory (EC2's DescribeInstanceTypes does, and wins there). Vendors' data sheets.
GPU_MEMORY_GIB: dict[str, float] = {
    "K80": 12, "M60": 8, "P4": 8, "P100": 16, "T4": 16, "V100": 16, "L4": 24, "A100": 40, "A100-80GB": 80,
    "H100": 80, "H200": 141, "B200": 180,
}
# EC2 names both A100 variants `A100`; the 80 GB one (p4de) is its own model here, told apart by memory per GPU
# (80 GiB nominal, 79.x as EC2 reports it in MiB).
A100_80GB_MIN_GIB = 79.0


def gpu_model_by_memory(model: str, memory_per_gpu_gib: float) -> str:
    """The canonical model once the memory per GPU is known: `A100` with >= 79 GiB is `A100-80GB`."""
    if model == "A100" and memory_per_gpu_gib >= A100_80GB_MIN_GIB:
        return "A100-80GB"
    return model


# Every model a user may name in `gpus` / `exclude_gpus` / `accelerator_type:` (canonical names). A name outside it is
# a typo (`K8O`), not a silent no-op: tests/core check that every model of the embedded catalog is here.
KNOWN_GPU_MODELS = frozenset({
    "A10", "A10G", "A100", "A100-80GB", "A40", "B200", "B300", "GH200", "H100", "H200", "K520", "K80", "L4", "L40",
    "L40S", "M60", "P4", "P100", "RADEON-PRO-V520", "RTX-PRO-4500", "RTX-PRO-6000", "T4", "T4G", "V100",
    "GAUDI-HL-205",
}) | set(GCE_ACCELERATOR_FOR_MODEL) | NON_GPU_ACCELERATORS


def canonical_gpu(name: str) -> str:
    """Map any cloud or user spelling of a GPU model to the canonical name ("nvidia-tesla-t4" -> "T4")."""
    raw = name.strip()
    if raw.lower() in GCE_ACCELERATOR_TYPES:
        return GCE_ACCELERATOR_TYPES[raw.lower()]
    key = raw.upper().replace(" ", "-").replace("_", "-")
    if key.startswith("NVIDIA-"):
        key = key[len("NVIDIA-"):]
    return _ALIASES.get(key, key)
