"""`ray-nodeless kuberay-autoscaler`: ray_nodeless as KubeRay's autoscaler.

The head pod runs this command in a container of its own (`ray-nodeless-autoscaler`, which `convert` adds:
kuberay/sidecar.py), with KubeRay's in-tree autoscaler off. It runs Ray's own monitor (v1, or
v2 under RAY_enable_autoscaler_v2: compat/kuberay.py) with a config derived from the live RayCluster every loop, as
Ray's KubeRay path does, except that the provider is ray_nodeless (`registration: kubernetes`): each worker of a group
is the cheapest-fit machine for the group's Ray resources, joins the cluster as a Node, and runs one Ray pod built
from the group's `template` (kuberay/pod_templates.py); on a shape-open cluster (no worker group, or `open_shapes`)
each demand no group holds gets its cheapest fit as a generated node type, its pod made of the first group's
template, or of the head's when there is no group.

Ray's provider is `kuberay_provider.KubeRayNodelessProvider`: NodelessProvider that also lists KubeRay's head pod as
the head node (Ray's autoscaler launches a head when it sees none).

Who does what (docs/kuberay.md; the operator behaviours relied on are listed there with their source):
- The operator keeps the head pod, its services and the RayCluster's status.
- Every worker group is the bridge's: its pods carry `ray.io/cluster` and `ray.io/node-type: worker` (kubectl, the
  status counts and the cluster's suspension see them) but not `ray.io/group`, the label the operator counts and
  deletes a group's pods by, so it never deletes or counts them; and a group must ask the operator for no pod
  (`replicas: 0`, `minReplicas: 0`; the group's minimum for ray_nodeless is `minWorkers` in the annotation): the
  bridge refuses a group that would make the operator create pods of its own.
- The RayCluster carries the finalizer `ray-nodeless.io/machines`: deleting it ends every machine, Node and pod of the
  cluster (ray_nodeless's sweep) before Kubernetes deletes the RayCluster, and so the head pod with this container;
  suspending it ends the machines too (kuberay/ending.py).

Live edits: Ray re-reads the node types every loop (resources, min/max, labels, idle timeout) and hands each launch
the group's node_config; the pod templates are handed to the running provider's registration each loop. What is
read once per provider (the annotation's provider keys: cloud, region, rules, join, ...) makes the container exit
(status 3) when it changes, and Kubernetes restarts it with the new settings (a restart neither duplicates nor leaks
machines: the provider rebuilds its state from the cloud's listing).
"""
from __future__ import annotations

import copy
import logging
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping


from ray_nodeless.errors import CatalogError, ConfigError
from ray_nodeless.kuberay import annotation, ending, scheduling
from ray_nodeless.kuberay.pod_templates import GROUP_LABEL, head_worker_template, worker_pod_template  # noqa: F401
from ray_nodeless.kuberay.scheduling import CatalogFacts
from ray_nodeless.launch.open_types import is_open_type
from ray_nodeless.ray_adapter.context import MonitorContext
from ray_nodeless.ray_adapter.open_driver import YamlFileStore

if TYPE_CHECKING:
    from ray_nodeless.core.catalog import Catalog

logger = logging.getLogger(__name__)

ANNOTATION = annotation.ANNOTATION
FINALIZER = "ray-nodeless.io/machines"
GROUP, VERSION, PLURAL = "ray.io", "v1", "rayclusters"
PROVIDER_MODULE = "ray_nodeless.kuberay.provider.KubeRayNodelessProvider"
HEAD_POD_ENV = "RAY_HEAD_POD_NAME"   # the head pod's name, in the bridge's container (sidecar.OPERATOR_ENV)
RESTART_EXIT = 3          # provider keys changed: Kubernetes restarts the container with them
DEFAULT_GCS_PORT = 6379
MONITOR_KEY = "monitor"   # provider.kuberay.monitor: the bridge's MonitorContext (kuberay/provider.py)
# The cluster config the bridge hands Ray's monitor, also kept as a file in the session dir: the provider's shape-open
# driver writes its generated node types there (open_driver.py), and the bridge hands them to Ray with the rest.
CONFIG_FILE = "ray_nodeless_autoscaling_config.yaml"
# Ray's provider keys for KubeRay that ray_nodeless keeps (foreground_node_launch is not kept: a cloud launch takes
# seconds, so launches run in Ray's launcher threads as with `ray up`).
_RAY_PROVIDER_KEYS = ("disable_node_updaters", "disable_launch_config_check", "worker_liveness_check")


