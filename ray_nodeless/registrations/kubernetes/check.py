"""Bad input before any launch: every check of `registration: kubernetes`, as ConfigErrors naming the key.

`check_static(settings)` (the section as the loader parsed it) needs no network (`ray-nodeless plan` runs it, through
the registration's
`check_config`); `check(settings)` adds the API server's answers and is run by `bootstrap_config`, so
`ray up` fails before the head is created.

- the block itself (unknown join method -> provider.kubernetes.join.method, missing join keys such as eks's
  `cluster` or kubeadm's `token`), a pod_template without a Ray container (provider.kubernetes.pod_template),
- a kubeconfig file that is not there (provider.kubernetes.kubeconfig),
- unreadable kubeconfig / unknown context (provider.kubernetes.kubeconfig / .context),
- unreachable API server (provider.kubernetes.kubeconfig, naming the server),
- forbidden by RBAC: a SelfSubjectAccessReview per verb the registration uses (provider.kubernetes),
- unknown namespace (provider.kubernetes.namespace),
- a pod_template the API server rejects: a server-side dry run of a Ray pod built from it
  (provider.kubernetes.pod_template).
"""
from __future__ import annotations

import json
from typing import TYPE_CHECKING, Mapping

from ray_nodeless.errors import ConfigError
from ray_nodeless.registrations.kubernetes.join import check_join
from ray_nodeless.registrations.kubernetes.settings import KubernetesSettings

if TYPE_CHECKING:
    from kubernetes import client
    from kubernetes.client.rest import ApiException

KEY = "provider.kubernetes"
CHECK_TIMEOUT_S = 10
RBAC_MANIFEST = "cluster-configs/kubernetes-rbac.yaml"

# Every (resource, subresource, verb, namespaced) the registration uses; kept in sync with the RBAC manifest.
NEEDED = (
    ("nodes", "", "list", False), ("nodes", "", "watch", False), ("nodes", "", "patch", False),
    ("nodes", "", "delete", False),
    ("pods", "", "create", True), ("pods", "", "list", True), ("pods", "", "watch", True),
    ("pods", "", "delete", True),
)


def check_static(settings: KubernetesSettings) -> KubernetesSettings:
    """The checks that need no API server, on the registration's section as the loader parsed it: the join
    method's keys and the pod template (a Ray pod needs its container: `spec.containers`, the first one runs
    Ray)."""
    k = settings.kubernetes
    check_join(k.join)
    key = f"{KEY}.pod_template"
    template = k.pod_template
    if not template:
        raise ConfigError(key, "missing: the Ray pod's template (metadata + spec, like a KubeRay group's "
                               "`template`), with spec.containers[0] the Ray container and its image")
    spec = template.get("spec")
    if not isinstance(spec, Mapping):
        raise ConfigError(f"{key}.spec", f"must be a pod spec mapping, got {spec!r}")
    containers = spec.get("containers")
    if not isinstance(containers, list) or not containers:
        raise ConfigError(f"{key}.spec.containers", "must list the Ray container (containers[0]: name, image)")
    for i, c in enumerate(containers):
        if not isinstance(c, Mapping):
            raise ConfigError(f"{key}.spec.containers[{i}]", f"must be a container mapping, got {c!r}")
        image = c.get("image")
        if image is not None and (not isinstance(image, str) or not image.strip()):
            raise ConfigError(f"{key}.spec.containers[{i}].image", f"must be an image name, got {image!r}")
    return settings


def check(settings: KubernetesSettings, cluster_name: str = "check",
          api: "client.ApiClient | None" = None) -> None:
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    from ray_nodeless.registrations.kubernetes.pods import ray_pod

    k = check_static(settings).kubernetes
    api = api or k.api_client()          # a kubeconfig file that cannot be read names provider.kubernetes.kubeconfig
    server = api.configuration.host
    try:
        client.VersionApi(api).get_code(_request_timeout=CHECK_TIMEOUT_S)
    except ApiException as e:
        if e.status in (401,):
            raise ConfigError(f"{KEY}.kubeconfig", f"the API server {server} refused the credentials "
                                                   f"(401 Unauthorized)") from e
        if e.status != 403:
            raise ConfigError(f"{KEY}.kubeconfig", f"the API server {server} answered {e.status} {e.reason}") from e
    except Exception as e:
        raise ConfigError(f"{KEY}.kubeconfig", f"the API server {server} is unreachable: {_short(e)}") from e
    authz = client.AuthorizationV1Api(api)
    for resource, sub, verb, namespaced in NEEDED:
        attrs = {"group": "", "resource": resource, "verb": verb}
        if sub:
            attrs["subresource"] = sub
        if namespaced:
            attrs["namespace"] = k.namespace
        try:
            r = authz.create_self_subject_access_review(
                {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                 "spec": {"resourceAttributes": attrs}}, _request_timeout=CHECK_TIMEOUT_S)
        except ApiException as e:
            raise ConfigError(KEY, f"cannot check permissions on {server}: {e.status} {e.reason}") from e
        if not r.status.allowed:
            where = f" in namespace {k.namespace!r}" if namespaced else " (cluster-wide)"
            raise ConfigError(f"{KEY}.namespace" if namespaced else KEY,
                              f"forbidden by RBAC: cannot {verb} {resource}{'/' + sub if sub else ''}{where}; "
                              f"grant the roles of {RBAC_MANIFEST}")
    manifest = ray_pod(k.pod_template, cluster=cluster_name, namespace=k.namespace, machine_id="dry-run",
                       node_type="check", is_head=False, instance_type="check", allocatable={"cpu": "1",
                       "memory": "1Gi"}, reserve_cpu=k.pod_reserve.cpu, reserve_memory=k.pod_reserve.memory,
                       grace_s=k.pod_grace_s, gcs_address=settings.gcs_address_at("127.0.0.1"),
                       ray_resources={"CPU": 1.0}, ray_labels={})
    try:
        client.CoreV1Api(api).create_namespaced_pod(k.namespace, manifest, dry_run="All",
                                                    _request_timeout=CHECK_TIMEOUT_S)
    except ApiException as e:
        msg = _api_message(e)
        if e.status == 404 and "namespace" in msg.lower():
            raise ConfigError(f"{KEY}.namespace", f"namespace {k.namespace!r} does not exist on {server}") from e
        if e.status == 403:
            raise ConfigError(f"{KEY}.namespace", f"forbidden by RBAC: {msg}") from e
        raise ConfigError(f"{KEY}.pod_template", f"rejected by the API server (dry run): {msg}") from e


def _api_message(e: ApiException) -> str:
    try:
        return json.loads(e.body).get("message") or f"{e.status} {e.reason}"
    except Exception:
        return f"{e.status} {e.reason}"


def _short(e: Exception) -> str:
    text = str(e)
    return text if len(text) < 300 else text[:297] + "..."
