"""The Kubernetes registration's reports and clean-up, as a mixin of `KubernetesRegistration`: machines that never
joined or whose Ray pod failed for good (for the provider to end), `ray-nodeless status` fields, cordon / delete of
Nodes and pods, and the housekeeping loop that collects orphan Nodes (a Node of this cluster whose machine is
gone). State (machines, nodes, pods, locks, settings) lives on the registration."""
from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any, Callable

from kubernetes.client.rest import ApiException

from ray_nodeless.errors import BackendError
from ray_nodeless.registrations.base import Clock
from ray_nodeless.registrations.kubernetes import labels as L

if TYPE_CHECKING:
    from kubernetes import client

    from ray_nodeless.core.settings import CoreSettings
    from ray_nodeless.registrations.kubernetes.settings import KubernetesBlock, KubernetesSettings

logger = logging.getLogger("ray_nodeless.registrations.kubernetes.registration")

HOUSEKEEPING_S = 5.0          # orphan / overdue checks
REAP_SLACK_S = 10.0           # after pod_grace_s, how long the reaper waits for the pod before deleting the Node
LISTING_FRESH_S = 60.0        # a listing (or describe round) older than this says nothing about orphans
WAIT_READY_S = 15.0           # a sweep waits this long for the first Node / pod listing


class Housekeeping:
    # What the mixin reads of KubernetesRegistration (registration.py sets them in its __init__). `machines` holds
    # registration.Tracked records: Any, since naming that class here would import the module that imports this one.
    cluster_name: str
    k: KubernetesBlock
    namespace: str
    core: client.CoreV1Api
    machines: dict[str, Any]
    nodes: dict[str, Any]            # Node name -> V1Node
    pods: dict[str, Any]             # pod name -> V1Pod
    terminated: dict[str, float]
    synced: dict[str, threading.Event]
    _listing: tuple[float, set[str]] | None
    _last_describe: float
    _lock: threading.RLock
    _stop: threading.Event
    _threads: list[threading.Thread]

    if TYPE_CHECKING:       # KubernetesRegistration's, declared for the type checker only
        def __init__(self, settings: KubernetesSettings, cluster_name: str, core: CoreSettings, *,
                     start: bool = True, api: client.ApiClient | None = None) -> None: ...
        def _begin_end(self, mid: str) -> tuple[list[str], list[str]] | None: ...
        def _ensure_pod(self, mid: str) -> None: ...
        def _list_nodes(self, **kw: Any) -> Any: ...
        def _list_pods(self, **kw: Any) -> Any: ...
        def _on_pod(self, kind: str, pod: Any) -> None: ...
        def _watch_loop(self, kind: str, list_fn: Callable[..., Any], handler: Callable[[str, Any], None]) -> None: ...
    clock: Clock      # the registration's (registrations/base.py): every age and deadline here is read from it

    def overdue_machines(self, now: float | None = None) -> dict[str, str]:
        """Machines whose Node is not Ready `join_timeout_s` after launch: machine id -> reason (names the join
        method). Logged once per machine; the caller terminates them."""
        now = now or self.clock()
        out: dict[str, str] = {}
        if not self.synced["nodes"].is_set():
            return out      # the Node cache is not filled yet (a restart): cannot tell who joined
        with self._lock:
            for mid, t in self.machines.items():
                if t.is_head or t.terminating or t.ready_at is not None:
                    continue
                age = now - t.launched_at
                if age > self.k.join_timeout_s:
                    out[mid] = (f"machine {mid} did not join Kubernetes (join method {self.k.join.method}) within "
                                f"join_timeout_s={self.k.join_timeout_s:.0f} s ({age:.0f} s since launch)")
                    if not t.overdue_logged:
                        t.overdue_logged = True
                        logger.error("kubernetes: %s", out[mid])
        return out

    def failed_machines(self) -> dict[str, str]:
        with self._lock:
            return {mid: t.pod_failed for mid, t in self.machines.items() if t.pod_failed and not t.terminating}

    def machines_to_end(self) -> dict[str, str]:
        """Every machine the caller should terminate: overdue joins and pods failed for good."""
        return {**self.overdue_machines(), **self.failed_machines()}

    def status(self, machine_id: str) -> dict[str, Any]:
        """For `ray-nodeless status`: k8s_node, k8s_ready, pod, pod_phase."""
        with self._lock:
            t = self.machines.get(machine_id)
            if t is None:
                return {"k8s_node": None, "k8s_ready": None, "pod": None, "pod_phase": None}
            return {"k8s_node": t.node, "k8s_ready": t.node_ready if t.node else None, "pod": t.pod,
                    "pod_phase": t.pod_phase}

    def wait_ready(self, timeout_s: float) -> None:
        """Block until the Node and pod watches have listed once (what `_begin_end` and `_reap` read)."""
        deadline = time.monotonic() + timeout_s
        for kind, ev in self.synced.items():
            if not ev.wait(max(0.0, deadline - time.monotonic())):
                raise BackendError(f"kubernetes: could not list the {kind} of cluster {self.cluster_name} within "
                                   f"{timeout_s:.0f} s (API server down? see the warnings above)",
                                   category="KubernetesUnavailable")

    def leftovers(self) -> list[dict[str, str]]:
        """This cluster's Nodes and Ray pods, listed from the API server now (for `ray-nodeless sweep`)."""
        try:
            nodes = self._list_nodes().items
            pods = self._list_pods().items
        except Exception as e:
            raise BackendError(f"kubernetes: cannot list the Nodes and pods of cluster {self.cluster_name}: {e}",
                               category="KubernetesUnavailable") from e
        out = [{"kind": "k8s-node", "name": n.metadata.name, "machine_id": L.machine_id_of_node(n) or "",
                "node_kind": "worker", "state": "Ready" if _node_ready(n) else "NotReady"} for n in nodes]
        out += [{"kind": "k8s-pod", "name": p.metadata.name, "machine_id": _label(p, L.MACHINE_ID) or "",
                 "node_kind": "worker", "state": (p.status.phase if p.status else None) or ""} for p in pods]
        return sorted(out, key=lambda d: (d["kind"], d["name"]))

    @classmethod
    def for_sweep(cls, settings, cluster_name: str, core):
        """Passive: no Node watch and no housekeeping, which would act (a Ready Node without its pod gets one);
        `sweep` starts only what it needs."""
        return cls(settings, cluster_name, core, start=False)

    def sweep(self, machine_ids: list[str]) -> None:
        """`after_terminate` for a sweep, waited for: the pods deleted (grace `pod_grace_s`), the Nodes cordoned,
        then deleted once their pods are gone (force-deleting a pod still there after the grace), in parallel."""
        if not self._threads:    # passive (for_sweep): follow the pods (what _reap waits on), read the Nodes once
            t = threading.Thread(target=self._watch_loop, args=("pods", self._list_pods, self._on_pod),
                                 name=f"k8s-sweep-pods-{self.cluster_name}", daemon=True)
            self._threads.append(t)
            t.start()
            try:
                nodes = self._list_nodes().items
            except Exception as e:
                raise BackendError(f"kubernetes: cannot list the Nodes of cluster {self.cluster_name}: {e}",
                                   category="KubernetesUnavailable") from e
            with self._lock:
                self.nodes.update({n.metadata.name: n for n in nodes})
            self.synced["nodes"].set()
        self.wait_ready(WAIT_READY_S)
        reaps = []
        for mid in machine_ids:
            begun = self._begin_end(mid)
            if begun is not None:
                reaps.append(threading.Thread(target=self._reap, args=(mid, *begun), name=f"k8s-sweep-{mid}",
                                              daemon=True))
        for t in reaps:
            t.start()
        for t in reaps:
            t.join()

    def _cordon(self, node: str) -> None:
        try:
            self.core.patch_node(node, {"spec": {"unschedulable": True}})
        except ApiException as e:
            if e.status != 404:
                logger.warning("kubernetes: cannot cordon Node %s: %s %s", node, e.status, e.reason)
        except Exception as e:
            logger.warning("kubernetes: cannot cordon Node %s: %s", node, e)

    def _delete_node(self, node: str) -> bool:
        return _deleted(f"Node {node}", lambda: self.core.delete_node(node), announce=True)

    def _delete_pod(self, name: str, grace: int) -> bool:
        return _deleted(f"pod {name}",
                        lambda: self.core.delete_namespaced_pod(name, self.namespace, grace_period_seconds=grace))

    def _reap(self, mid: str, pods: list[str], nodes: list[str]) -> None:
        """After a terminate: wait for the pods to go (their kubelet confirms), then delete the Node(s); a pod still
        there after the grace is force-deleted (its kubelet is gone with the machine)."""
        deadline = self.clock() + self.k.pod_grace_s + REAP_SLACK_S
        while self.clock() < deadline and not self._stop.is_set():
            with self._lock:
                left = [p for p in pods if p in self.pods]
            if not left:
                break
            self._stop.wait(0.5)
        with self._lock:
            left = [p for p in pods if p in self.pods]
        for p in left:
            self._delete_pod(p, 0)
        for n in nodes:
            self._delete_node(n)
        with self._lock:
            self.machines.pop(mid, None)

    def _housekeeping_loop(self) -> None:
        while not self._stop.wait(HOUSEKEEPING_S):
            try:
                self.housekeeping()
            except Exception:
                logger.exception("kubernetes: housekeeping failed")

    def housekeeping(self, now: float | None = None) -> None:
        """Collect orphan Nodes, retry pods that could not be created, report overdue joins."""
        now = now or self.clock()
        for name in self.orphan_nodes(now):
            logger.warning("kubernetes: Node %s belongs to no machine of cluster %s any more; deleting it", name,
                           self.cluster_name)
            self._cordon(name)
            if self._delete_node(name):
                with self._lock:
                    self.nodes.pop(name, None)
        with self._lock:
            retry = [m for m, t in self.machines.items() if t.node_ready and t.pod is None and not t.terminating]
        for mid in retry:
            self._ensure_pod(mid)
        self.overdue_machines(now)
        with self._lock:    # forget old terminations
            for mid, at in list(self.terminated.items()):
                if now - at > 3600:
                    del self.terminated[mid]

    def orphan_nodes(self, now: float | None = None) -> list[str]:
        """Nodes of this cluster whose machine is gone: ended by us, or absent from the listing for orphan_grace_s.
        Nothing is judged before this object has seen a listing (describe / observe_listing)."""
        now = now or self.clock()
        grace = self.k.orphan_grace_s
        out = []
        with self._lock:
            listing = self._listing
            for name, node in self.nodes.items():
                mid = L.machine_id_of_node(node)
                if mid is None:
                    continue
                if mid in self.terminated:
                    if now - self.terminated[mid] > self.k.pod_grace_s + REAP_SLACK_S + 5:
                        out.append(name)
                    continue
                if now - _created(node, now) < grace:
                    continue
                t = self.machines.get(mid)
                if t is not None and now - t.launched_at < grace:
                    continue   # just launched: the cloud's listing may lag
                recent = max(grace, LISTING_FRESH_S)
                if listing is not None and now - listing[0] < recent:
                    alive = mid in listing[1]
                elif self._last_describe and now - self._last_describe < recent:
                    alive = t is not None and now - t.last_seen < grace
                else:
                    continue   # no recent listing: cannot tell
                if not alive:
                    out.append(name)
        return out


def _label(obj, key: str) -> str | None:
    return (obj.metadata.labels or {}).get(key) if obj.metadata else None


def _node_ready(node) -> bool:
    for c in (node.status.conditions or []) if node.status else []:
        if c.type == "Ready":
            return c.status == "True"
    return False


def _created(obj, now: float) -> float:
    """The object's creationTimestamp (epoch seconds); `now` for one the API server has not stamped."""
    ts = obj.metadata.creation_timestamp if obj.metadata else None
    return ts.timestamp() if ts is not None else now


def _deleted(what: str, delete: Callable[[], object], announce: bool = False) -> bool:
    """Run a delete call: True when the object is gone (deleted now, logged if `announce`; or 404: gone already);
    False, with a warning, when the API refused or could not be reached (the caller retries on its next pass)."""
    try:
        delete()
        if announce:
            logger.info("kubernetes: deleted %s", what)
        return True
    except ApiException as e:
        if e.status == 404:
            return True
        logger.warning("kubernetes: cannot delete %s: %s %s", what, e.status, e.reason)
    except Exception as e:
        logger.warning("kubernetes: cannot delete %s: %s", what, e)
    return False
