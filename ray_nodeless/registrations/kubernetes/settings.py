"""The `kubernetes:` block of the provider (registration: kubernetes), declared once (see core/schema.py).

    provider:
      registration: kubernetes
      kubernetes:
        kubeconfig: ~/.kube/config     # default: in-cluster when running in a pod, else ~/.kube/config
        context: my-context            # default: the kubeconfig's current context
        namespace: ray                 # where the Ray pods live
        join:                          # how a machine joins the cluster (its boot script / user data)
          method: eks                  # eks (nodeadm NodeConfig) | kubeadm | k3s
          cluster: my-eks              # eks: the EKS cluster name
          endpoint: https://...        # the API server URL the kubelet talks to
          ca: <base64 PEM>             # eks / kubeadm: the cluster CA (kubeadm: or ca_cert_hash)
          cidr: 10.100.0.0/16          # eks: the service CIDR
          token: abcdef.0123456789abcdef   # kubeadm bootstrap token / k3s node token
          ca_cert_hash: sha256:...     # kubeadm discovery-token-ca-cert-hash
          kubeadm_api: auto            # kubeadm: the JoinConfiguration version, auto (from the API server's
                                       #   version: v1beta2 for 1.15-1.21, v1beta3 for 1.22-1.30, v1beta4 from
                                       #   1.31) or one of them
          cri_socket: /run/containerd/containerd.sock   # kubeadm: nodeRegistration.criSocket (default: containerd's)
        pod_template: {...}            # the Ray pod, like a KubeRay group's `template` (metadata + spec)
        pod_templates: {gpu: {...}}    # per node type, instead of pod_template (the KubeRay bridge writes one
                                       #   per group)
        join_timeout_s: 600            # a machine whose Node is not Ready by then is reported overdue
        pod_grace_s: 30                # terminationGracePeriod of the Ray pod on terminate
        pod_reserve: {cpu: 250m, memory: 256Mi}   # left to DaemonSets when sizing the Ray pod's requests
        played: false                  # each machine's kubelet is played on this host (providers/local/kubelet.py)
      gcs_address: 10.0.0.5:6379       # the head's GCS, for the Ray pods (default: <head_ip>:6379)
      head_ip: 10.0.0.5                # the head's address (default: this process's, the monitor's on the head)

With `played: true` the backend is wrapped in `PlayedBackend` (providers/local/played.py), whose kubelet player
registers each Node from the user data written here and runs its Ray pods as local Ray nodes; the local node-process
keys (`local_*`, providers/local/settings.py KubeletPlayerSettings) are then accepted too. The registration itself
works the same either way.
"""
from __future__ import annotations

import os
from typing import Any, Literal

from pydantic import ConfigDict, Field

from ray_nodeless.core.schema import Section
from ray_nodeless.core.settings import HeadAddress
from ray_nodeless.errors import ConfigError

KEY = "provider.kubernetes"
IN_CLUSTER_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"
DEFAULT_KUBECONFIG = "~/.kube/config"


class _Strict(Section):
    # A misspelled key inside the block would silently fall back to a default: unknown keys are errors.
    model_config = ConfigDict(strict=True, frozen=True, extra="forbid", allow_inf_nan=False)


class JoinSettings(_Strict):
    method: Literal["eks", "kubeadm", "k3s"]
    cluster: str | None = Field(None, min_length=1)
    endpoint: str | None = Field(None, min_length=1)
    token: str | None = Field(None, min_length=1)
    ca: str | None = Field(None, min_length=1)
    ca_cert_hash: str | None = Field(None, min_length=1)
    cidr: str | None = Field(None, min_length=1)
    k3s_version: str | None = Field(None, min_length=1)
    # kubeadm: the JoinConfiguration's version (core/kube_join.py kubeadm_api_for); auto asks the API server once
    kubeadm_api: Literal["auto", "v1beta2", "v1beta3", "v1beta4"] = "auto"
    cri_socket: str | None = Field(None, min_length=1)
    kubelet_flags: list[str] = Field(default_factory=list)   # extra kubelet flags, every method


class PodReserve(_Strict):
    cpu: str = "250m"
    memory: str = "256Mi"


class KubernetesBlock(_Strict):
    kubeconfig: str | None = Field(None, min_length=1)
    context: str | None = Field(None, min_length=1)
    namespace: str = Field("ray", min_length=1, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    join: JoinSettings
    pod_template: dict[str, Any] = Field(default_factory=dict)
    pod_templates: dict[str, dict[str, Any]] = Field(default_factory=dict)
    join_timeout_s: float = Field(600.0, gt=0)
    pod_grace_s: int = Field(30, ge=0)
    pod_reserve: PodReserve = Field(default_factory=PodReserve)
    # Read by the backend registry (providers/local/settings.py player_of), not by the registration.
    played: bool = False
    # How long a Node of this cluster may exist without its machine in the listing before it is collected.
    orphan_grace_s: float = Field(60.0, ge=0)

    def kubeconfig_path(self) -> str | None:
        """The kubeconfig file to read, or None for in-cluster."""
        if self.kubeconfig:
            return os.path.expanduser(self.kubeconfig)
        return default_kubeconfig()

    def api_client(self, kubeconfig: str | None = "") -> Any:
        """A kubernetes ApiClient of the API server this block names: its kubeconfig and context (or `kubeconfig`
        when given; None: in-cluster). ConfigError naming the key when the file cannot be read or the context does
        not exist. A method of the parsed block, so that whoever is handed the block (the registration, the played
        kubelet of providers/local, which imports nothing of registrations/) reaches the same server the same way.
        The Kubernetes client is imported only here."""
        from kubernetes import client, config
        from kubernetes.config.config_exception import ConfigException

        path = self.kubeconfig_path() if kubeconfig == "" else kubeconfig
        cfg = client.Configuration()
        if path is None:
            try:
                config.load_incluster_config(client_configuration=cfg)
            except ConfigException as e:
                raise ConfigError(f"{KEY}.kubeconfig", f"not set and the in-cluster configuration failed: {e}") from e
            return client.ApiClient(cfg)
        try:
            with open(path, "rb"):
                pass
        except OSError as e:
            raise ConfigError(f"{KEY}.kubeconfig", f"cannot read {path}: {e.strerror or e}") from e
        try:
            config.load_kube_config(config_file=path, context=self.context, client_configuration=cfg,
                                    persist_config=False)
        except ConfigException as e:
            key = f"{KEY}.context" if self.context and "context" in str(e).lower() else f"{KEY}.kubeconfig"
            raise ConfigError(key, f"{path}: {e}") from e
        except Exception as e:  # a file that is not YAML, a mapping of the wrong shape
            raise ConfigError(f"{KEY}.kubeconfig", f"{path} is not a usable kubeconfig: {e}") from e
        return client.ApiClient(cfg)


class KubernetesSettings(HeadAddress):
    """The provider-block keys of `registration: kubernetes`; `head_ip` (default: this process's address) and
    `gcs_address` (the Ray pods' GCS; default: <head_ip>:6379) are the core's declaration (HeadAddress)."""

    kubernetes: KubernetesBlock


def default_kubeconfig() -> str | None:
    """None = in-cluster (a pod with a ServiceAccount token), else ~/.kube/config."""
    if os.environ.get("KUBERNETES_SERVICE_HOST") and os.path.exists(IN_CLUSTER_TOKEN):
        return None
    return os.path.expanduser(DEFAULT_KUBECONFIG)