def _annotation_key(rest: str) -> str:
    return annotation.annotation_key(rest)


def _key(group_index: int | None, rest: str) -> str:
    return f"spec.workerGroupSpecs[{group_index}].{rest}" if group_index is not None else rest


def annotation_settings(ray_cr: Mapping[str, Any]) -> dict[str, Any]:
    """The ray_nodeless settings of a RayCluster: its `ray-nodeless.io/config` annotation, read by kuberay/annotation.py
    (the format `ray-nodeless convert` writes): provider keys (cloud, region, rules, exclude, kubernetes.join, ...)
    and `groups: {<groupName>: {minWorkers, node_config}}`."""

    data = annotation.parse_annotation(ray_cr.get("metadata") or {})
    if not data:
        raise ConfigError(annotation.annotation_key(),
                          "missing: the ray_nodeless settings of the cluster (at least `cloud` and `region`, and "
                          "`kubernetes.join`); see docs/kuberay.md")
    if "kuberay" in data:
        raise ConfigError(annotation.annotation_key("kuberay"), "is set by the bridge (KubeRay's head pod)")
    return data


def group_node_config(group: Mapping[str, Any], index: int, facts: CatalogFacts | None,
                      own: Mapping[str, Any]) -> dict[str, Any]:
    """The node_config of a group's node type: its pod scheduling as constraint keys (kuberay/annotation.py group_rules,
    resolved against `facts`, the catalog's CatalogFacts of the cluster's region; a requirement ray_nodeless would
    break is a ConfigError naming it), then the annotation's groups.<name>.node_config over them."""

    rules = scheduling.group_rules(group, key=f"spec.workerGroupSpecs[{index}]", facts=facts)
    rules.check()
    for u in rules.unhonoured:
        if str(u) not in _NOTED:            # the config is derived every loop: each note once per process
            _NOTED.add(str(u))
            logger.warning("kuberay-autoscaler: not honoured: %s", u)
    return {**rules.node_config, **dict(own.get("node_config") or {})}


_NOTED: set[str] = set()


def catalog_and_facts(settings: Mapping[str, Any], catalog: Catalog | None = None) -> tuple[Catalog, CatalogFacts]:
    """The catalog and the CatalogFacts (kuberay/annotation.py) the groups' scheduling is resolved against, for the
    annotation's provider keys `settings`: the instance types and zones of its region in `catalog`, else in the
    catalog the annotation names (launch/catalog.py catalog_for: `live` reads the embedded one, what a failed refresh
    falls back to, so the bridge's loop does no cloud I/O for it). Errors name the annotation's key."""
    from ray_nodeless.operate.config import catalog_for, load_provider

    provider = {k: v for k, v in settings.items() if k not in ("kubernetes", *annotation.CLUSTER_KEYS)}
    try:         # the core keys only: how machines join plays no part in which types exist
        core = load_provider(provider, planning=True).core
        catalog = catalog if catalog is not None else catalog_for(core)
    except ConfigError as e:
        raise annotation.rekey(e) from e
    try:
        return catalog, scheduling.CatalogFacts.of(catalog, core.price_cloud, core.region)
    except CatalogError as e:       # a given catalog without the region
        raise ConfigError(annotation.annotation_key("region"), f"{core.region!r}: {e}") from e


def head_gcs_address(ray_cr: Mapping[str, Any]) -> str:
    """The head's GCS as the workers reach it: the operator's head service (status.head.serviceName, else
    `<cluster>-head-svc`) in the cluster's namespace, on the head's `port` rayStartParam (default 6379)."""
    meta = ray_cr.get("metadata") or {}
    status = ray_cr.get("status") or {}
    svc = (status.get("head") or {}).get("serviceName") or f"{meta.get('name')}-head-svc"
    port = ((ray_cr.get("spec") or {}).get("headGroupSpec") or {}).get("rayStartParams", {}).get("port")
    return f"{svc}.{meta.get('namespace')}.svc:{port or DEFAULT_GCS_PORT}"


