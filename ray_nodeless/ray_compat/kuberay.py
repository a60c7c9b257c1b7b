"""Ray's KubeRay autoscaler path, as `ray kuberay-autoscaler` runs it (Ray 2.60
`autoscaler/_private/kuberay/run_autoscaler.py`), with the config reader ours.

- `derive_config(ray_cr)`: Ray's own `_derive_autoscaling_config_from_ray_cr` (node types from the groups: resources
  from `resources` / rayStartParams / container limits, min/max from minReplicas/maxReplicas x numOfHosts, labels,
  idleTimeoutSeconds, priority; idle timeout and upscaling speed from autoscalerOptions), so a RayCluster means to
  ray_nodeless what it means to Ray.
- `connect(gcs_address)`: waits for the head's GCS as Ray does and reads the session's logs dir from the head's node
  record (Ray's `_get_log_dir`: `<temp_dir>/session_latest/logs`), as a `Head`; the bridge builds its provider's
  MonitorContext from it.
- `run_monitor(config_reader, head, monitor_ip)`: sets up Ray's monitor logging, then runs Ray's monitor:
  v2 (`AutoscalerMonitor` with a config reader that calls ours every
  loop) when the cluster runs autoscaler v2 (asked of the GCS, as Ray does), else v1 (`Monitor` with the callable,
  which v1 calls every loop, `retry_on_failure=False` as in Ray: the container restarts after repeated failures).
- `node_provider(provider_config, cluster_name)`: the provider object Ray's monitor uses for that block (Ray keeps
  one per block, built at its first loop), so that the bridge can hand it what changed in the RayCluster.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable

logger = logging.getLogger(__name__)

RAY_NAMES = (
    ("ray.autoscaler._private.kuberay.autoscaling_config", "_derive_autoscaling_config_from_ray_cr"),
    ("ray.autoscaler._private.kuberay.run_autoscaler", "_get_log_dir"),
    ("ray.autoscaler._private.kuberay.run_autoscaler", "_setup_logging"),
    ("ray.autoscaler._private.monitor", "Monitor"),
    ("ray.autoscaler._private.providers", "_get_node_provider"),
    ("ray.autoscaler.v2.instance_manager.config", "KubeRayConfigReader"),
    ("ray.autoscaler.v2.utils", "is_autoscaler_v2"),
    ("ray.autoscaler.v2.monitor", "AutoscalerMonitor"),
    ("ray._private.services", "get_node_ip_address"),
    ("ray._raylet", "GcsClient"),
)

HEAD_WAIT_S = 5.0        # Ray's BACKOFF_S between health checks of the head


def derive_config(ray_cr: dict[str, Any]) -> dict[str, Any]:
    """Ray's autoscaling config of a RayCluster (its provider block is KubeRay's; the caller swaps it). Ray checks
    the config it derives against its cluster schema (jsonschema): a failure of that check is a ValueError here,
    as the derivation's own failures on a malformed RayCluster are (KeyError, TypeError, ValueError, ...)."""
    import jsonschema
    from ray.autoscaler._private.kuberay.autoscaling_config import _derive_autoscaling_config_from_ray_cr

    spec = ray_cr.get("spec")
    if isinstance(spec, dict) and spec.get("workerGroupSpecs") is None:
        # no worker group (shape-open): Ray's derivation indexes the key, which the CRD leaves out when unset
        ray_cr = {**ray_cr, "spec": {**spec, "workerGroupSpecs": []}}
    try:
        return _derive_autoscaling_config_from_ray_cr(ray_cr)
    except jsonschema.ValidationError as e:
        where = ".".join(str(p) for p in e.absolute_path) or "the config"
        raise ValueError(f"Ray's cluster schema refuses {where}: {e.message}") from e


def node_ip() -> str:
    from ray._private.services import get_node_ip_address

    return get_node_ip_address()


def node_provider(provider_config: dict[str, Any], cluster_name: str) -> Any:
    """The provider object Ray's monitor has (or will have) for this provider block: Ray caches one per
    (block, cluster name) and both monitors take it from that cache."""
    from ray.autoscaler._private.providers import _get_node_provider

    return _get_node_provider(provider_config, cluster_name)


def wait_for_head(gcs_address: str, stop: Callable[[], bool] = lambda: False) -> Any:
    """A GcsClient once the head's GCS answers (Ray's loop runs `ray health-check`; a GCS call is the same check
    without a subprocess)."""
    from ray._raylet import GcsClient  # type: ignore[attr-defined]  # Ray 2.60's _raylet.pyi omits it

    while True:
        try:
            client = GcsClient(address=gcs_address)
            client.get_all_node_info(timeout=5)
            return client
        except Exception as e:
            if stop():
                raise
            logger.warning("the Ray head %s is not ready (%s); checking again in %.0f s", gcs_address, e, HEAD_WAIT_S)
            time.sleep(HEAD_WAIT_S)


@dataclass(frozen=True)
class Head:
    """The head's GCS, answering: its client, its address and the session's logs dir."""

    gcs_client: Any
    gcs_address: str
    logs_dir: str


def connect(gcs_address: str) -> Head:
    """The head once its GCS answers, with the session's logs dir (where Ray's monitor logs and v2 writes its
    autoscaler events). Blocks until then, as Ray's KubeRay autoscaler does."""
    from ray.autoscaler._private.kuberay.run_autoscaler import _get_log_dir

    gcs_client = wait_for_head(gcs_address)
    return Head(gcs_client, gcs_client.address, _get_log_dir(gcs_client))


def run_monitor(config_reader: Callable[[], dict[str, Any]], head: Head, monitor_ip: str | None = None,
                log_to_session: bool = True) -> None:
    """Ray's monitor, v1 or v2 as the cluster runs, reading its config from `config_reader` every loop. Blocks."""
    from ray.autoscaler._private.kuberay.run_autoscaler import _setup_logging
    from ray.autoscaler._private.monitor import Monitor
    from ray.autoscaler.v2.instance_manager.config import KubeRayConfigReader
    from ray.autoscaler.v2.utils import is_autoscaler_v2

    gcs_client, log_dir = head.gcs_client, head.logs_dir
    if log_to_session:
        _setup_logging(log_dir)
    monitor_ip = monitor_ip or node_ip()
    if is_autoscaler_v2(fetch_from_server=True, gcs_client=gcs_client):
        from ray.autoscaler.v2.monitor import AutoscalerMonitor

        logger.info("ray_nodeless kuberay-autoscaler: autoscaler v2")
        # Ray types the reader's argument as its AutoscalingConfigProducer; any callable returning the config works.
        reader = KubeRayConfigReader(config_reader)  # type: ignore[arg-type]
        AutoscalerMonitor(address=gcs_client.address, config_reader=reader, log_dir=log_dir,
                          monitor_ip=monitor_ip).run()
    else:
        logger.info("ray_nodeless kuberay-autoscaler: autoscaler v1")
        Monitor(address=gcs_client.address, autoscaling_config=config_reader, monitor_ip=monitor_ip,
                retry_on_failure=False).run()
