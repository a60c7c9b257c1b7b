"""`ray-nodeless kuberay-autoscaler`: the command the head pod's `ray-nodeless-autoscaler` container runs (convert
writes it: kuberay/sidecar.py), in place of KubeRay's `ray kuberay-autoscaler` (kuberay/bridge.py; docs/kuberay.md)."""
from __future__ import annotations

import os

import click

from ray_nodeless.cli.errors import user_errors


@click.command("kuberay-autoscaler")
@click.option("--cluster-name", default=lambda: os.environ.get("RAY_CLUSTER_NAME"), show_default="$RAY_CLUSTER_NAME",
              help="The RayCluster's name (KubeRay sets RAY_CLUSTER_NAME in the autoscaler container).")
@click.option("--cluster-namespace", default=lambda: os.environ.get("RAY_CLUSTER_NAMESPACE"),
              show_default="$RAY_CLUSTER_NAMESPACE", help="The RayCluster's namespace.")
@click.option("--gcs-address", default=None, envvar="RAY_NODELESS_GCS_ADDRESS", show_envvar=True,
              help="The head's GCS (default: this pod's address on the head's `port` rayStartParam, else 6379, as "
                   "Ray's own KubeRay autoscaler). Not needed in the head pod: `convert` writes no flags; for a run "
                   "outside the head pod's network namespace.")
@click.option("--kubeconfig", default=None, envvar="KUBECONFIG", show_envvar=True,
              help="Reach the API server with this kubeconfig (one path) instead of the pod's ServiceAccount "
                   "(out-of-cluster runs and tests).")
def kuberay_autoscaler_command(cluster_name: str | None, cluster_namespace: str | None, gcs_address: str | None,
                               kubeconfig: str | None) -> None:
    """Run Ray's autoscaler for a KubeRay RayCluster with ray_nodeless as its provider."""
    import logging

    from ray_nodeless.errors import ConfigError
    from ray_nodeless.kuberay import bridge as kuberay

    logging.getLogger("ray_nodeless").setLevel(logging.INFO)
    with user_errors():
        if not cluster_name:
            raise ConfigError("--cluster-name", "missing (and RAY_CLUSTER_NAME is not set)")
        if not cluster_namespace:
            raise ConfigError("--cluster-namespace", "missing (and RAY_CLUSTER_NAMESPACE is not set)")
        kuberay.run(cluster_name, cluster_namespace, gcs_address=gcs_address, kubeconfig=kubeconfig)