def bridge_config(ray_cr: Mapping[str, Any], derived: Mapping[str, Any], head_ip: str = "",
                  facts: CatalogFacts | None = None, context: MonitorContext | None = None,
                  head_id: str = "") -> dict[str, Any]:
    """Ray's autoscaling config of the RayCluster (`derived`, Ray's own derivation) with the provider swapped for
    ray_nodeless: the annotation's provider keys, `registration: kubernetes` in the cluster's namespace, one pod
    template per worker group, each group's node_config (its scheduling resolved against `facts`:
    catalog_and_facts) and minimum from the annotation; `context`, the bridge's MonitorContext, in the provider
    block's `kuberay.monitor` (kuberay/provider.py hands it to NodelessProvider). Pure."""
    settings = annotation_settings(ray_cr)
    groups_cfg = settings.pop(annotation.GROUPS, {}) or {}
    max_workers = settings.pop(annotation.MAX_WORKERS, None)
    meta = ray_cr.get("metadata") or {}
    spec = ray_cr.get("spec") or {}
    workers = list(spec.get("workerGroupSpecs") or [])
    names = [str(g.get("groupName")) for g in workers]
    annotation.check_group_names(groups_cfg, names)     # a typo gets its nearest group name
    config = copy.deepcopy(dict(derived))
    if max_workers is not None:
        config["max_workers"] = max_workers
    elif not workers:
        raise ConfigError(annotation.annotation_key(annotation.MAX_WORKERS),
                          "missing: a RayCluster with no worker group needs the cluster's worker limit (Ray's "
                          "max_workers; each worker is the cheapest fit of a demand, a generated node type), e.g. "
                          "maxWorkers: 10 (and max_hourly_cost for a cost cap)")
    types = config["available_node_types"]
    templates: dict[str, dict[str, Any]] = {}
    for i, g in enumerate(workers):
        name = str(g.get("groupName"))
        # The operator creates clamp(replicas, minReplicas, maxReplicas) pods of a group itself (its
        # GetWorkerGroupDesiredReplicas); a bridged group must ask it for none.
        for k in ("replicas", "minReplicas"):
            if int(g.get(k) or 0) != 0:
                raise ConfigError(_key(i, k), f"is {g.get(k)}: the KubeRay operator would create that many pods "
                                              f"itself, beside ray_nodeless's; set it to 0 and put the minimum in "
                                              f"the annotation's groups.{name}.minWorkers")
        if int(g.get("numOfHosts") or 1) != 1:
            raise ConfigError(_key(i, "numOfHosts"), "multi-host groups are not bridged (one machine per pod)")
        if not (g.get("template") or {}).get("spec", {}).get("containers"):
            raise ConfigError(_key(i, "template.spec.containers"), "must list the Ray container")
        own = groups_cfg.get(name, {})
        t = types[name]
        if "minWorkers" in own:
            m = own["minWorkers"]
            if not isinstance(m, int) or isinstance(m, bool) or m < 0 or m > t["max_workers"]:
                raise ConfigError(_annotation_key(f"groups.{name}.minWorkers"),
                                  f"must be an integer from 0 to the group's maxReplicas ({t['max_workers']})")
            t["min_workers"] = m
        node_config = group_node_config(g, i, facts, own)
        if node_config:
            t["node_config"] = node_config
        templates[name] = worker_pod_template(ray_cr, g)
    kube = dict(settings.pop("kubernetes", None) or {})
    kube.update(namespace=meta.get("namespace"), pod_templates=templates)
    # The template of generated (shape-open) node types: the first group's, else, with no group at all, the head's
    # made a worker's.
    kube["pod_template"] = templates[names[0]] if templates else head_worker_template(ray_cr)
    provider = {k: v for k, v in (derived.get("provider") or {}).items() if k in _RAY_PROVIDER_KEYS}
    provider.update(type="external", module=PROVIDER_MODULE, registration="kubernetes", disable_node_updaters=True)
    provider.update(settings)
    provider.setdefault("gcs_address", head_gcs_address(ray_cr))
    provider["kubernetes"] = kube
    provider["node_type_resources"] = {n: dict(t.get("resources") or {}) for n, t in sorted(types.items())}
    # KubeRay's head pod, listed as the head node (kuberay_provider.py): its IP is the one the monitor serves
    # The head's id: its pod's name where the bridge knows it (run: RAY_HEAD_POD_NAME), the id Ray's v2 autoscaler
    # knows the head's Ray node by (the operator sets RAY_CLOUD_INSTANCE_ID to it in the head's Ray container), so
    # v2 sees its head running and scales; a stable stand-in name otherwise.
    provider["kuberay"] = {"head_id": head_id or f"kuberay-head-{meta.get('name')}", "head_ip": head_ip,
                           "head_node_type": config["head_node_type"]}
    if context is not None:
        provider["kuberay"][MONITOR_KEY] = context.to_mapping()
    config["provider"] = provider
    return config


