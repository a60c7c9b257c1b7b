"""Facts about the clouds' instance types that no API states in a usable form, written down once.

The embedded catalog's builder (`scripts/build_catalog.py`) and the live refreshers (`providers/aws/catalog.py`,
`providers/gcp/catalog.py`) read them from here, so an embedded and a live catalog describe a type alike (tests
compare the two). GPU facts (models, their memory) are in `core/gpus.py`.
"""
from __future__ import annotations

# EC2 families with CPU credits (T-series): a sustained load is throttled to the baseline, so the planner never
# picks them unless named (`core/plan.py` reason `burstable`). DescribeInstanceTypes also says
# `BurstablePerformanceSupported`; the reference CSVs the embedded catalog is built from do not.
AWS_BURSTABLE_FAMILIES = frozenset({"t1", "t2", "t3", "t3a", "t4g"})

# GCE shared-core machine types (a fraction of a vCPU, bursting): the API's `isSharedCpu`; the CSVs lack it.
GCP_BURSTABLE_TYPES = frozenset({"e2-micro", "e2-small", "e2-medium", "f1-micro", "g1-small"})

# GCE families on Arm (Ampere Altra / Google Axion). The API states `architecture: ARM64`; the CSVs do not.
GCP_ARM_FAMILIES = frozenset({"t2a", "c4a", "n4a"})


def aws_family(instance_type: str) -> str:
    """`m5.large` -> `m5`."""
    return instance_type.split(".", 1)[0]


def gcp_family(machine_type: str) -> str:
    """`n2-standard-8` -> `n2`."""
    return machine_type.split("-", 1)[0]


def aws_burstable(instance_type: str) -> bool:
    return aws_family(instance_type) in AWS_BURSTABLE_FAMILIES


def gcp_burstable(machine_type: str) -> bool:
    return machine_type in GCP_BURSTABLE_TYPES
