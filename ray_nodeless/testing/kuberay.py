"""KubeRay's side of the KubeRay bridge's tests and bench, played (the operator cannot be built here: Go modules are
not reachable): the RayCluster CRD as a 1.20 API server takes it, the autoscaler Role KubeRay gives the head's
ServiceAccount, the operator's head pod / head service / status (`Operator`), a RayCluster from KubeRay's sample with
a GPU group under the bridge (`raycluster`), and `ray-nodeless kuberay-autoscaler` as its container runs (`Bridge`).
Only what the bridge relies on is played (README "KubeRay"); the operator creates no worker pods, as the real one
creates none for a group with replicas 0 / minReplicas 0."""
from __future__ import annotations

import copy
import os
import signal
import subprocess
import sys
from pathlib import Path

import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from ray_nodeless.kuberay import bridge as K
from ray_nodeless.testing.clock import wait_for
from ray_nodeless.testing.ray_processes import kill_group

REPO_ROOT = Path(__file__).resolve().parents[2]
DATA = REPO_ROOT / "tests" / "data" / "kuberay"
RBAC = REPO_ROOT / "cluster-configs" / "kuberay" / "rbac.yaml"
NS, SA = "ray", "raycluster-gpu"      # the names cluster-configs/kuberay/rbac.yaml binds
BIN = Path(sys.executable).parent
# Where the bridge and drivers run: no RAY_ADDRESS of the developer's own cluster, token auth off.
RAY_ENV = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {
    "RAY_AUTH_MODE": "disabled", "PATH": f"{BIN}:{os.environ.get('PATH', '')}"}


LIST_MAP_KEYS = ("x-kubernetes-list-type", "x-kubernetes-list-map-keys")


def strip_validations(obj):
    """The CRD as a 1.20 API server takes it: without `x-kubernetes-validations` (CEL rules, 1.25+) and without
    the 146 `default: ""` of name fields (1.20 reads an empty-string default as null: "in body must be of type
    string"); the lists keyed by such a field (x-kubernetes-list-type: map, which needs the key defaulted) become
    plain lists. Nothing the bridge reads changes."""
    if isinstance(obj, dict):
        if obj.get("x-kubernetes-list-type") == "map":
            obj = {k: v for k, v in obj.items() if k not in LIST_MAP_KEYS}
        return {k: strip_validations(v) for k, v in obj.items()
                if k != "x-kubernetes-validations" and not (k == "default" and v == "")}
    if isinstance(obj, list):
        return [strip_validations(v) for v in obj]
    return obj


def kuberay_role(namespace: str, name: str) -> dict:
    """The Role KubeRay gives the head's ServiceAccount with autoscaling on (common/rbac.go BuildRole)."""
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": name, "namespace": namespace},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "patch"]},
                      {"apiGroups": ["ray.io"], "resources": ["rayclusters"], "verbs": ["get", "patch"]}]}


def install_kuberay(plane, work: Path) -> Path:
    """On a started ControlPlane: the RayCluster CRD, the namespace, the head's ServiceAccount with KubeRay's Role and
    cluster-configs/kuberay/rbac.yaml. Returns that ServiceAccount's kubeconfig."""
    api = plane.api_client()
    try:
        crd = strip_validations(yaml.safe_load((DATA / "ray.io_rayclusters.yaml").read_text()))
        ext = client.ApiextensionsV1Api(api)
        ext.create_custom_resource_definition(crd)
        wait_for(lambda: any(c.type == "Established" and c.status == "True" for c in
                             ext.read_custom_resource_definition(crd["metadata"]["name"]).status.conditions or []),
                 60, "the CRD established")
        core = client.CoreV1Api(api)
        try:
            core.create_namespace({"metadata": {"name": NS}})
        except ApiException as e:
            if e.status != 409:     # a plane shared with other tests (tests/k8s_plane.py) may have it already
                raise
        core.create_namespaced_service_account(NS, {"metadata": {"name": SA}})
        rbac = client.RbacAuthorizationV1Api(api)
        rbac.create_namespaced_role(NS, kuberay_role(NS, SA))
        rbac.create_namespaced_role_binding(NS, {
            "metadata": {"name": SA}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": SA},
            "subjects": [{"kind": "ServiceAccount", "name": SA, "namespace": NS}]})
    finally:
        api.close()
    plane.apply_manifest(RBAC)
    return plane.service_account_kubeconfig(NS, SA, work / "sa.kubeconfig")


