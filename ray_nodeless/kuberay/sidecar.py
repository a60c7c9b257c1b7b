"""The bridge's container in the head pod, as `convert` writes it.

Why not KubeRay's own autoscaler container: KubeRay v1.5.0 (its newest release) builds that container from
`autoscalerOptions` image, imagePullPolicy, env, envFrom, resources, volumeMounts and securityContext only. Its
command is fixed (`ray kuberay-autoscaler ...`, Ray's own autoscaler), and its CRD has no
`autoscalerOptions.command` / `args`, so the API server prunes them from an applied RayCluster (found against the
real operator: tests/e2e/test_kuberay_operator.py). So convert turns KubeRay's in-tree autoscaler off and adds its own
container to the head pod template, as the operator adds its one:
- `enableInTreeAutoscaling: false`, and the head's `ray start` gets `--no-monitor` (rayStartParams
  `no-monitor: "true"`, which the operator adds itself when its autoscaler is on): the bridge is the cluster's only
  autoscaler;
- the container `ray-nodeless-autoscaler` runs `ray-nodeless kuberay-autoscaler` with the operator's env
  (RAY_CLUSTER_NAME from the pod's `ray.io/cluster` label, RAY_CLUSTER_NAMESPACE, RAY_HEAD_POD_NAME) and default
  resources (500m CPU, 512Mi); the user's autoscalerOptions image / imagePullPolicy / env / envFrom / resources /
  volumeMounts / securityContext move to it (idleTimeoutSeconds, upscalingMode and version stay: Ray's derivation
  reads them);
- Ray's v2 autoscaler, where the manifest asks for it (`autoscalerOptions.version: v2`, or the head's Ray container
  env `RAY_enable_autoscaler_v2`): the head's rayStartParams `system-config` gets `enable_autoscaler_v2: true`, and
  the env is dropped. The operator refuses that env with its autoscaler off ("cannot be set to '1' when
  enableInTreeAutoscaling is false": ray-operator utils/validation.go, found against the real operator) and sets it
  for `version: v2` only with its autoscaler on; the bridge's monitor asks the head's GCS which version runs;
- /tmp/ray is shared between the Ray container and it (an emptyDir, as the operator shares its `ray-logs`): the
  bridge reads the head's session directory there and writes its config file into it.
The operator then gives the head's ServiceAccount no autoscaler Role either: cluster-configs/kuberay/rbac.yaml grants
all the bridge uses. A head template without a serviceAccountName gets the RayCluster's name, the name KubeRay gives
that account when its autoscaler is on (for a RayJob or RayService: its own name).
"""
from __future__ import annotations

import copy
import json
import shlex
from typing import Any, Mapping, MutableMapping

from ray_nodeless.errors import ConfigError
from ray_nodeless.kuberay import shape

CONTAINER = "ray-nodeless-autoscaler"
V2_ENV = "RAY_enable_autoscaler_v2"
SYSTEM_CONFIG = "system-config"
COMMAND = ["ray-nodeless"]
ARGS = ["kuberay-autoscaler"]
VOLUME = "ray-nodeless-tmp"
RAY_TMP = "/tmp/ray"
# autoscalerOptions keys that describe KubeRay's autoscaler container: they move to ours.
CONTAINER_OPTIONS = ("image", "imagePullPolicy", "env", "envFrom", "resources", "volumeMounts", "securityContext")
# Keys KubeRay v1.5.0 does not know (its CRD prunes them): dropped, with a note.
PRUNED_OPTIONS = ("command", "args")
# The operator's own autoscaler container (ray-operator common/pod.go BuildAutoscalerContainer), as far as ours
# follows it.
DEFAULT_RESOURCES = {"limits": {"cpu": "500m", "memory": "512Mi"}, "requests": {"cpu": "500m", "memory": "512Mi"}}
OPERATOR_ENV = [
    {"name": "RAY_CLUSTER_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['ray.io/cluster']"}}},
    {"name": "RAY_CLUSTER_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
    {"name": "RAY_HEAD_POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
]


def autoscaler_container(pod_spec: MutableMapping[str, Any]) -> dict[str, Any] | None:
    """The bridge's container of a head pod spec (a converted template, or the pod the operator made of it)."""
    for c in pod_spec.get("containers") or []:
        if isinstance(c, dict) and c.get("name") == CONTAINER:
            return c
    return None


def _entries(value: Any, key: str) -> list[Any]:
    """A list of mappings (null or absent: empty), else ConfigError naming `key`."""
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, Mapping) for v in value):
        raise ConfigError(key, f"must be a list of mappings, got {shape._type(value)}")
    return value


