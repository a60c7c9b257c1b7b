"""Helpers shared by the tests: one cluster-YAML builder, and the one polling loop (`wait_for`, which lives with
`FakeClock` in `ray_nodeless.testing.clock` because product-side test support uses it too)."""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Mapping

import yaml

from ray_nodeless.testing.clock import FakeClock, wait_for

__all__ = ["FakeClock", "wait_for", "cluster_config", "write_cluster_yaml", "HEAD", "GPU_WORKER", "RAY_KEYS"]

PROVIDER_HEADER = {"type": "external", "module": "ray_nodeless.NodelessProvider"}
HEAD = {"resources": {"CPU": 2}, "node_config": {}, "max_workers": 0}
GPU_WORKER = {"resources": {"CPU": 4, "GPU": 1}, "node_config": {}}
# The keys Ray's own config loading fills in before anything reads a cluster YAML (empty: nothing to run), for tests
# that hand the dict to Ray's code (NodeProviderAdapter, bootstrap) rather than only to ours.
RAY_KEYS = {"auth": {"ssh_user": "ray"}, "setup_commands": [], "head_setup_commands": [], "worker_setup_commands": [],
            "file_mounts": {}, "cluster_synced_files": [], "initialization_commands": [],
            "head_start_ray_commands": [], "worker_start_ray_commands": [], "idle_timeout_minutes": 5}


def cluster_config(provider: Mapping[str, Any], *, name: str = "c1", workers: Mapping[str, Any] | None = None,
                   head: Mapping[str, Any] | None = None, max_workers: int = 2, ray_keys: bool = False,
                   **top: Any) -> dict[str, Any]:
    """A cluster YAML as a dict: `provider` (under `type: external` / `module: ray_nodeless.NodelessProvider`), a
    head node type `head` (2 CPUs, no workers of its own, or `head`) and the worker node types `workers` (default:
    `gpu_worker`, 4 CPUs and a GPU), no setup commands. `ray_keys` adds every key Ray's loading fills in (`RAY_KEYS`);
    `top` sets any other top-level key (`max_workers` of the cluster, `head_node`, ...). Every part is a copy."""
    doc: dict[str, Any] = {
        "cluster_name": name, "max_workers": max_workers,
        "setup_commands": [], "head_setup_commands": [], "worker_setup_commands": [],
        "provider": {**PROVIDER_HEADER, **copy.deepcopy(dict(provider))},
        "available_node_types": {"head": copy.deepcopy(dict(head or HEAD)),
                                 **copy.deepcopy(dict(workers if workers is not None else {"gpu_worker": GPU_WORKER}))},
        "head_node_type": "head",
    }
    if ray_keys:
        doc.update(copy.deepcopy(RAY_KEYS))
    doc.update(copy.deepcopy(top))
    return doc


def write_cluster_yaml(path: Path, config: Mapping[str, Any]) -> str:
    """Write `config` as YAML to `path`; the path as a string (what the CLI and Ray's readers take)."""
    path.write_text(yaml.safe_dump(dict(config)))
    return str(path)
