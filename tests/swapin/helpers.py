"""Shared by the swap-in tests: the corpus of Ray's example YAMLs and what each is expected to give."""
from __future__ import annotations

import copy
import logging
from pathlib import Path
from typing import Any

EXAMPLES = Path(__file__).resolve().parent.parent / "data" / "ray-examples"
PROJECT = "test-project"

# file -> None (converts) or {free_instance_types: the key the error names}
OUTCOMES: dict[str, dict[bool, str | None]] = {
    "aws-example-full.yaml": {False: None, True: None},
    "aws-example-minimal.yaml": {False: None, True: None},
    "gcp-example-minimal.yaml": {False: None, True: None},
    # p2.xlarge (K80) is retired: pinned, ray_nodeless can neither price nor launch it; freed, its shape comes from
    # convert's table of retired EC2 types and the planner picks any GPU model (no offering has K80 any more).
    "aws-example-gpu-docker.yaml": {
        False: "available_node_types.ray.head.gpu.node_config.InstanceType",
        True: None},
    # custom-6-16384 (no custom rates in the catalog) and K80 (retired by GCP): freed, the shape from the name and
    # any GPU model.
    "gcp-example-gpu-docker.yaml": {
        False: "available_node_types.ray_head_gpu.node_config.machineType",
        True: None},
}
# (file, free_instance_types) pairs that convert
CASES = [(f, free) for f in sorted(OUTCOMES) for free in (False, True) if OUTCOMES[f][free] is None]
# files that convert in at least one mode
CONVERTS = sorted({f for f, _ in CASES})
# what Ray's own provider would launch is not in the catalog (retired or custom): no `before` price
BEFORE_UNPRICED = {"aws-example-gpu-docker.yaml": {"ray.head.gpu"},
                   "gcp-example-gpu-docker.yaml": {"ray_head_gpu", "ray_worker_gpu"}}


def example(name: str) -> Path:
    return EXAMPLES / name


def quiet_ray() -> None:
    for n in ("ray.autoscaler", "ray.autoscaler._private.util"):
        logging.getLogger(n).setLevel(logging.ERROR)


def prepared(config: dict[str, Any]) -> dict[str, Any]:
    """What `ray up` does to a YAML before the provider sees it (Ray's own function)."""
    from ray.autoscaler._private.util import prepare_config

    return prepare_config(copy.deepcopy(config))
