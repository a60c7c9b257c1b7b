"""`registration: kubernetes`: every machine joins a Kubernetes cluster as a Node, and Ray runs in a pod bound to it.

- `prepare(spec)` writes the machine's join user data (`join.py`: eks / kubeadm / k3s) into `spec.boot_script`,
  which the cloud backends pass as EC2 UserData / GCE startup-script.
- `after_launch` returns at once: Ray's update loop never waits for a join. One watch thread (a `watch.Watch` on
  the Nodes labelled `ray-nodeless.io/cluster=<cluster>`, resumed from its resourceVersion, re-listed after a 410
  or an API server outage) sees each Node; when it is Ready, the Ray pod is created (`pods.py`). A second watch
  follows this cluster's pods (phase, podIP) in the namespace.
- `describe(machine)` gives Ray the pod's IP once known, and keeps the machine pending until its pod runs.
- `after_terminate` deletes the pod (grace `pod_grace_s`), cordons the Node, and, from a background reaper, deletes
  the Node once the pod is gone (at most `pod_grace_s` + REAP_SLACK_S later).
- Orphans: a Node of this cluster whose machine is not listed any more (for `orphan_grace_s`) is deleted; a machine
  whose Node is not Ready within `join_timeout_s` is reported by `overdue_machines()`; a pod failed for good by
  `machines_to_end()`. State is rebuilt after a restart from the listing (describe) and Node / pod labels.
- `kubernetes.played: true`: the backend is wrapped in `PlayedBackend` (providers/local/played.py), whose played
  kubelet registers each machine's Node from the user data written here and runs its Ray pods locally, and which
  gives the head its local address and command runner. Nothing here depends on it: the registration sees Nodes
  and pods as it would with real machines.
"""
from __future__ import annotations

import dataclasses
import logging
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from ray_nodeless.core.settings import CoreSettings
from ray_nodeless.providers.base import (
    MACHINE_PENDING, TAG_INSTANCE_TYPE, TAG_RAY_NODE_KIND, TAG_RAY_USER_NODE_TYPE, LaunchSpec, Machine,
)
from ray_nodeless.registrations.base import WALL_CLOCK, Clock, Registration
from ray_nodeless.registrations.kubernetes import labels as L
from ray_nodeless.registrations.kubernetes.housekeeping import Housekeeping, _created, _label, _node_ready
from ray_nodeless.registrations.kubernetes.join import check_join, kubeadm_api_version, user_data
from ray_nodeless.registrations.kubernetes.pods import pod_name, ray_pod, template_for
from ray_nodeless.registrations.kubernetes.settings import KubernetesSettings

logger = logging.getLogger(__name__)

WATCH_TIMEOUT_S = 30          # server-side watch timeout: the watch is re-opened from its resourceVersion
RETRY_S = 1.0                 # after a failed list/watch (API server down), before listing again
# The model each watch's events are read into. Named, not left to the client: kubernetes' Watch finds it in the
# list function's docstring (`:return: V1NodeList`), which the registration's own list functions lack, so every event
# came as a raw dict, was taken for a Status and made the watch list everything again: one full list per event
# (found by benches/bench_kwok_scale.py: 113 watch opens and lists while 100 Nodes came up).
WATCH_MODELS = {"nodes": "V1Node", "pods": "V1Pod"}


@dataclass
class Tracked:
    """What the registration knows of one machine."""

    machine_id: str
    node_type: str = ""
    is_head: bool = False
    launched_at: float = 0.0          # epoch seconds, from the registration's clock (or the Node / the listing)
    instance_type: str = ""
    tags: dict[str, str] = field(default_factory=dict)
    resources: dict[str, float] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    node: str | None = None
    node_ready: bool = False
    ready_at: float | None = None
    allocatable: dict[str, str] = field(default_factory=dict)
    pod: str | None = None
    pod_phase: str | None = None
    pod_ip: str | None = None
    pod_failed: str | None = None
    terminating: bool = False
    overdue_logged: bool = False
    last_seen: float = 0.0