def _string(value: Any, key: str) -> None:
    if value is not None and not isinstance(value, str):
        raise ConfigError(key, f"must be a string, got {shape._type(value)}")


def check(spec: Mapping[str, Any], spec_key: str) -> None:
    """What `install` reads and writes, of the shapes Kubernetes gives them: a ConfigError naming the key first,
    nothing changed (kuberay/shape.py checked the head group and its first container)."""
    head = f"{spec_key}.headGroupSpec"
    pod_key = f"{head}.template.spec"
    pod = shape._mapping(spec["headGroupSpec"]["template"].get("spec"), pod_key)
    shape._mapping(spec["headGroupSpec"].get("rayStartParams"), f"{head}.rayStartParams")
    containers = _entries(pod.get("containers"), f"{pod_key}.containers")
    if containers:
        _entries(containers[0].get("volumeMounts"), f"{pod_key}.containers[0].volumeMounts")
    _entries(pod.get("volumes"), f"{pod_key}.volumes")
    _string(pod.get("serviceAccountName"), f"{pod_key}.serviceAccountName")
    opts_key = f"{spec_key}.autoscalerOptions"
    opts = shape._mapping(spec.get("autoscalerOptions"), opts_key)
    for k in ("env", "envFrom", "volumeMounts"):
        _entries(opts.get(k), f"{opts_key}.{k}")
    for k in ("resources", "securityContext"):
        shape._mapping(opts.get(k), f"{opts_key}.{k}")
    _string(opts.get("imagePullPolicy"), f"{opts_key}.imagePullPolicy")


def _autoscaler_v2(spec: MutableMapping[str, Any], spec_key: str, params: MutableMapping[str, Any]) -> list[str]:
    """Ray's v2 autoscaler as the module docstring says: the notes for the user."""
    containers = spec["headGroupSpec"]["template"]["spec"].get("containers") or []
    if not containers or not isinstance(containers[0], dict):
        return []           # install refuses it, naming the key
    ray = containers[0]
    env = [e for e in ray.get("env") or [] if isinstance(e, dict)]
    by_env = [e for e in env if e.get("name") == V2_ENV]
    by_version = (spec.get("autoscalerOptions") or {}).get("version") == "v2"
    if not by_env and not by_version:
        return []
    notes = []
    if by_env:
        ray["env"] = [e for e in ray.get("env") or [] if not (isinstance(e, dict) and e.get("name") == V2_ENV)]
        if not ray["env"]:
            del ray["env"]
        if str(by_env[-1].get("value", "")).lower() not in ("1", "true"):
            return [f"{spec_key}.headGroupSpec.template.spec.containers[0].env.{V2_ENV}: dropped (the operator "
                    f"refuses it when its autoscaler is off)"]
    key = f"{spec_key}.headGroupSpec.rayStartParams.{SYSTEM_CONFIG}"
    given = params.get(SYSTEM_CONFIG)
    system: dict[str, Any] = {}
    if given not in (None, ""):
        text = str(given).strip()
        try:
            system = json.loads(shlex.split(text)[0] if text[:1] in "'\"" else text)
        except ValueError as e:
            raise ConfigError(key, f"must be a JSON object (Ray's system config), got {given!r}: {e}") from None
        if not isinstance(system, dict):
            raise ConfigError(key, f"must be a JSON object (Ray's system config), got {given!r}")
    if system.get("enable_autoscaler_v2") is not True:
        notes.append(f"{key}: enable_autoscaler_v2 (Ray's v2 autoscaler under the bridge; the operator refuses "
                     f"{V2_ENV} with its own autoscaler off)")
    system["enable_autoscaler_v2"] = True
    # single-quoted: the operator puts `--system-config=<value>` into the head's shell command as is
    params[SYSTEM_CONFIG] = shlex.quote(json.dumps(system, separators=(",", ":"), sort_keys=True))
    return notes


