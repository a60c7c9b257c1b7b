"""A played kubelet: registers each machine's Node exactly as its join user data says, keeps it Ready, and runs the
Ray pods the real scheduler binds to it as local `ray start --block` processes.

No machine boots when machines are played (local processes, EC2 under moto; `kubernetes.played: true`), so this
plays the part of the kubelet that the machine's user data would have started. `PlayedBackend` (played.py) calls
it after its inner backend launched or terminated a machine; the Kubernetes registration never sees it:
- `play(machine_id, user_data, ...)` parses the user data (`core.kube_join.parse_user_data`, the formats the
  registration writes: eks NodeConfig, kubeadm JoinConfiguration, k3s agent flags) and registers the Node with those
  labels and taints (the API server adds
  `node.kubernetes.io/not-ready`; the controller-manager's node lifecycle controller lifts it once the Node is
  Ready), capacity and allocatable from the instance type (cpu, memory, `nvidia.com/gpu`, pods), a Lease in
  `kube-node-lease`, and, for eks, the providerID `aws:///<zone>/<id>` (the Node name is then not the machine id).
- One heartbeat thread renews every Node's Ready condition and Lease (like the kubelet's node status / lease
  controllers) and notices a Ray process that died (pod phase Failed).
- One watch on the namespace's pods: a pod bound (`spec.nodeName`) to a played Node is run with
  `LocalNodeProcesses` (RAY_CLOUD_INSTANCE_ID and Ray's resources from the pod's env), and its status is set
  Running with podIP = the process's 127.0.0.N (Failed if Ray does not start). A pod being deleted has its process
  stopped and is then removed (grace 0), as a kubelet confirms a deletion.
- `forget(machine_id)`: the machine was terminated. Its heartbeats and Ray processes stop at once; deletions of its
  pods are still confirmed (nothing is left to stop), which stands in for the API server's collection of a gone
  machine's pods, so the registration's reaper deletes the Node without waiting out the pod's grace. The entry goes
  when the Node is deleted.
"""
from __future__ import annotations

import datetime as dt
import json
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from ray_nodeless.core import kube_join as L
from ray_nodeless.core.catalog import Offering
from ray_nodeless.core.kube_join import JoinedNode, parse_user_data, pod_env
from ray_nodeless.providers.local.processes import LocalNodeProcesses

logger = logging.getLogger(__name__)

HEARTBEAT_S = 5.0          # node status + lease renewal (kubelet: 10 s; shorter keeps test latency low)
LEASE_DURATION_S = 40
WATCH_TIMEOUT_S = 20
MAX_PODS = "110"


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _micro_now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def node_capacity(offering: Offering) -> dict[str, str]:
    t = offering.instance_type
    cap = {"cpu": str(int(t.vcpus)) if float(t.vcpus).is_integer() else f"{int(t.vcpus * 1000)}m",
           "memory": f"{int(t.memory_gib * 1024)}Mi", "pods": MAX_PODS, "ephemeral-storage": "100Gi"}
    if t.gpu_count:
        cap[L.GPU_RESOURCE] = str(int(t.gpu_count))
    return cap


@dataclass
class PlayedNode:
    machine_id: str
    name: str
    joined: JoinedNode
    registered_at: float = 0.0
    ready_at: float = 0.0
    pods: set[str] = field(default_factory=set)
    gone: bool = False          # the machine was terminated: no heartbeat, no new pod; see forget()


