"""The Ray pod templates the bridge hands the registration: a worker group's `template` made the template of the
pods the registration creates on the bridge's machines (worker_pod_template), and, for a RayCluster that declares no
worker group, the head's made a worker's (head_worker_template). Pure."""
from __future__ import annotations

import copy
import shlex
from typing import Any, Mapping

GROUP_LABEL = "ray-nodeless.io/group"
KUBERAY_CLUSTER = "ray.io/cluster"
KUBERAY_GROUP = "ray.io/group"
KUBERAY_NODE_TYPE = "ray.io/node-type"
KUBERAY_IS_RAY_NODE = "ray.io/is-ray-node"
GROUP, VERSION = "ray.io", "v1"
# rayStartParams the pod's `ray start` must not repeat: the machine's resources and labels come from ray_nodeless
# (RAY_OVERRIDE_RESOURCES / _LABELS), the address and --block from the pod's command.
_OWN_START_PARAMS = frozenset({"num-cpus", "num-gpus", "memory", "resources", "labels", "address", "block"})


def worker_pod_template(ray_cr: Mapping[str, Any], group: Mapping[str, Any]) -> dict[str, Any]:
    """A worker group's `template` as the template of the Ray pods the registration creates (pods.ray_pod adds the
    machine's nodeSelector, toleration, size and Ray environment):
    - labels: the template's, `ray.io/cluster`, `ray.io/node-type: worker`, `ray.io/is-ray-node: yes` and
      `ray-nodeless.io/group`, without `ray.io/group` (the operator must not count or delete these pods);
    - an ownerReference to the RayCluster (not as controller: the operator does not reconcile on these pods), so
      that Kubernetes' garbage collector deletes a pod the bridge could not;
    - no nodeSelector / node affinity: the group's scheduling was turned into the machine's rules, and the pod is
      bound to its machine's Node by the registration's machine-id selector;
    - the Ray container (containers[0], as in KubeRay) without `resources` (sized from its Node), running `ray start`
      with the group's rayStartParams, unless the template gives it a command."""
    meta = (ray_cr.get("metadata") or {})
    name = meta.get("name", "")
    t = copy.deepcopy(dict(group.get("template") or {}))
    tmeta = dict(t.get("metadata") or {})
    labels = {k: v for k, v in (tmeta.get("labels") or {}).items() if k != KUBERAY_GROUP}
    labels.update({KUBERAY_CLUSTER: name, KUBERAY_NODE_TYPE: "worker", KUBERAY_IS_RAY_NODE: "yes",
                   GROUP_LABEL: str(group.get("groupName", ""))})
    tmeta["labels"] = labels
    if meta.get("uid"):
        tmeta["ownerReferences"] = [{"apiVersion": f"{GROUP}/{VERSION}", "kind": "RayCluster", "name": name,
                                     "uid": meta["uid"], "blockOwnerDeletion": False}]
    t["metadata"] = tmeta
    spec = dict(t.get("spec") or {})
    spec.pop("nodeSelector", None)
    affinity = dict(spec.get("affinity") or {})
    affinity.pop("nodeAffinity", None)
    if affinity:
        spec["affinity"] = affinity
    else:
        spec.pop("affinity", None)
    containers = [dict(c) for c in spec.get("containers") or []]
    if containers:
        ray = containers[0]
        ray.pop("resources", None)
        if not ray.get("command") and not ray.get("args"):
            params = group.get("rayStartParams") or {}
            extra = [f"--{k}={shlex.quote(str(v))}" if str(v) != "true" else f"--{k}"
                     for k, v in sorted(params.items()) if k not in _OWN_START_PARAMS]
            ray["command"] = ["/bin/bash", "-lc", " ".join(["ray start --address=$(RAY_GCS_ADDRESS) --block",
                                                            *extra])]
        containers[0] = ray
        spec["containers"] = containers
    t["spec"] = spec
    return t


def head_worker_template(ray_cr: Mapping[str, Any]) -> dict[str, Any]:
    """The Ray pod template of a RayCluster that declares no worker group (shape-open: every worker is a generated
    node type), made of the head group's template as a worker group's would be (worker_pod_template): the head's
    image, env, volumes and service account, so a worker runs what the head runs. Left out: the head's other
    containers (the bridge's own among them), its ports, tolerations and rayStartParams (the head's `port`,
    `dashboard-host` or `num-cpus: "0"` are not a worker's), and the group label (there is no group). A user who
    wants another template declares a worker group: generated types then take the first group's."""
    head = (ray_cr.get("spec") or {}).get("headGroupSpec") or {}
    t = worker_pod_template(ray_cr, {"template": head.get("template") or {}})
    t["metadata"]["labels"].pop(GROUP_LABEL, None)
    spec = t["spec"]
    spec.pop("tolerations", None)
    containers = [dict(c) for c in spec.get("containers") or []][:1]
    for c in containers:
        c.pop("ports", None)
    spec["containers"] = containers
    mounted = {m.get("name") for c in containers for m in c.get("volumeMounts") or [] if isinstance(m, dict)}
    volumes = [v for v in spec.get("volumes") or [] if isinstance(v, dict) and v.get("name") in mounted]
    if volumes:
        spec["volumes"] = volumes
    else:
        spec.pop("volumes", None)
    return t
