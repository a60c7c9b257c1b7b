"""KubeRay's side of the KubeRay bridge's tests and bench: KubeRay's CRDs (from the operator's module, unmodified) and
the RBAC of cluster-configs/kuberay/rbac.yaml (`install_kuberay`), a RayCluster from KubeRay's sample with a GPU group
as `convert` writes it for the bridge (`raycluster`), the operator's part played for the tests that need no real
operator (`Operator`: head pod object, head service, status; no worker pods, as the real one creates none for a
group with replicas 0 / minReplicas 0), and `ray-nodeless kuberay-autoscaler` as a process (`Bridge`). The real
operator and the head pod's stand-in: testing/kuberay_operator.py."""
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
from ray_nodeless.kuberay import sidecar
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


def crd_files() -> list[Path]:
    """KubeRay's CRDs (RayCluster, RayJob, RayService) from the operator's module at the version the tests build
    (scripts/k8s/build_go.sh copies them next to the operator), applied unmodified: the API server is current."""
    from ray_nodeless.testing.k8s_control_plane import cache_dir

    files = sorted((cache_dir() / "kuberay" / "crd").glob("ray.io_*.yaml"))
    if not files:
        raise FileNotFoundError(f"no KubeRay CRDs in {cache_dir() / 'kuberay' / 'crd'}: run scripts/k8s/build_go.sh")
    return files


def install_kuberay(plane, work: Path) -> Path:
    """On a started ControlPlane: KubeRay's CRDs, the namespace and cluster-configs/kuberay/rbac.yaml (the head's
    ServiceAccount and all the bridge needs). Returns that ServiceAccount's kubeconfig."""
    api = plane.api_client()
    try:
        ext = client.ApiextensionsV1Api(api)
        for path in crd_files():
            crd = yaml.safe_load(path.read_text())
            try:
                ext.create_custom_resource_definition(crd)
            except ApiException as e:
                if e.status != 409:
                    raise
            name = crd["metadata"]["name"]

            def established(n: str = name) -> bool:
                return any(c.type == "Established" and c.status == "True"
                           for c in ext.read_custom_resource_definition(n).status.conditions or [])

            wait_for(established, 60, f"the CRD {name} established")
        core = client.CoreV1Api(api)
        try:
            core.create_namespace({"metadata": {"name": NS}})
        except ApiException as e:
            if e.status != 409:     # a plane shared with other tests (tests/k8s_plane.py) may have it already
                raise
    finally:
        api.close()
    plane.apply_manifest(RBAC)
    return plane.service_account_kubeconfig(NS, SA, work / "sa.kubeconfig")


class Operator:
    """The RayCluster through the API, and with `played` (the default) the operator's part the bridge relies on:
    the head pod object and head service (owned by the RayCluster, as the operator makes them), the status; no
    worker pods. With `played=False` the real operator (testing/kuberay_operator.py) does that part."""

    def __init__(self, api: client.ApiClient, *, played: bool = True):
        self.objects = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)
        self.played = played

    def apply(self, rc: dict) -> dict:
        rc = self.objects.create_namespaced_custom_object("ray.io", "v1", NS, "rayclusters", rc)
        if not self.played:
            return rc
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
    # Ray's monitor loop every second (its default is 5 s): the walk-through's waits stay short
    rc["spec"]["autoscalerOptions"]["env"] = [{"name": "AUTOSCALER_UPDATE_INTERVAL_S", "value": "1"}]
    rc["spec"]["headGroupSpec"].setdefault("rayStartParams", {})["port"] = str(gcs_port)
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
    # the head pod as `convert` writes it: KubeRay's in-tree autoscaler off, the bridge's container in the head pod
    opts = rc["spec"].get("autoscalerOptions") or {}
    sidecar.install(rc["spec"], "spec", name,
                    opts.get("image") or rc["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["image"])
    return rc


class Bridge:
    """`ray-nodeless kuberay-autoscaler` as a process (a process group of its own): `argv` with `env`, its output in
    `log`. `Bridge.command` builds the command line the bridge tests and bench run it with; HeadPodStandIn
    (testing/kuberay_operator.py) runs the one the operator's head pod has."""

    def __init__(self, argv: list[str], env: dict[str, str], log: Path):
        self.argv, self.env, self.log = list(argv), dict(env), log
        self.proc: subprocess.Popen | None = None

    @classmethod
    def command(cls, name: str, gcs: str, kubeconfig: Path, admin_kubeconfig: Path, log: Path) -> "Bridge":
        argv = [str(BIN / "ray-nodeless"), "kuberay-autoscaler", "--cluster-name", name, "--cluster-namespace",
                NS, "--gcs-address", gcs, "--kubeconfig", str(kubeconfig)]
        env = RAY_ENV | {"AUTOSCALER_UPDATE_INTERVAL_S": "1", "PYTHONPATH": str(REPO_ROOT),
                         # the played kubelets register Nodes as a kubelet would, not as the head's account
                         "RAY_NODELESS_PLAYER_KUBECONFIG": str(admin_kubeconfig)}
        return cls(argv, env, log)

    def start(self) -> None:
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(self.argv, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)

    def kill(self) -> None:
        if self.proc is not None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self, grace_s: float | None = None) -> None:
        """SIGTERM, then SIGKILL after `grace_s` (kill_group's default when None), as a kubelet stops a container."""
        if self.proc is not None and self.proc.poll() is None:
            if grace_s is None:
                kill_group(self.proc)
            else:
                kill_group(self.proc, grace_s)

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:] if self.log.exists() else "(not started)"
