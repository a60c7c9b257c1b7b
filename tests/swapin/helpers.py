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
    "aws-example-gpu-docker.yaml": {
        False: "available_node_types.ray.head.gpu.node_config.InstanceType",
        True: "available_node_types.ray.head.gpu.node_config.InstanceType"},
    "gcp-example-gpu-docker.yaml": {
        False: "available_node_types.ray_head_gpu.node_config.machineType",
        True: "available_node_types.ray_head_gpu.node_config.guestAccelerators[0].acceleratorType"},
}
CONVERTS = sorted(f for f, o in OUTCOMES.items() if o[False] is None)


def example(name: str) -> Path:
    return EXAMPLES / name


def quiet_ray() -> None:
    for n in ("ray.autoscaler", "ray.autoscaler._private.util"):
        logging.getLogger(n).setLevel(logging.ERROR)


def prepared(config: dict[str, Any]) -> dict[str, Any]:
    """What `ray up` does to a YAML before the provider sees it (Ray's own function)."""
    from ray.autoscaler._private.util import prepare_config

    return prepare_config(copy.deepcopy(config))
