"""How the bridge ends a cluster's machines: when the RayCluster is deleted, and when it is suspended.

Deleted (a deletionTimestamp, or gone): every machine, Node and pod of the cluster is ended (ray_nodeless's sweep),
then the bridge's finalizer is dropped so that Kubernetes deletes the RayCluster, and the container exits 0.

Suspended (`spec.suspend: true`): KubeRay v1.5.0 deletes every pod labelled `ray.io/cluster` (the head pod with the
bridge's own container, and the bridge's Ray pods) and recreates the head when the suspension ends. Its machines are
the bridge's to end: nothing else knows them. So the bridge sweeps them too, keeps its finalizer, and exits 0. The
operator deletes the head pod as soon as it sees the suspension, so the kubelet's SIGTERM usually comes before the
bridge's next loop: on SIGTERM the bridge reads the RayCluster once and, suspended or deleted, ends the machines
within the pod's grace period (KubeRay's 30 s default) before it exits (`run_until_terminated`).
"""
from __future__ import annotations

import copy
import logging
import signal
from typing import Any, Callable, Mapping, Protocol


class Ending(Protocol):
    """What this module needs of the bridge (kuberay/bridge.py's KubeRayBridge), stated here so that the bridge
    imports this module and not the other way round."""
    @property
    def last(self) -> dict[str, Any] | None: ...

    @property
    def rayclusters(self) -> Any: ...

    @property
    def sweep(self) -> Callable[[dict[str, Any]], bool]: ...

    def config(self, ray_cr: dict[str, Any]) -> dict[str, Any]: ...

    def teardown(self, ray_cr: dict[str, Any] | None) -> bool: ...


logger = logging.getLogger(__name__)

SIGTERM_EXIT = 128 + int(signal.SIGTERM)


def suspended(ray_cr: Mapping[str, Any] | None) -> bool:
    return bool(ray_cr is not None and (ray_cr.get("spec") or {}).get("suspend") is True)


def deleted(ray_cr: Mapping[str, Any] | None) -> bool:
    return ray_cr is None or bool((ray_cr.get("metadata") or {}).get("deletionTimestamp"))


def end_machines(bridge: Ending, ray_cr: dict[str, Any] | None, *, why: str) -> bool:
    """Sweep every machine, Node and pod of the cluster (the provider block the bridge last handed Ray, else the one
    the RayCluster gives); False when nothing is known to sweep."""
    cfg = bridge.last
    if cfg is None and ray_cr is not None:
        cfg = bridge.config(ray_cr)
    if cfg is None:
        logger.error("kuberay-autoscaler: RayCluster %s/%s is gone and this process never read it: nothing known "
                     "to end (run `ray-nodeless sweep` with the cluster's provider block)",
                     bridge.rayclusters.namespace, bridge.rayclusters.name)
        return False
    logger.warning("kuberay-autoscaler: RayCluster %s is %s: ending its machines, Nodes and pods",
                   bridge.rayclusters.name, why)
    provider = copy.deepcopy(cfg["provider"])
    provider.pop("kuberay", None)       # the head pod is the operator's: the sweep ends machines only
    if not bridge.sweep({"cluster_name": cfg["cluster_name"], "provider": provider}):
        raise RuntimeError("kuberay-autoscaler: not every machine of the cluster could be ended; the bridge's "
                           "finalizer stays (the next start tries again)")
    logger.warning("kuberay-autoscaler: every machine of RayCluster %s ended", bridge.rayclusters.name)
    return True


def on_terminate(bridge: Ending) -> bool:
    """SIGTERM (the head pod is going): end the machines when the RayCluster is suspended or deleted (True once
    they are ended); a plain restart of the pod ends nothing (False)."""
    try:
        ray_cr = bridge.rayclusters.get()
    except Exception as e:       # the API server unreachable: nothing decided, the next start looks again
        logger.warning("kuberay-autoscaler: terminated, and the RayCluster cannot be read (%s)", e)
        return False
    if deleted(ray_cr):
        return bridge.teardown(ray_cr)
    if suspended(ray_cr):
        return end_machines(bridge, ray_cr, why="suspended")
    return False


def run_until_terminated(bridge: Ending, monitor: Callable[[], None]) -> None:
    """Run Ray's monitor; on SIGTERM (Ray's v1 monitor turns it into SystemExit(143); v2 installs no handler, so
    the same handler is installed here for this process first) end the machines if the cluster is going, and then
    exit 0, as the bridge does when it ends them at its own loop."""
    def terminated(signum: int, frame: Any) -> None:
        raise SystemExit(SIGTERM_EXIT)

    signal.signal(signal.SIGTERM, terminated)
    try:
        monitor()
    except SystemExit as e:
        if e.code == SIGTERM_EXIT and on_terminate(bridge):
            raise SystemExit(0) from None       # the cluster is going and its machines are ended: work done
        raise
    finally:
        # Exiting: the kubelet's SIGTERM of the head pod's deletion (which the bridge's own teardown lets happen)
        # changes nothing now. Ignored, not left to Python, which restores the default action at finalization:
        # a SIGTERM then killed the container (-15) after it had ended everything (a clean-clone CI run).
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