class KubeletPlayer:
    """Plays the kubelet of every machine given to `play`. Thread-safe; `close()` stops threads and processes."""

    def __init__(self, api: client.ApiClient, namespace: str, processes: LocalNodeProcesses):
        self.api = api
        self.core = client.CoreV1Api(api)
        self.coord = client.CoordinationV1Api(api)
        self.namespace = namespace
        self.processes = processes
        self.nodes: dict[str, PlayedNode] = {}          # node name -> played node
        self.pod_ips: dict[str, str] = {}               # pod name -> ip
        self._starting: set[str] = set()
        self._forgotten: set[str] = set()               # machines terminated: never (re)registered from here
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._heartbeat_loop, name="kubelet-player-heartbeat", daemon=True),
                         threading.Thread(target=self._pod_loop, name="kubelet-player-pods", daemon=True)]
        for t in self._threads:
            t.start()

    # ------------------------------------------------------------------------------------------------- nodes

    def play(self, machine_id: str, user_data: str, offering: Offering, *, wait: bool = False) -> None:
        """Register the Node of this machine as its user data says (in a thread unless `wait`)."""
        joined = parse_user_data(user_data, machine_id)
        if wait:
            self._register(machine_id, joined, offering)
            return
        threading.Thread(target=self._register_logged, args=(machine_id, joined, offering),
                         name=f"kubelet-player-join-{machine_id}", daemon=True).start()

    def _register_logged(self, machine_id: str, joined: JoinedNode, offering: Offering) -> None:
        try:
            self._register(machine_id, joined, offering)
        except Exception:
            logger.exception("played kubelet of %s could not register its Node", machine_id)

    def _register(self, machine_id: str, joined: JoinedNode, offering: Offering) -> PlayedNode:
        # eks: the Node is named by the cloud (the instance's private DNS name), identified by its providerID.
        name = joined.name or f"{L.dns_name(machine_id)}.{offering.region}.compute.internal"
        played = PlayedNode(machine_id, name, joined)
        labels = dict(joined.labels)
        labels.setdefault(L.HOSTNAME, name)
        labels.setdefault("kubernetes.io/os", "linux")
        spec: dict[str, Any] = {"taints": [dict(t) for t in joined.taints]}
        if joined.method == "eks":
            spec["providerID"] = f"aws:///{offering.zone}/{machine_id}"
        body = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}, "spec": spec}
        with self._lock:
            if machine_id in self._forgotten:     # ended before its (adopted) kubelet got here
                return played
        try:
            self.core.create_node(body)
        except ApiException as e:
            if e.status != 409:
                raise
        with self._lock:
            self.nodes[name] = played
        played.registered_at = time.time()
        cap = node_capacity(offering)
        self._post_status(name, cap)
        self._renew_lease(name)
        played.ready_at = time.time()
        logger.info("played kubelet registered Node %s for machine %s (%s join)", name, machine_id, joined.method)
        # Pods bound before this player knew the Node (an adopted machine: the watch saw them go by) run now.
        for pod in self.core.list_namespaced_pod(self.namespace, field_selector=f"spec.nodeName={name}").items:
            self._on_pod("ADDED", pod)
        return played

    def _post_status(self, name: str, capacity: dict[str, str] | None = None) -> None:
        now = _now()
        status: dict[str, Any] = {"conditions": [
            {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready status",
             "lastHeartbeatTime": now, "lastTransitionTime": now},
            {"type": "MemoryPressure", "status": "False", "reason": "KubeletHasSufficientMemory",
             "lastHeartbeatTime": now, "lastTransitionTime": now},
            {"type": "DiskPressure", "status": "False", "reason": "KubeletHasNoDiskPressure",
             "lastHeartbeatTime": now, "lastTransitionTime": now},
            {"type": "PIDPressure", "status": "False", "reason": "KubeletHasSufficientPID",
             "lastHeartbeatTime": now, "lastTransitionTime": now}]}
        if capacity is not None:
            status.update(capacity=capacity, allocatable=capacity,
                          addresses=[{"type": "InternalIP", "address": "127.0.0.1"},
                                     {"type": "Hostname", "address": name}],
                          nodeInfo={"kubeletVersion": "v0.0.0-played", "architecture": "amd64",
                                    "operatingSystem": "linux", "machineID": "", "systemUUID": "", "bootID": "",
                                    "kernelVersion": "", "osImage": "played", "containerRuntimeVersion": "played://",
                                    "kubeProxyVersion": ""})
        if capacity is None:   # keep transition times: only heartbeat
            status = {"conditions": [{"type": c["type"], "status": c["status"], "reason": c["reason"],
                                      "lastHeartbeatTime": now} for c in status["conditions"]]}
        self.core.patch_node_status(name, {"status": status})

    def _renew_lease(self, name: str) -> None:
        now = _micro_now()
        try:
            self.coord.patch_namespaced_lease(name, "kube-node-lease", {"spec": {"renewTime": now.isoformat()}})
        except ApiException as e:
            if e.status != 404:
                raise
            node = self.core.read_node(name)
            self.coord.create_namespaced_lease("kube-node-lease", {
                "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": name, "ownerReferences": [
                    {"apiVersion": "v1", "kind": "Node", "name": name, "uid": node.metadata.uid}]},
                "spec": {"holderIdentity": name, "leaseDurationSeconds": LEASE_DURATION_S,
                         "renewTime": now.isoformat()}})

    def _heartbeat_loop(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            with self._lock:
                names = [(n, p.gone) for n, p in self.nodes.items() if p.ready_at]
            for name, gone in names:
                try:
                    if gone:
                        self.core.read_node(name)    # 404 once the registration deleted it: forget the entry
                        continue
                    self._post_status(name)
                    self._renew_lease(name)
                except ApiException as e:
                    if e.status == 404:      # the Node was deleted: this kubelet is gone with its machine
                        self._drop_node(name)
                    else:
                        logger.warning("played kubelet %s: heartbeat failed: %s", name, e.reason)
                except Exception as e:       # the API server restarting
                    logger.warning("played kubelet %s: heartbeat failed: %s", name, e)
            self._check_processes()

    def _drop_node(self, name: str) -> None:
        with self._lock:
            played = self.nodes.pop(name, None)
        if played is not None:
            logger.info("played Node %s (machine %s) was deleted; stopping its pods", name, played.machine_id)
            self.processes.stop([played.machine_id])

    def forget(self, machine_id: str) -> None:
        """The machine is gone: stop its heartbeats and its Ray processes (the Node object is the registration's).
        Its pods' deletions are still confirmed until the Node is deleted (see the module docstring)."""
        with self._lock:
            self._forgotten.add(machine_id)
            for p in self.nodes.values():
                if p.machine_id == machine_id:
                    p.gone = True
        self.processes.stop([machine_id])

    def node_name(self, machine_id: str) -> str | None:
        """The Node this player registered for a live machine (None: not played here, or forgotten)."""
        with self._lock:
            return next((n for n, p in self.nodes.items() if p.machine_id == machine_id and not p.gone), None)

    # ------------------------------------------------------------------------------------------------- pods

    def _pod_loop(self) -> None:
        rv = ""
        while not self._stop.is_set():
            try:
                if not rv:
                    lst = self.core.list_namespaced_pod(self.namespace)
                    rv = lst.metadata.resource_version
                    for pod in lst.items:
                        self._on_pod("ADDED", pod)
                w = watch.Watch()
                for ev in w.stream(self.core.list_namespaced_pod, self.namespace, resource_version=rv,
                                   timeout_seconds=WATCH_TIMEOUT_S, _request_timeout=WATCH_TIMEOUT_S + 10):
                    if self._stop.is_set():
                        w.stop()
                        break
                    if ev["type"] == "ERROR":
                        rv = ""
                        break
                    pod = ev["object"]
                    rv = pod.metadata.resource_version
                    self._on_pod(ev["type"], pod)
            except ApiException as e:
                if e.status == 410:
                    rv = ""
                    continue
                logger.debug("played kubelet pod watch: %s", e.reason)
                rv = ""
                self._stop.wait(1.0)
            except Exception as e:
                logger.debug("played kubelet pod watch: %s", e)
                rv = ""
                self._stop.wait(1.0)

    def _mine(self, pod) -> PlayedNode | None:
        with self._lock:
            return self.nodes.get(pod.spec.node_name) if pod.spec.node_name else None

    def _on_pod(self, kind: str, pod) -> None:
        name = pod.metadata.name
        played = self._mine(pod)
        mid = pod_env(pod).get("RAY_CLOUD_INSTANCE_ID")
        if kind == "DELETED" or pod.metadata.deletion_timestamp is not None:
            if mid and (played is not None or self.processes.get(mid) is not None):
                threading.Thread(target=self._delete_pod, args=(pod, mid, kind == "DELETED"), daemon=True).start()
            return
        if played is None or played.gone or not mid:
            return
        phase = pod.status.phase if pod.status else None
        with self._lock:
            if phase == "Running" and name not in self.pod_ips and (rec := self.processes.get(mid)) is not None:
                # a pod an earlier player of this adopted machine ran: its Ray process is watched from now on
                self.pod_ips[name] = rec.ip
                played.pods.add(name)
            if name in self._starting or phase in ("Running", "Failed", "Succeeded"):
                return
            self._starting.add(name)
            played.pods.add(name)
        threading.Thread(target=self._run_pod, args=(pod, mid), name=f"kubelet-player-pod-{name}",
                         daemon=True).start()

    def _run_pod(self, pod, mid: str) -> None:
        env = pod_env(pod)
        name = pod.metadata.name
        try:
            resources = {k: float(v) for k, v in json.loads(env.get("RAY_OVERRIDE_RESOURCES", "{}")).items()}
            labels = json.loads(env.get("RAY_OVERRIDE_LABELS", "{}"))
            extra = {k: v for k, v in env.items() if k == "RAY_CLOUD_INSTANCE_TYPE_NAME"}
            running = self.processes.get(mid)
            rec = running if running is not None else self.processes.start(
                mid, env.get("RAY_NODE_TYPE_NAME", ""), resources, labels, extra_env=extra, tags={"pod": name})
            with self._lock:
                self.pod_ips[name] = rec.ip
            self._set_pod_status(pod, "Running", rec.ip)
        except Exception as e:
            logger.error("played kubelet: pod %s could not start Ray: %s", name, e)
            try:
                self._set_pod_status(pod, "Failed", None, message=str(e).splitlines()[0][:500])
            except Exception as e2:
                logger.warning("played kubelet: cannot report pod %s failed: %s", name, e2)
        finally:
            with self._lock:
                self._starting.discard(name)

    def _set_pod_status(self, pod, phase: str, ip: str | None, message: str = "") -> None:
        now = _now()
        ready = "True" if phase == "Running" else "False"
        c = pod.spec.containers[0]
        state = ({"running": {"startedAt": now}} if phase == "Running" else
                 {"terminated": {"exitCode": 1, "reason": "Error", "message": message, "finishedAt": now}})
        status: dict[str, Any] = {
            "phase": phase, "hostIP": "127.0.0.1", "startTime": now,
            "conditions": [{"type": t, "status": ready if t in ("Ready", "ContainersReady") else "True",
                            "lastTransitionTime": now} for t in ("Initialized", "Ready", "ContainersReady",
                                                                 "PodScheduled")],
            "containerStatuses": [{"name": c.name, "image": c.image, "imageID": "", "ready": ready == "True",
                                   "restartCount": 0, "started": phase == "Running", "state": state}],
        }
        if ip:
            status["podIP"] = ip
            status["podIPs"] = [{"ip": ip}]
        if message:
            status["message"] = message
            status["reason"] = "RayStartFailed"
        self.core.patch_namespaced_pod_status(pod.metadata.name, pod.metadata.namespace, {"status": status})

    def _delete_pod(self, pod, mid: str, already_gone: bool) -> None:
        self.processes.stop([mid])
        with self._lock:
            self.pod_ips.pop(pod.metadata.name, None)
            for p in self.nodes.values():
                p.pods.discard(pod.metadata.name)
        if already_gone:
            return
        try:   # the kubelet confirms the deletion once the containers are stopped
            self.core.delete_namespaced_pod(pod.metadata.name, pod.metadata.namespace, grace_period_seconds=0)
        except ApiException as e:
            if e.status != 404:
                logger.warning("played kubelet: final delete of pod %s failed: %s", pod.metadata.name, e.reason)
        except Exception as e:
            logger.warning("played kubelet: final delete of pod %s failed: %s", pod.metadata.name, e)

    def _check_processes(self) -> None:
        """A Ray process that died: its pod fails (restartPolicy Never), as a kubelet reports a dead container."""
        with self._lock:
            # A forgotten machine's processes were stopped on purpose: its pods are being deleted, not failed.
            running = {pod: p.machine_id for p in self.nodes.values() if not p.gone for pod in p.pods
                       if pod in self.pod_ips}
        if not running:
            return
        alive = {r.id for r in self.processes.list()}
        for pod_name_, mid in running.items():
            if mid in alive:
                continue
            try:
                pod = self.core.read_namespaced_pod(pod_name_, self.namespace)
                if pod.metadata.deletion_timestamp is None:
                    self._set_pod_status(pod, "Failed", None, message="the Ray process exited")
            except ApiException:
                pass
            with self._lock:
                self.pod_ips.pop(pod_name_, None)

    # ------------------------------------------------------------------------------------------------- close

    def close(self, stop_processes: bool = True) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=2.0)   # a watch blocked in a read ends at its server timeout (daemon thread)
        if stop_processes:
            ids = [r.id for r in self.processes._all_records()]
            if ids:
                self.processes.stop(ids)
        self.processes.close()
