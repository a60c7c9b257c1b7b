"""The REAL KubeRay operator against a test control plane, and the one thing it cannot get here: a kubelet for its
head pod.

`RealOperator` runs the `ray-operator` binary scripts/k8s/build_go.sh built (github.com/ray-project/kuberay/
ray-operator at the version of scripts/k8s/versions.env) out of cluster, as the control plane's admin, watching the
tests' namespace only, without leader election, its metrics and health endpoints on 127.0.0.1. It creates the head
pod, the head service and the RayCluster's status itself, and reconciles the worker groups as it does in a cluster.
(Its own ClusterRole from the module's config/rbac is not applied: the tests check the bridge's RBAC, not the
operator's.)

`HeadPodStandIn` plays the kubelet of that head pod, because no container can run here (no image registry, no
container runtime for a Ray image):
- a Node for the head pod only (`ray-nodeless.test/head-host` label and NoSchedule taint; the test's head template
  selects and tolerates it), Ready, its Lease renewed, so the real scheduler binds the operator's head pod to it;
- once bound, the pod's containers as local processes: the Ray container as a Ray head on 127.0.0.1 on the pod's
  `port` rayStartParam (`ray start --head --no-monitor`, the flags the operator passes when no autoscaler of its own
  runs, minus its 0.0.0.0 dashboard), and the bridge's container (`ray-nodeless-autoscaler`) as its command and args
  from the pod, unchanged, with the pod's env (values and field references resolved, `$(VAR)` expanded as a kubelet
  does). What a pod would have and a host process has not is given through the environment: KUBECONFIG (the pod's
  ServiceAccount's token, in place of the mounted one) and RAY_NODELESS_GCS_ADDRESS (the head's GCS on 127.0.0.1: a
  host process shares no network namespace with the head);
- the pod's status as a kubelet posts it (Running, podIP 127.0.0.1, every container ready), so the operator marks the
  RayCluster ready; and a kubelet's part in its deletion (SIGTERM to the bridge's container, then the final delete).
The bridge's container is a `Bridge` (testing/kuberay.py): tests kill and restart it as a kubelet restarts a
container.
"""
from __future__ import annotations

import contextlib
import datetime as dt
import os
import re
import shlex
import subprocess
import threading
import urllib.request
from pathlib import Path
from typing import Any, Iterator

from kubernetes import client
from kubernetes.client.rest import ApiException

from ray_nodeless.kuberay import sidecar
from ray_nodeless.testing.clock import wait_for
from ray_nodeless.testing.k8s_control_plane import bin_dir
from ray_nodeless.testing.k8s_support import _child_setup, _free_ports, _kill_group, _tail
from ray_nodeless.testing.kuberay import NS, RAY_ENV, REPO_ROOT, Bridge
from ray_nodeless.testing.ray_processes import free_port, head_process
from ray_nodeless.testing.service_network import ServiceNetwork

HEAD_HOST_LABEL = "ray-nodeless.test/head-host"
HEARTBEAT_S = 10
STARTUP_TIMEOUT_S = 60