class KubernetesRegistration(Housekeeping, Registration):
    name = "kubernetes"
    settings_model = KubernetesSettings

    @classmethod
    def check_config(cls, settings: KubernetesSettings) -> None:
        from ray_nodeless.registrations.kubernetes.check import check_static

        check_static(settings)

    @classmethod
    def preflight(cls, settings: KubernetesSettings, cluster_name: str) -> None:
        # kubeconfig, API server, RBAC, namespace and a dry run of the pod (registrations/kubernetes/check.py)
        from ray_nodeless.registrations.kubernetes.check import check

        check(settings, cluster_name)

    def __init__(self, settings: KubernetesSettings, cluster_name: str, core: CoreSettings, *, start: bool = True,
                 api: client.ApiClient | None = None, clock: Clock = WALL_CLOCK):
        super().__init__(settings, cluster_name, core)
        self.settings: KubernetesSettings = settings
        self.k = self.settings.kubernetes
        check_join(self.k.join)
        self.cloud = core.cloud
        self.region = core.region
        self.node_type_resources = core.node_type_resources     # recorded by bootstrap_config
        self.namespace = self.k.namespace
        self.selector = L.cluster_selector(cluster_name)
        self.api = api or self.k.api_client()
        # Every age and deadline (join_timeout_s, orphan_grace_s, the reaper's grace) is read from this clock, at
        # each use: a test may swap in a FakeClock after construction (`reg.clock = FakeClock(time.time())`).
        self.clock = clock
        self.core = client.CoreV1Api(self.api)
        self.machines: dict[str, Tracked] = {}
        # Node type -> pod template; replaced while running by whoever reads them live (the KubeRay bridge)
        self.pod_templates: dict[str, dict[str, Any]] = dict(self.k.pod_templates)
        self.nodes: dict[str, Any] = {}            # Node name -> V1Node (this cluster's)
        self.pods: dict[str, Any] = {}             # pod name -> V1Pod (this cluster's)
        self.terminated: dict[str, float] = {}     # machine id -> when we ended it
        self._listing: tuple[float, set[str]] | None = None
        self._last_describe = 0.0
        self._kubeadm_api_version: str | None = None
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._watches: list[watch.Watch] = []
        self._threads: list[threading.Thread] = []
        self.synced = {"nodes": threading.Event(), "pods": threading.Event()}
        if start:
            self.start()

    # ------------------------------------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        if self._threads:
            return
        self._threads = [
            threading.Thread(target=self._watch_loop, args=("nodes", self._list_nodes, self._on_node),
                             name=f"k8s-nodes-{self.cluster_name}", daemon=True),
            threading.Thread(target=self._watch_loop, args=("pods", self._list_pods, self._on_pod),
                             name=f"k8s-pods-{self.cluster_name}", daemon=True),
            threading.Thread(target=self._housekeeping_loop, name=f"k8s-housekeeping-{self.cluster_name}",
                             daemon=True),
        ]
        for t in self._threads:
            t.start()

    def close(self) -> None:
        self._stop.set()
        for w in list(self._watches):
            w.stop()
        for t in self._threads:
            t.join(timeout=2.0)    # a watch blocked in a read ends at its server timeout (daemon thread)

    # ------------------------------------------------------------------------------------------------ hooks

    def prepare(self, spec: LaunchSpec) -> LaunchSpec:
        if not spec.is_head:
            spec.boot_script = user_data(self.k.join, spec, self.cluster_name, self.cloud, self._kubeadm_api())
        return spec

    def _kubeadm_api(self) -> str:
        """kubeadm joins: the JoinConfiguration version for this API server (asked once, then kept: a cluster's
        version changes only with an upgrade of its control plane, after which the provider restarts)."""
        if self.k.join.method != "kubeadm":
            return ""
        if self._kubeadm_api_version is None:
            self._kubeadm_api_version = kubeadm_api_version(
                self.k.join, lambda: client.VersionApi(self.api).get_code().git_version)
        return self._kubeadm_api_version

    def set_pod_templates(self, templates: dict[str, dict[str, Any]]) -> None:
        """New pod templates by node type, for the pods created from now on (running pods are left as they are)."""
        with self._lock:
            self.pod_templates = dict(templates)

    def after_launch(self, spec: LaunchSpec, machine_ids: list[str]) -> None:
        if spec.is_head:
            return
        now = self.clock()
        with self._lock:
            for mid in machine_ids:
                t = self.machines.setdefault(mid, Tracked(mid))
                t.node_type, t.is_head, t.launched_at = spec.node_type, False, now
                t.instance_type = spec.offering.instance_type.name
                t.tags, t.resources, t.labels = dict(spec.tags), dict(spec.resources), dict(spec.labels)
                t.last_seen = now
            ready = [mid for mid in machine_ids if self.machines[mid].node_ready]
        for mid in ready:    # a retried hook for a machine that already joined
            self._ensure_pod(mid)

    def describe(self, machine: Machine) -> Machine:
        now = self.clock()
        with self._lock:
            self._last_describe = now
            t = self.machines.get(machine.id)
            if t is None:   # after a restart: rebuilt from the listing's tags and the Node / pod caches
                t = self.machines[machine.id] = Tracked(
                    machine.id, node_type=machine.tags.get(TAG_RAY_USER_NODE_TYPE, ""),
                    is_head=machine.tags.get(TAG_RAY_NODE_KIND) == "head",
                    launched_at=machine.launched_at or now, instance_type=machine.tags.get(TAG_INSTANCE_TYPE, ""))
            t.tags = {**t.tags, **machine.tags}
            t.last_seen = now
            is_head, ip, phase = t.is_head, t.pod_ip, t.pod_phase
        if is_head:
            return machine
        if ip:
            machine = dataclasses.replace(machine, internal_ip=ip, external_ip=ip)
        if phase != "Running":
            machine = dataclasses.replace(machine, state=MACHINE_PENDING)
        return machine

    def observe_listing(self, machine_ids: set[str] | list[str]) -> None:
        """The full listing of this cluster's machines (what orphan Nodes are judged against)."""
        with self._lock:
            self._listing = (self.clock(), set(machine_ids))

    def after_terminate(self, machine_ids: list[str]) -> None:
        for mid in machine_ids:
            begun = self._begin_end(mid)
            if begun is None:
                continue
            pods, nodes = begun
            # Not a daemon: a short-lived process (`ray down`) must not exit before the Node is deleted (the
            # interpreter joins it at exit: at most pod_grace_s + REAP_SLACK_S, close() cuts it short).
            threading.Thread(target=self._reap, args=(mid, pods, nodes), name=f"k8s-reap-{mid}",
                             daemon=False).start()
            logger.info("kubernetes: machine %s terminated: deleting pod(s) %s (grace %d s), Node(s) %s", mid,
                        pods, self.k.pod_grace_s, nodes)

    def _begin_end(self, mid: str) -> tuple[list[str], list[str]] | None:
        """The first half of ending a machine's Kubernetes side: mark it ended, delete its pod(s) with
        `pod_grace_s`, cordon its Node(s). Returns (pods, nodes) for `_reap`; None for the head (it has no Node)."""
        with self._lock:
            t = self.machines.get(mid)
            if t is not None and t.is_head:
                self.machines.pop(mid, None)
                return None
            self.terminated[mid] = self.clock()
            if t is not None:
                t.terminating = True
            pods = [n for n, p in self.pods.items() if _label(p, L.MACHINE_ID) == L.label_value(mid)]
            nodes = [n for n, nd in self.nodes.items() if L.machine_id_of_node(nd) == mid]
            if t is not None and t.node and t.node not in nodes:
                nodes.append(t.node)
        pods = pods or [pod_name(self.cluster_name, mid)]
        for p in pods:
            self._delete_pod(p, self.k.pod_grace_s)
        for n in nodes:
            self._cordon(n)
        return pods, nodes

    # ------------------------------------------------------------------------------------------------ reports





    # ------------------------------------------------------------------------------------------------ watches

    def _list_nodes(self, **kw):
        return self.core.list_node(label_selector=self.selector, **kw)

    def _list_pods(self, **kw):
        return self.core.list_namespaced_pod(self.namespace, label_selector=self.selector, **kw)

    def _watch_loop(self, kind: str, list_fn: Callable, handler: Callable[[str, Any], None]) -> None:
        """List, then watch from the list's resourceVersion; a 410 (too old) or any failure (the API server
        restarting) re-lists after RETRY_S, replaying what changed meanwhile as synthetic events."""
        rv = ""
        while not self._stop.is_set():
            try:
                if not rv:
                    lst = list_fn()
                    rv = lst.metadata.resource_version
                    self._resync(kind, lst.items, handler)
                    self.synced[kind].set()
                w = watch.Watch(return_type=WATCH_MODELS[kind])
                self._watches.append(w)
                try:
                    for ev in w.stream(list_fn, resource_version=rv, timeout_seconds=WATCH_TIMEOUT_S,
                                       _request_timeout=WATCH_TIMEOUT_S + 10):
                        if ev["type"] == "ERROR":
                            rv = ""
                            break
                        obj = ev["object"]
                        if isinstance(obj, dict):    # not deserialisable (a Status): start over from a list
                            logger.debug("kubernetes: %s watch event %s: %s", kind, ev["type"], obj)
                            rv = ""
                            break
                        rv = obj.metadata.resource_version or rv
                        try:
                            handler(ev["type"], obj)
                        except Exception:
                            logger.exception("kubernetes: handling %s %s failed", kind, ev["type"])
                        if self._stop.is_set():
                            break
                finally:
                    self._watches.remove(w)
            except ApiException as e:
                rv = ""
                if e.status != 410:
                    logger.warning("kubernetes: %s watch failed (%s %s); listing again in %.0f s", kind, e.status,
                                   e.reason, RETRY_S)
                    self._stop.wait(RETRY_S)
            except Exception as e:
                rv = ""
                logger.warning("kubernetes: %s watch failed (%s); listing again in %.0f s", kind, e, RETRY_S)
                self._stop.wait(RETRY_S)

    def _resync(self, kind: str, items: list, handler: Callable[[str, Any], None]) -> None:
        cache = self.nodes if kind == "nodes" else self.pods
        names = {o.metadata.name for o in items}
        with self._lock:
            gone = [o for n, o in cache.items() if n not in names]
        for o in gone:
            handler("DELETED", o)
        for o in items:
            handler("MODIFIED", o)

    # ------------------------------------------------------------------------------------------------ nodes

    def _on_node(self, kind: str, node) -> None:
        name = node.metadata.name
        mid = L.machine_id_of_node(node)
        if kind == "DELETED":
            with self._lock:
                self.nodes.pop(name, None)
                t = self.machines.get(mid) if mid else None
                if t is not None and t.node == name:
                    t.node, t.node_ready, t.allocatable = None, False, {}
            return
        with self._lock:
            self.nodes[name] = node
        if mid is None:
            return
        labels = node.metadata.labels or {}
        with self._lock:
            t = self.machines.get(mid)
            if t is None and mid not in self.terminated:
                # Seen before the listing names it (a restart): track it; the listing decides if it is an orphan.
                t = self.machines[mid] = Tracked(mid, node_type=labels.get(L.NODE_TYPE, ""),
                                                 launched_at=_created(node, self.clock()),
                                                 instance_type=labels.get(L.INSTANCE_TYPE, ""))
            if t is None:
                return
            ready = _node_ready(node)
            first_ready = ready and t.ready_at is None
            t.node, t.node_ready = name, ready
            t.allocatable = dict(node.status.allocatable or {}) if node.status else {}
            if first_ready:
                t.ready_at = self.clock()
                logger.info("kubernetes: machine %s joined as Node %s, Ready %.1f s after launch", mid, name,
                            t.ready_at - t.launched_at)
            tags, terminating = dict(t.tags), t.terminating
        if terminating:
            return
        patch: dict[str, Any] = {}
        if labels.get(L.MACHINE_ID) != L.label_value(mid):   # eks: the NodeConfig could not carry the machine id
            patch.setdefault("metadata", {})["labels"] = {L.MACHINE_ID: L.label_value(mid)}
        want = L.node_annotations(tags)
        have = node.metadata.annotations or {}
        if any(have.get(k) != v for k, v in want.items()):
            patch.setdefault("metadata", {})["annotations"] = want
        if patch:
            try:
                self.core.patch_node(name, patch)
            except ApiException as e:
                logger.warning("kubernetes: cannot label Node %s: %s %s", name, e.status, e.reason)
                return
            if "labels" in patch.get("metadata", {}):
                return   # the pod's nodeSelector needs the label: the MODIFIED event comes back here
        if ready:
            self._ensure_pod(mid)



    # ------------------------------------------------------------------------------------------------ pods

    def _ensure_pod(self, mid: str) -> None:
        with self._lock:
            t = self.machines.get(mid)
            if t is None or t.is_head or t.terminating or not t.node_ready:
                return
            name = pod_name(self.cluster_name, mid)
            if t.pod is not None or name in self.pods:
                return
            t.pod = name
            resources = t.resources or self._resources_from(t)
            template = template_for(self.k.pod_template, self.pod_templates, t.node_type)
            manifest = ray_pod(template, cluster=self.cluster_name, namespace=self.namespace,
                               machine_id=mid, node_type=t.node_type, is_head=False, instance_type=t.instance_type,
                               allocatable=t.allocatable, reserve_cpu=self.k.pod_reserve.cpu,
                               reserve_memory=self.k.pod_reserve.memory, grace_s=self.k.pod_grace_s,
                               gcs_address=self._gcs_address(), ray_resources=resources, ray_labels=t.labels)
        try:
            self.core.create_namespaced_pod(self.namespace, manifest)
            logger.info("kubernetes: created Ray pod %s for machine %s on Node %s", name, mid, t.node)
        except ApiException as e:
            if e.status == 409:
                return
            with self._lock:
                t.pod = None      # retried at the next Node event / housekeeping
            logger.warning("kubernetes: cannot create pod %s: %s %s", name, e.status, e.reason)
        except Exception as e:
            with self._lock:
                t.pod = None
            logger.warning("kubernetes: cannot create pod %s: %s", name, e)

    def _resources_from(self, t: Tracked) -> dict[str, float]:
        """After a restart the launch spec is gone: the node type's declared resources, else the Node's size."""
        declared = self.node_type_resources.get(t.node_type)
        if isinstance(declared, Mapping) and declared:     # bootstrap_config records a mapping per node type
            return {k: float(v) for k, v in declared.items()}
        from kubernetes.utils import parse_quantity
        a = t.allocatable
        out = {"CPU": float(int(parse_quantity(a.get("cpu", "1"))))}
        if a.get(L.GPU_RESOURCE):
            out["GPU"] = float(int(parse_quantity(a[L.GPU_RESOURCE])))
        return out

    def _on_pod(self, kind: str, pod) -> None:
        name = pod.metadata.name
        mid = _label(pod, L.MACHINE_ID)
        with self._lock:
            if kind == "DELETED":
                self.pods.pop(name, None)
            else:
                self.pods[name] = pod
            t = self._by_label(mid)
            if t is None:
                return
            if kind == "DELETED":
                if t.pod == name:
                    t.pod_phase, t.pod_ip = None, None
                    if not t.terminating:
                        t.pod_failed = f"pod {name} was deleted"
                return
            t.pod = name
            t.pod_phase = pod.status.phase if pod.status else None
            t.pod_ip = pod.status.pod_ip if pod.status else None
            if t.pod_phase == "Failed" and not t.pod_failed and not t.terminating:
                t.pod_failed = f"pod {name} failed: {(pod.status.reason or '')} {(pod.status.message or '')}".strip()
                logger.error("kubernetes: %s; machine %s is to end", t.pod_failed, t.machine_id)

    def _by_label(self, value: str | None) -> Tracked | None:
        if not value:
            return None
        t = self.machines.get(value)
        if t is not None:
            return t
        return next((t for m, t in self.machines.items() if L.label_value(m) == value), None)


    # ------------------------------------------------------------------------------------------------ background





    # ------------------------------------------------------------------------------------------------ helpers

    def _head_ip(self) -> str:
        """`provider.head_ip`, else this process's address: the monitor that launches workers runs on the head
        (as registrations/vm.py; a played head reports the same address, see providers/local/slots.py)."""
        if self.settings.head_ip:
            return self.settings.head_ip
        from ray.util import get_node_ip_address     # Ray's public name for it
        return get_node_ip_address()

    def _gcs_address(self) -> str:
        return self.settings.gcs_address_at(self._head_ip())


__all__ = ["KubernetesRegistration", "Tracked"]