def install(spec: MutableMapping[str, Any], spec_key: str, name: str, image: str | None) -> list[str]:
    """Patch a RayCluster spec (already checked by kuberay/shape.py) for the bridge as the module docstring says;
    the notes for the user. Converting a converted manifest again gives the same result. Bad shapes are refused
    before anything changes (`check`)."""
    check(spec, spec_key)
    notes: list[str] = []
    head = spec["headGroupSpec"]
    template = head["template"]
    pod = template.setdefault("spec", {})
    opts = dict(spec.get("autoscalerOptions") or {})
    if spec.get("enableInTreeAutoscaling"):
        notes.append(f"{spec_key}.enableInTreeAutoscaling: true -> false: the head pod runs the bridge in its "
                     f"container {CONTAINER!r} instead of KubeRay's autoscaler container")
    spec["enableInTreeAutoscaling"] = False
    for k in PRUNED_OPTIONS:
        if k in opts:
            notes.append(f"{spec_key}.autoscalerOptions.{k}: dropped (KubeRay v1.5.0 has no such option; the "
                         f"container {CONTAINER!r} runs `ray-nodeless kuberay-autoscaler`)")
            del opts[k]
    moved = {k: opts.pop(k) for k in CONTAINER_OPTIONS if k in opts}
    image = image or moved.get("image")
    if opts:
        spec["autoscalerOptions"] = opts
    else:
        spec.pop("autoscalerOptions", None)
    params = head.setdefault("rayStartParams", {})
    params["no-monitor"] = "true"
    notes += _autoscaler_v2(spec, spec_key, params)

    containers = [c for c in pod.get("containers") or [] if not (isinstance(c, dict) and c.get("name") == CONTAINER)]
    if not containers:
        raise ConfigError(f"{spec_key}.headGroupSpec.template.spec.containers", "no Ray container")
    ray = containers[0]
    mounts = [m for m in ray.get("volumeMounts") or [] if not (isinstance(m, dict) and m.get("name") == VOLUME)]
    volumes = [v for v in pod.get("volumes") or [] if not (isinstance(v, dict) and v.get("name") == VOLUME)]
    users = next((m for m in mounts if isinstance(m, dict) and m.get("mountPath") == RAY_TMP), None)
    if users is not None:          # the user's own /tmp/ray volume: the bridge's container mounts it too
        tmp_volume = users["name"]
    else:
        tmp_volume = VOLUME
        mounts.append({"name": VOLUME, "mountPath": RAY_TMP})
        volumes.append({"name": VOLUME, "emptyDir": {}})
    ray["volumeMounts"] = mounts
    if volumes:
        pod["volumes"] = volumes

    env = copy.deepcopy(OPERATOR_ENV)
    env += [e for e in moved.get("env") or [] if not any(isinstance(e, dict) and e.get("name") == o["name"]
                                                         for o in OPERATOR_ENV)]
    own_mounts = [m for m in moved.get("volumeMounts") or [] if isinstance(m, dict) and m.get("mountPath") != RAY_TMP]
    container: dict[str, Any] = {
        "name": CONTAINER, "image": image, "imagePullPolicy": moved.get("imagePullPolicy") or "IfNotPresent",
        "command": list(COMMAND), "args": list(ARGS), "env": env,
        "resources": moved.get("resources") or copy.deepcopy(DEFAULT_RESOURCES),
        "volumeMounts": [{"name": tmp_volume, "mountPath": RAY_TMP}, *own_mounts],
    }
    if image is None:
        del container["image"]
    for k in ("envFrom", "securityContext"):
        if moved.get(k) is not None:
            container[k] = moved[k]
    pod["containers"] = [*containers, container]
    if not pod.get("serviceAccountName"):
        pod["serviceAccountName"] = name
        notes.append(f"{spec_key}.headGroupSpec.template.spec.serviceAccountName: {name!r} (the bridge acts as the "
                     "head pod's ServiceAccount: create it with cluster-configs/kuberay/rbac.yaml)")
    return notes