class RealOperator:
    """`ray-operator` as a process of its own (see the module docstring)."""

    def __init__(self, plane: Any, workdir: Path, namespace: str = NS, network: ServiceNetwork | None = None):
        """`network`: the cluster network it reaches Ray heads' dashboards through (a RayJob's submission)."""
        self.plane, self.workdir, self.namespace, self.network = plane, Path(workdir), namespace, network
        self.log = self.workdir / "ray-operator.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> "RealOperator":
        self.workdir.mkdir(parents=True, exist_ok=True)
        metrics, health = _free_ports(2)
        argv = [str(bin_dir() / "ray-operator"), f"--kubeconfig={self.plane.admin_kubeconfig}",
                "--enable-leader-election=false", f"--watch-namespace={self.namespace}",
                f"--metrics-addr=127.0.0.1:{metrics}", f"--health-probe-bind-address=127.0.0.1:{health}",
                "--log-stdout-encoder=console"]
        env = dict(os.environ)
        if self.network is not None:     # Go proxies neither loopback nor NO_PROXY: the API server is reached as is
            env.update(HTTP_PROXY=self.network.url, http_proxy=self.network.url, NO_PROXY="127.0.0.1,localhost",
                       no_proxy="127.0.0.1,localhost")
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=_child_setup(
                                             threading.current_thread() is threading.main_thread()))
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

        def ready() -> bool:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"ray-operator exited ({self.proc.returncode}):\n{_tail(self.log)}")
            try:
                with opener.open(f"http://127.0.0.1:{health}/readyz", timeout=2) as r:
                    return r.status == 200
            except OSError:
                return False

        wait_for(ready, STARTUP_TIMEOUT_S, "the KubeRay operator ready", interval=0.3)
        return self

    def stop(self) -> None:
        if self.proc is not None:
            _kill_group(self.proc)
            self.proc = None

    def tail(self) -> str:
        return _tail(self.log)


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _field(pod: Any, path: str) -> str:
    """A pod's downward-API field as a kubelet resolves a fieldRef (the paths KubeRay's containers use)."""
    m = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", path)
    if m:
        return (getattr(pod.metadata, m.group(1)) or {}).get(m.group(2), "")
    return {"metadata.name": pod.metadata.name, "metadata.namespace": pod.metadata.namespace,
            "metadata.uid": pod.metadata.uid, "spec.nodeName": pod.spec.node_name or "",
            "spec.serviceAccountName": pod.spec.service_account_name or "", "status.podIP": "127.0.0.1",
            "status.hostIP": "127.0.0.1"}.get(path, "")


def container_env(pod: Any, container: Any) -> dict[str, str]:
    """The container's env as a kubelet gives it: values (with `$(VAR)` of earlier entries expanded) and field
    references; secret and config map references are not used by these tests and are left out."""
    env: dict[str, str] = {}
    for e in container.env or []:
        if e.value is not None:
            env[e.name] = expand(e.value, env)
        elif e.value_from is not None and e.value_from.field_ref is not None:
            env[e.name] = _field(pod, e.value_from.field_ref.field_path)
    return env


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' `$(VAR)` expansion in command, args and env values (`$$` escapes; unknown names stay)."""
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                  lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), text)