def without_templates(provider: Mapping[str, Any]) -> dict[str, Any]:
    """A provider block without what the bridge hands the running provider itself (the pod templates) and what Ray
    re-reads (node_type_resources): what, when it changes, needs a new provider."""
    p = copy.deepcopy(dict(provider))
    p.pop("node_type_resources", None)
    k = dict(p.get("kubernetes") or {})
    k.pop("pod_template", None)
    k.pop("pod_templates", None)
    p["kubernetes"] = k
    return p


# What the bridge does with the API beyond the registration's verbs (registrations/kubernetes/check.py NEEDED): read
# the RayCluster every loop and patch its finalizers. cluster-configs/kuberay/rbac.yaml and KubeRay's Role grant both.
NEEDED = (("ray.io", "rayclusters", "get"), ("ray.io", "rayclusters", "patch"))
RBAC_MANIFEST = "cluster-configs/kuberay/rbac.yaml"


def check_access(api: Any, namespace: str) -> None:
    """A SelfSubjectAccessReview per verb the bridge and its registration use, in the cluster's namespace (Nodes
    cluster-wide); ConfigError naming the first one missing. Run at start: a missing grant is one clear line rather
    than a monitor failing at its first launch."""
    from kubernetes import client

    from ray_nodeless.registrations.kubernetes.check import NEEDED as REGISTRATION_NEEDED

    wanted = [(g, r, v, True) for g, r, v in NEEDED] + [("", r, v, ns) for r, _sub, v, ns in REGISTRATION_NEEDED]
    authz = client.AuthorizationV1Api(api)
    for group, resource, verb, namespaced in wanted:
        attrs = {"group": group, "resource": resource, "verb": verb}
        if namespaced:
            attrs["namespace"] = namespace
        r = authz.create_self_subject_access_review({"apiVersion": "authorization.k8s.io/v1",
                                                     "kind": "SelfSubjectAccessReview",
                                                     "spec": {"resourceAttributes": attrs}})
        if not r.status.allowed:
            where = f"in namespace {namespace!r}" if namespaced else "(cluster-wide)"
            raise ConfigError("serviceAccount", f"forbidden by RBAC: cannot {verb} {group + '/' if group else ''}"
                                                f"{resource} {where}; grant KubeRay's autoscaler Role and "
                                                f"{RBAC_MANIFEST}")


class RayClusterApi:
    """The RayCluster resource through the Kubernetes API (CustomObjectsApi): get, and the finalizer."""

    def __init__(self, api_client: Any, name: str, namespace: str):
        from kubernetes import client

        self.objects = client.CustomObjectsApi(api_client)
        self.name, self.namespace = name, namespace

    def get(self) -> dict[str, Any] | None:
        """The RayCluster, None once it is gone."""
        from kubernetes.client.rest import ApiException

        try:
            return self.objects.get_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, self.name)
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def set_finalizers(self, ray_cr: Mapping[str, Any], finalizers: list[str]) -> None:
        # A merge patch carrying the resourceVersion read: a concurrent change of the RayCluster (the operator's own
        # GCS finalizer, a user's edit) makes it fail with 409 instead of overwriting the list; the next loop retries.
        meta = ray_cr.get("metadata") or {}
        self.objects.patch_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, self.name, {
            "metadata": {"finalizers": finalizers, "resourceVersion": meta.get("resourceVersion")}})


