"""A RayCluster spec as the API server stores it: the defaults of KubeRay's CRD (v1.5.0, `ray.io_rayclusters.yaml`,
the same `RayClusterSpec` in RayJob's `rayClusterSpec` and RayService's `rayClusterConfig`) applied, outside the
Kubernetes core types it embeds (pod templates, env sources, the head service: their defaults are Kubernetes' own and
play no part in Ray's derivation).

Why: `convert` and `plan` read a manifest file, the bridge reads the stored object. Ray's derivation
(`_derive_autoscaling_config_from_ray_cr`) indexes `maxReplicas` and `minReplicas`, so a worker group that leaves
them to the CRD's defaults worked under the bridge and ended in `KeyError('maxReplicas')` in `plan`. Pure;
tests/kuberay/test_crd_defaults.py checks this table against the CRD the project builds and against what the real
API server stores."""
from __future__ import annotations

import copy
from typing import Any, Mapping

# KubeRay v1.5.0 WorkerGroupSpec's `+kubebuilder:default` markers (raycluster_types.go): every default of the
# RayClusterSpec schema outside the Kubernetes core types.
WORKER_GROUP_DEFAULTS: dict[str, Any] = {"replicas": 0, "minReplicas": 0, "maxReplicas": 2147483647, "numOfHosts": 1}


def with_defaults(spec: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of the RayCluster `spec` with the CRD's defaults where a key is absent (a null stays null: the API
    server prunes nothing there and Ray's derivation treats it as it is). Shapes it cannot default (a group that is
    not a mapping) are left for kuberay/shape.py to name."""
    out = copy.deepcopy(dict(spec))
    groups = out.get("workerGroupSpecs")
    if isinstance(groups, list):
        out["workerGroupSpecs"] = [{**WORKER_GROUP_DEFAULTS, **g} if isinstance(g, dict) else g for g in groups]
    return out