class HeadPodStandIn:
    """The head pod's kubelet, played (see the module docstring). `bridge` is the bridge's container once running."""

    def __init__(self, api: client.ApiClient, cluster: str, workdir: Path, sa_kubeconfig: Path,
                 extra_env: dict[str, str] | None = None, *, host_label: str | None = None, dashboard: bool = False,
                 head_env: dict[str, str] | None = None):
        """`host_label`: the value of the head host's label and taint the head template selects (default: the
        cluster's name; a RayJob's template knows its own name only, not the RayCluster's the operator makes of
        it). `dashboard`: the Ray head runs its dashboard (with the job API) on 127.0.0.1 at the pod's
        `--dashboard-port`, which a RayJob's submission needs; off otherwise (it costs a second of CPU and memory).
        `head_env`: added to the Ray head's environment (a RayService's application code on its PYTHONPATH, as an
        image would hold it)."""
        self.core = client.CoreV1Api(api)
        self.coord = client.CoordinationV1Api(api)
        self.cluster, self.workdir, self.sa_kubeconfig = cluster, Path(workdir), Path(sa_kubeconfig)
        self.extra_env = dict(extra_env or {})
        self.host_label = host_label or cluster
        self.dashboard = dashboard
        self.head_env = dict(head_env or {})
        self.node = f"{self.host_label}-head-host"
        self.bridge: Bridge | None = None
        self.pod: Any = None
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None

    # ---------------------------------------------------------------- the Node
    def add_node(self) -> None:
        self.core.create_node({"metadata": {"name": self.node, "labels": {HEAD_HOST_LABEL: self.host_label}},
                               "spec": {"taints": [{"key": HEAD_HOST_LABEL, "value": self.host_label,
                                                    "effect": "NoSchedule"}]}})
        capacity = {"cpu": "16", "memory": "64Gi", "pods": "110"}
        now = _now()
        self.core.patch_node_status(self.node, {"status": {
            "capacity": capacity, "allocatable": capacity,
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}, {"type": "Hostname", "address": self.node}],
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "lastHeartbeatTime": now,
                            "lastTransitionTime": now, "message": "played for the head pod"}]}})
        self._beat = threading.Thread(target=self._heartbeat, name=f"head-host-{self.cluster}", daemon=True)
        self._beat.start()

    def _heartbeat(self) -> None:
        while True:
            now = dt.datetime.now(dt.timezone.utc)
            with contextlib.suppress(Exception):      # an API server restart: the next beat retries
                try:
                    self.coord.patch_namespaced_lease(self.node, "kube-node-lease",
                                                      {"spec": {"renewTime": now.isoformat()}})
                except ApiException as e:
                    if e.status != 404:
                        raise
                    self.coord.create_namespaced_lease("kube-node-lease", {
                        "metadata": {"name": self.node}, "spec": {
                            "holderIdentity": self.node, "leaseDurationSeconds": 40, "renewTime": now.isoformat()}})
                self.core.patch_node_status(self.node, {"status": {"conditions": [
                    {"type": "Ready", "status": "True", "reason": "KubeletReady", "lastHeartbeatTime": _now()}]}})
            if self._stop.wait(HEARTBEAT_S):
                return

    # ---------------------------------------------------------------- the pod
    def wait_bound(self, timeout: float = 120) -> Any:
        """The operator's head pod once the scheduler has bound it to the head host."""
        sel = f"ray.io/cluster={self.cluster},ray.io/node-type=head"

        def bound() -> Any:
            pods = [p for p in self.core.list_namespaced_pod(NS, label_selector=sel).items
                    if p.spec.node_name == self.node and not p.metadata.deletion_timestamp]
            return pods[0] if pods else None

        self.pod = wait_for(bound, timeout, "the operator's head pod bound to the head host", interval=0.3)
        return self.pod

    def mark_running(self) -> None:
        pod, now = self.pod, _now()
        self.core.patch_namespaced_pod_status(pod.metadata.name, NS, {"status": {
            "phase": "Running", "podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}], "hostIP": "127.0.0.1",
            "startTime": now,
            "conditions": [{"type": t, "status": "True", "lastTransitionTime": now}
                           for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")],
            "containerStatuses": [{"name": c.name, "image": c.image or "", "imageID": "", "ready": True,
                                   "started": True, "restartCount": 0, "state": {"running": {"startedAt": now}}}
                                  for c in pod.spec.containers]}})

    def _watch_pod(self) -> None:
        """A kubelet's part in a pod's deletion: once the pod has a deletionTimestamp (the garbage collector's,
        after the RayCluster's deletion), the containers get SIGTERM (the bridge's: its process group, SIGKILL after
        the grace period), then the pod object is removed for good (the kubelet's final delete, grace 0)."""
        name, uid = self.pod.metadata.name, self.pod.metadata.uid
        while not self._stop.wait(1.0):
            try:
                pod = self.core.read_namespaced_pod(name, NS)
            except ApiException as e:
                if e.status == 404:
                    return
                continue
            except Exception:       # an API server restart: look again
                continue
            if pod.metadata.uid != uid or not pod.metadata.deletion_timestamp:
                continue
            try:
                if self.bridge is not None:      # SIGTERM, SIGKILL after the pod's grace period (30 s default)
                    grace = pod.spec.termination_grace_period_seconds
                    self.bridge.stop(float(30 if grace is None else grace))
                self.core.delete_namespaced_pod(name, NS, grace_period_seconds=0, body=client.V1DeleteOptions(
                    grace_period_seconds=0, preconditions=client.V1Preconditions(uid=uid)))
                return
            except Exception as e:      # say why in the test's output, and try again
                print(f"head pod stand-in: the pod's final delete failed ({type(e).__name__}: {e}); again in 1 s")

    def _ray_start(self, flag: str) -> str | None:
        """A flag's value in the pod's `ray start` command (the operator's rendering of rayStartParams)."""
        ray = self.pod.spec.containers[0]
        m = re.search(rf"--{flag}=(\S+)", " ".join([*(ray.command or []), *(ray.args or [])]))
        return m.group(1) if m else None

    def head_port(self) -> int:
        return int(self._ray_start("port") or 6379)

    def head_args(self) -> tuple[str, ...]:
        """The stand-in head's own flags: no monitor (the operator's `--no-monitor` when its autoscaler is off), and
        the dashboard when asked for, on 127.0.0.1 at the pod's port (8265, Ray's default, if the pod names none)."""
        # Ray's system config as the pod's command gives it (convert's `enable_autoscaler_v2` for Ray's v2
        # autoscaler: kuberay/sidecar.py), unquoted as the pod's shell would
        system = self._ray_start("system-config")
        own = ("--no-monitor", *([f"--system-config={shlex.split(system)[0]}"] if system else []))
        if not self.dashboard:
            return own
        return (*own, "--include-dashboard=true", "--dashboard-host=127.0.0.1",
                f"--dashboard-port={self._ray_start('dashboard-port') or 8265}",
                f"--dashboard-agent-listen-port={free_port()}", f"--dashboard-agent-grpc-port={free_port()}",
                f"--metrics-export-port={free_port()}")

    def identity(self) -> dict[str, str]:
        """The Ray node's identity as the operator's env of the pod's Ray container gives it (RAY_CLOUD_INSTANCE_ID:
        the pod's name; RAY_NODE_TYPE_NAME: its group), resolved as a kubelet resolves fieldRefs. The rest of that
        env (RAY_ADDRESS, RAY_PORT, ...) names the pod's network, which a host process lacks."""
        env = container_env(self.pod, self.pod.spec.containers[0])
        return {k: env[k] for k in ("RAY_CLOUD_INSTANCE_ID", "RAY_NODE_TYPE_NAME") if k in env}

    def bridge_container(self) -> Bridge:
        """The bridge's container of the operator's pod, as a process: its command and args unchanged."""
        [c] = [c for c in self.pod.spec.containers if c.name == sidecar.CONTAINER]
        env = container_env(self.pod, c)
        argv = [expand(a, env) for a in [*(c.command or []), *(c.args or [])]]
        env = RAY_ENV | {"PYTHONPATH": str(REPO_ROOT), "KUBECONFIG": str(self.sa_kubeconfig),
                         "RAY_NODELESS_GCS_ADDRESS": f"127.0.0.1:{self.head_port()}"} | env | self.extra_env
        return Bridge(argv, env, self.workdir / "bridge.log")

    @contextlib.contextmanager
    def running(self, timeout: float = 120) -> Iterator["HeadPodStandIn"]:
        """The Node, the operator's head pod bound and Running, its Ray head and the bridge's container started;
        afterwards all of it stopped and the Node deleted."""
        self.add_node()
        try:
            self.wait_bound(timeout)
            port = self.head_port()
            temp_dir = f"/tmp/rnk-{port}"
            Path(temp_dir).mkdir(parents=True, exist_ok=True)
            head_env = RAY_ENV | {"RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0"} | self.identity() | self.head_env
            with head_process(head_env, port, temp_dir, self.head_args()):
                self.mark_running()
                self.bridge = self.bridge_container()
                self.bridge.start()
                watcher = threading.Thread(target=self._watch_pod, name=f"head-pod-{self.cluster}", daemon=True)
                watcher.start()
                try:
                    yield self
                finally:
                    self.bridge.stop()
        finally:
            self._stop.set()
            if self._beat is not None:
                self._beat.join(timeout=HEARTBEAT_S + 5)
            with contextlib.suppress(ApiException):
                self.core.delete_node(self.node)


def wait_status_ready(objects: client.CustomObjectsApi, name: str, timeout: float = 120) -> dict:
    """The RayCluster once the operator reports it ready (its head pod Running and ready)."""
    def ready() -> dict | None:
        rc = objects.get_namespaced_custom_object("ray.io", "v1", NS, "rayclusters", name)
        return rc if (rc.get("status") or {}).get("state") == "ready" else None

    rc = wait_for(ready, timeout, f"RayCluster {name} ready (the operator's status)", interval=0.5)
    assert rc is not None
    return rc
