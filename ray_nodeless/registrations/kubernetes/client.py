"""The Kubernetes API client of the registration, from `kubernetes.kubeconfig` / `context` (or in-cluster)."""
from __future__ import annotations

import os

from kubernetes import client, config
from kubernetes.config.config_exception import ConfigException

from ray_nodeless.errors import ConfigError
from ray_nodeless.registrations.kubernetes.settings import KubernetesBlock, default_kubeconfig

KEY = "provider.kubernetes"


def kubeconfig_path(block: KubernetesBlock) -> str | None:
    """The kubeconfig file to read, or None for in-cluster."""
    if block.kubeconfig:
        return os.path.expanduser(block.kubeconfig)
    return default_kubeconfig()


def api_client(block: KubernetesBlock, kubeconfig: str | None = "") -> client.ApiClient:
    """An ApiClient for the block's kubeconfig (or `kubeconfig` when given). ConfigError naming the key when the file
    cannot be read or the context does not exist."""
    path = kubeconfig_path(block) if kubeconfig == "" else kubeconfig
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
        config.load_kube_config(config_file=path, context=block.context, client_configuration=cfg,
                                persist_config=False)
    except ConfigException as e:
        key = f"{KEY}.context" if block.context and "context" in str(e).lower() else f"{KEY}.kubeconfig"
        raise ConfigError(key, f"{path}: {e}") from e
    except Exception as e:  # a file that is not YAML, a mapping of the wrong shape
        raise ConfigError(f"{KEY}.kubeconfig", f"{path} is not a usable kubeconfig: {e}") from e
    return client.ApiClient(cfg)