class Operator:
    """The KubeRay operator's part the bridge relies on, played: the RayCluster as applied, the head pod object and
    head service (owned by the RayCluster, as the operator makes them), the status; no worker pods."""

    def __init__(self, api: client.ApiClient):
        self.objects = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)

    def apply(self, rc: dict) -> dict:
        rc = self.objects.create_namespaced_custom_object("ray.io", "v1", NS, "rayclusters", rc)
        name, uid = rc["metadata"]["name"], rc["metadata"]["uid"]
        owner = [{"apiVersion": "ray.io/v1", "kind": "RayCluster", "name": name, "uid": uid, "controller": True,
                  "blockOwnerDeletion": True}]
        head = rc["spec"]["headGroupSpec"]["template"]
        self.core.create_namespaced_pod(NS, {
            "metadata": {"name": f"{name}-head", "ownerReferences": owner,
                         "labels": {"ray.io/cluster": name, "ray.io/node-type": "head", "ray.io/group": "headgroup"}},
            "spec": {**head["spec"], "serviceAccountName": SA}})
        self.core.create_namespaced_service(NS, {
            "metadata": {"name": f"{name}-head-svc", "ownerReferences": owner},
            "spec": {"selector": {"ray.io/cluster": name, "ray.io/node-type": "head"},
                     "ports": [{"name": "gcs", "port": 6379}]}})
        self.objects.patch_namespaced_custom_object_status("ray.io", "v1", NS, "rayclusters", name, {
            "status": {"state": "ready", "head": {"serviceName": f"{name}-head-svc", "podIP": "127.0.0.1"}}})
        return rc

    def get(self, name: str) -> dict | None:
        try:
            return self.objects.get_namespaced_custom_object("ray.io", "v1", NS, "rayclusters", name)
        except client.ApiException as e:
            if e.status == 404:
                return None
            raise

    def patch(self, name: str, body: dict) -> None:
        self.objects.patch_namespaced_custom_object("ray.io", "v1", NS, "rayclusters", name, body)

    def delete(self, name: str) -> None:
        self.objects.delete_namespaced_custom_object("ray.io", "v1", NS, "rayclusters", name)


def raycluster(name: str, gcs_port: int, state_dir: Path, sa_kubeconfig: Path, server: str, *, gpu_cpus: str = "4",
               gpu_memory: str = "8Gi", idle_s: int = 15) -> dict:
    """KubeRay's autoscaler sample, renamed, with a GPU group, the head's ServiceAccount and the annotation: the
    local backend (AWS us-west-2 prices), played kubelets joining by kubeadm, the head's GCS on this host."""
    [rc] = [d for d in yaml.safe_load_all((DATA / "ray-cluster.autoscaler.yaml").read_text())
            if d and d.get("kind") == "RayCluster"]
    rc = copy.deepcopy(rc)
    rc["metadata"] = {"name": name, "namespace": NS, "annotations": {K.ANNOTATION: yaml.safe_dump({
        "cloud": "local", "simulate_cloud": "aws", "region": "us-west-2", "state_dir": str(state_dir),
        "gcs_address": f"127.0.0.1:{gcs_port}",
        "kubernetes": {"kubeconfig": str(sa_kubeconfig), "played": True, "pod_grace_s": 5, "join_timeout_s": 300,
                       "join": {"method": "kubeadm", "endpoint": server, "token": "abcdef.0123456789abcdef",
                                "ca_cert_hash": "sha256:" + "0" * 64}},
        "exclude": {"gpus": ["M60", "K80"]},
        "rules": [{"name": "gpu-workers-spot-first", "match": {"node_kind": "worker", "GPU": ">=1"},
                   "capacity": ["spot", "on-demand"]},
                  {"name": "cpu-on-demand", "match": {}, "capacity": ["on-demand"]}],
    })}}
    rc["spec"]["autoscalerOptions"]["idleTimeoutSeconds"] = idle_s
    rc["spec"]["headGroupSpec"]["template"]["spec"]["serviceAccountName"] = SA
    gpu = copy.deepcopy(rc["spec"]["workerGroupSpecs"][0])
    gpu.update(groupName="gpu-group", replicas=0, minReplicas=0, maxReplicas=1)
    c = gpu["template"]["spec"]["containers"][0]
    c["resources"] = {"limits": {"cpu": gpu_cpus, "memory": gpu_memory, "nvidia.com/gpu": "1"},
                      "requests": {"cpu": gpu_cpus, "memory": gpu_memory, "nvidia.com/gpu": "1"}}
    c["env"] = [{"name": "MODEL", "value": "v1"}]
    gpu["template"]["metadata"] = {"labels": {"team": "ml"}}
    gpu["template"]["spec"]["serviceAccountName"] = SA     # the template's service account reaches the Ray pods
    rc["spec"]["workerGroupSpecs"].append(gpu)
    return rc


class Bridge:
    """`ray-nodeless kuberay-autoscaler` as the autoscaler container runs it (a process group of its own)."""

    def __init__(self, name: str, gcs: str, kubeconfig: Path, admin_kubeconfig: Path, log: Path):
        self.argv = [str(BIN / "ray-nodeless"), "kuberay-autoscaler", "--cluster-name", name, "--cluster-namespace",
                     NS, "--gcs-address", gcs, "--kubeconfig", str(kubeconfig)]
        self.env = RAY_ENV | {"AUTOSCALER_UPDATE_INTERVAL_S": "1", "PYTHONPATH": str(REPO_ROOT),
                              # the played kubelets register Nodes as a kubelet would, not as the head's account
                              "RAY_NODELESS_PLAYER_KUBECONFIG": str(admin_kubeconfig)}
        self.log = log
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(self.argv, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)

    def kill(self) -> None:
        if self.proc is not None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            kill_group(self.proc)

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:] if self.log.exists() else "(not started)"