@dataclass
class KubeRayBridge:
    """The config reader Ray's monitor calls every loop (v1 calls it; v2 through its KubeRay config reader)."""

    rayclusters: RayClusterApi
    head_ip: str
    derive: Callable[[dict[str, Any]], dict[str, Any]]          # compat.kuberay.derive_config
    provider_of: Callable[[dict[str, Any], str], Any]           # compat.kuberay.node_provider
    sweep: Callable[[dict[str, Any]], bool]                     # ends every machine, Node and pod; True when all
    first: dict[str, Any] | None = None                         # the provider block Ray's provider was built with
    last: dict[str, Any] | None = None                          # the last full config handed to Ray
    _warned: str = ""
    _facts: tuple[str, CatalogFacts] | None = None              # (the annotation they were loaded for, the facts)
    context: MonitorContext | None = None                       # set by `run` once the head answers
    head_id: str = ""                                           # the head pod's name (bridge_config)

    def config(self, ray_cr: dict[str, Any]) -> dict[str, Any]:
        return bridge_config(ray_cr, self.derive(ray_cr), self.head_ip, self.catalog_facts(ray_cr), self.context,
                             self.head_id)

    def with_open_types(self, cfg: dict[str, Any]) -> dict[str, Any]:
        """`cfg` with the shape-open node types the provider keeps in the context's config file, written back to
        that file (atomically: the provider reads it at any moment). The provider's driver and this method both
        rewrite the file; should one overwrite the other's change, the driver writes its types again at its next
        pass (a second later), which is why the file, not a copy in memory, is the one place they live."""
        path = self.context.config_path if self.context is not None else None
        if not path:
            return cfg
        store = YamlFileStore(path)
        try:
            kept = store.read().get("available_node_types") or {} if store.path.exists() else {}
        except Exception as e:          # a torn or unreadable file: the driver writes its types again
            logger.warning("kuberay-autoscaler: cannot read %s (%s); generated node types are written again",
                           path, e)
            kept = {}
        types = dict(cfg.get("available_node_types") or {})
        for name, t in kept.items():
            if is_open_type(t) and name not in types:
                types[name] = t
        cfg = {**cfg, "available_node_types": types}
        store.write(cfg)
        return cfg

    def catalog_facts(self, ray_cr: Mapping[str, Any]) -> CatalogFacts:
        """catalog_and_facts of the annotation, loaded again only when it changes (the loop runs every few
        seconds)."""
        text = str(((ray_cr.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION))
        if self._facts is None or self._facts[0] != text:
            self._facts = (text, catalog_and_facts(annotation_settings(ray_cr))[1])
        return self._facts[1]

    def __call__(self) -> dict[str, Any]:
        ray_cr = self.rayclusters.get()
        if ray_cr is None or ending.deleted(ray_cr):
            self.teardown(ray_cr)
            raise SystemExit(0)
        if ending.suspended(ray_cr):          # the operator deletes every pod of it: the machines are ours to end
            ending.end_machines(self, ray_cr, why="suspended")
            raise SystemExit(0)
        cfg = self.config(ray_cr)
        self._ensure_finalizer(ray_cr)
        provider = cfg["provider"]
        if self.first is None:
            self.first = copy.deepcopy(provider)
        elif without_templates(provider) != without_templates(self.first):
            changed = sorted(k for k in set(provider) | set(self.first)
                             if without_templates(provider).get(k) != without_templates(self.first).get(k))
            logger.warning("kuberay-autoscaler: provider settings changed (%s); exiting so that the container "
                           "restarts with them", ", ".join(changed))
            raise SystemExit(RESTART_EXIT)
        else:
            live = self.provider_of(self.first, cfg["cluster_name"])
            registration = getattr(live, "registration", None)
            if registration is not None and hasattr(registration, "set_pod_templates"):
                registration.set_pod_templates(provider["kubernetes"].get("pod_templates") or {})
        cfg["provider"] = copy.deepcopy(self.first)   # Ray keeps one provider per block: hand it the same one
        cfg = self.with_open_types(cfg)
        self.last = cfg
        return cfg

    def _ensure_finalizer(self, ray_cr: dict[str, Any]) -> None:
        finalizers = list((ray_cr.get("metadata") or {}).get("finalizers") or [])
        if FINALIZER in finalizers:
            return
        try:
            self.rayclusters.set_finalizers(ray_cr, finalizers + [FINALIZER])
            logger.info("kuberay-autoscaler: finalizer %s set on RayCluster %s", FINALIZER, self.rayclusters.name)
        except Exception as e:     # a concurrent update (409/422 from the test op): next loop
            logger.warning("kuberay-autoscaler: cannot set the finalizer %s yet (%s); next loop", FINALIZER, e)

    def teardown(self, ray_cr: dict[str, Any] | None) -> bool:
        """The RayCluster is being deleted (or is gone): end every machine, Node and pod of the cluster
        (kuberay/ending.py), then let Kubernetes delete it (drop the finalizer); True once they are ended."""
        if not ending.end_machines(self, ray_cr, why="being deleted"):
            return False
        if ray_cr is not None:
            finalizers = [f for f in (ray_cr.get("metadata") or {}).get("finalizers") or [] if f != FINALIZER]
            self.rayclusters.set_finalizers(ray_cr, finalizers)
            logger.warning("kuberay-autoscaler: finalizer %s removed", FINALIZER)
        return True


def sweep_cluster(cluster_config: dict[str, Any]) -> bool:
    """ray_nodeless's sweep of the cluster (operate/sweep.py): machines, then their Nodes and pods; True if all
    ended. Run twice: a launch Ray's threads had under way when the first listing ran is ended by the second."""
    from ray_nodeless.operate.sweep import Sweep

    ok = True
    for _ in range(2):
        sweep = Sweep(cluster_config, progress=lambda m: logger.info("%s", m))
        try:
            result = sweep.run()
            ok = result.ok
        finally:
            sweep.close()
    return ok


def api_client(kubeconfig: str | None) -> Any:
    """The Kubernetes API: in-cluster (the head pod's ServiceAccount) unless a kubeconfig is given."""
    from kubernetes import client, config

    cfg = client.Configuration()
    if kubeconfig:
        config.load_kube_config(config_file=os.path.expanduser(kubeconfig), client_configuration=cfg,
                                persist_config=False)
    else:
        config.load_incluster_config(client_configuration=cfg)
    return client.ApiClient(cfg)


def gcs_address_of(ray_cr: Mapping[str, Any], node_ip: str) -> str:
    """The head's GCS as this container reaches it, as Ray's `ray kuberay-autoscaler` derives it: the autoscaler runs
    in the head pod (its network namespace), so the GCS is this pod's IP on the head's `port` rayStartParam (Ray
    assumes 6379, KubeRay's default; the RayCluster says when it is another)."""
    port = ((ray_cr.get("spec") or {}).get("headGroupSpec") or {}).get("rayStartParams", {}).get("port")
    return f"{node_ip}:{port or DEFAULT_GCS_PORT}"


def monitor_context(gcs_address: str, logs_dir: str) -> MonitorContext:
    """The bridge's MonitorContext: it is the cluster's autoscaler; the config file is CONFIG_FILE in the session
    dir (the parent of the logs dir Ray's head reports, shared with the head container as /tmp/ray is)."""
    return MonitorContext(gcs_address=gcs_address, logs_dir=logs_dir, acts_on_cluster=True,
                          config_path=os.path.join(os.path.dirname(os.path.normpath(logs_dir)), CONFIG_FILE))


def run(cluster_name: str, namespace: str, *, gcs_address: str | None = None, kubeconfig: str | None = None) -> None:
    """The command: check the RayCluster once (bad settings exit before Ray's monitor starts), wait for the head,
    build the provider's MonitorContext from what the bridge knows (the GCS address, the session's logs dir the head
    reports, the config file it writes), then run Ray's monitor with the bridge as its config reader."""
    from ray_nodeless.ray_compat import kuberay as ray_kuberay

    api = api_client(kubeconfig)
    rayclusters = RayClusterApi(api, cluster_name, namespace)
    check_access(api, namespace)
    ray_cr = rayclusters.get()
    if ray_cr is None:
        raise ConfigError("--cluster-name", f"RayCluster {namespace}/{cluster_name} does not exist")
    address = gcs_address or gcs_address_of(ray_cr, ray_kuberay.node_ip())
    bridge = KubeRayBridge(rayclusters, address.rsplit(":", 1)[0], ray_kuberay.derive_config,
                           ray_kuberay.node_provider, sweep_cluster,
                           head_id=os.environ.get(HEAD_POD_ENV, ""))   # the operator's env of our container
    bridge.config(ray_cr)      # a ConfigError names the key before anything runs
    head = ray_kuberay.connect(address)
    bridge.context = monitor_context(address, head.logs_dir)
    logger.info("kuberay-autoscaler: GCS %s, logs %s, config file %s", address, head.logs_dir,
                bridge.context.config_path)
    ending.run_until_terminated(bridge, lambda: ray_kuberay.run_monitor(bridge, head))
