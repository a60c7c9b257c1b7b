"""What `ray up` asks of the provider class before any machine exists: validate and plan the cluster YAML
(`bootstrap_config`), and fill in node types' resources from the instance they would get."""
from __future__ import annotations

import copy
import logging
from typing import Any

from ray_nodeless.core.idle import SOURCE_BREAK_EVEN, SOURCE_NODE_TYPE
from ray_nodeless.core.setting_groups import flat_key
from ray_nodeless.errors import BackendError, CatalogError, ConfigError, NoFeasibleOffering
from ray_nodeless.launch.open_types import shape_open
from ray_nodeless.operate.config import ProviderBundle, check_cluster, check_node_types, load_provider
from ray_nodeless.operate.plugin_install import check_file_mounts
from ray_nodeless.providers import backend_config
from ray_nodeless.ray_compat import in_teardown
from ray_nodeless.ray_adapter.ray_defaults import fill_ray_defaults
from ray_nodeless.registrations.vm_boot import BOOT_KEY, boots_itself

logger = logging.getLogger(__name__)

NODE_TYPE_RESOURCES_KEY = "node_type_resources"   # read by the provider objects Ray builds later
IDLE_LEARN_TYPES_KEY = "idle_learn_types"         # the same


def bootstrap_config(cluster_config: dict[str, Any]) -> dict[str, Any]:
    """Everything `ray up` needs before any machine exists, checked and filled here:

    1. the top-level keys Ray reads after the head launches, from Ray's defaults of the cloud when missing
       (`ray_defaults.fill_ray_defaults`);
    2. every key validated and every node type planned, so a bad key or an infeasible shape fails first
       (`operate.config.check_cluster`: types, catalog values, launch keys against the cloud's request model,
       names, the cost cap), then the registration's live checks (`Registration.preflight`; Kubernetes: the
       kubeconfig, API server, RBAC, namespace and a dry run of the pod);
    3. the cloud's bootstrap as Ray's own provider does it, by the backend's `bootstrap` hook (AWS: default AMI,
       head IAM instance profile, key pair, subnets of the allowed zones, security group, by Ray's own functions:
       `providers/aws/bootstrap.py`; GCP: `providers/gcp/bootstrap.py`), then planned again on the zones that can
       actually be launched into;
    4. what later provider objects need, recorded in the provider block.

    A missing AMI (no ImageId, no provider.image_id and no Ray default for the region) or `project_id: null` fails
    in step 2 or 3, before anything is created. Under `ray down` planning and cloud-bootstrap failures are
    warnings: teardown must terminate the machines whatever the config says now."""
    config = copy.deepcopy(cluster_config)
    fill_ray_defaults(config)
    teardown = in_teardown()
    bundle = load_provider(config.get("provider"))
    provider = config["provider"]
    try:
        bundle = settle_images(config, bundle)
        cp = check_cluster(config, bundle=bundle)
        # The registration's live services (Kubernetes: kubeconfig, API server, RBAC, namespace, a dry run of the
        # pod) before anything of the cloud is touched: `ray up` then fails before the head is created.
        bundle.registration_class.preflight(bundle.registration_settings, str(config.get("cluster_name", "")))
        allowed = {name: p.request.requirements.zones for name, p in cp.plans.items()}
        if bundle.backend_class().bootstrap(config, bundle.core.registration, allowed):
            # The cloud's bootstrap wrote keys into the provider block (subnets, zones): read it again, then plan
            # on the zones the filled subnets allow.
            bundle = load_provider(provider)
            cp = check_cluster(config, bundle=bundle)
        # Last, so that a config mistake is named first: file_mounts sources (the plugin's wheel: `make wheel`)
        # exist here, and self-booting workers run no command that needs one (operate/plugin_install.py).
        check_file_mounts(config, workers_boot_themselves=bool(provider.get("disable_node_updaters"))
                          and bundle.core.registration == "vm" and boots_itself(bundle.core.cloud))
    except (NoFeasibleOffering, CatalogError, BackendError, ConfigError) as e:
        if not teardown:
            raise
        # `ray down` ends every machine of the cluster whatever the rules say now: keys are still checked (the
        # backend must be built), the plan and the cloud's bootstrap are not.
        logger.warning("ray down: not planning (%s); terminating the cluster's machines anyway", e)
        check_node_types(config, bundle)
    else:
        for name, p in cp.plans.items():
            o = p.chosen
            logger.info("%s: %s in %s (%s) at $%.4f/h by rule %r", name, o.instance_type.name, o.zone,
                        o.capacity, o.hourly_price or 0.0, p.request.rule)
        # Cost-aware idle release (core/idle.py): Ray v2 reads a per-type idle_timeout_s; a type's own value stays.
        for name, idle in cp.idle.items():
            # A break-even timeout always has its seconds (core/idle.py); None is only the cluster-wide "never".
            if idle.source == SOURCE_BREAK_EVEN and idle.seconds is not None:
                config["available_node_types"][name]["idle_timeout_s"] = round(idle.seconds, 3)
        # The types the monitor's learned idle release may end sooner (launch/idle_release.py): not a type whose
        # own idle_timeout_s the user set.
        provider[IDLE_LEARN_TYPES_KEY] = sorted(name for name, idle in cp.idle.items()
                                                if idle.source != SOURCE_NODE_TYPE)
    # Workers that start Ray from their own boot script (registrations/vm.py) run these commands. Ray's
    # prepare_config has already prepended setup_commands to worker_setup_commands; do not run them twice.
    setup = list(config.get("setup_commands") or [])
    worker_setup = list(config.get("worker_setup_commands") or [])
    if setup and worker_setup[:len(setup)] == setup:
        setup = []
    provider[BOOT_KEY] = {"setup": setup + worker_setup,
                          "start": list(config.get("worker_start_ray_commands") or [])}
    # The head is created by `create_node`, which gets no resources: it is planned on the recorded shape.
    provider[NODE_TYPE_RESOURCES_KEY] = {
        name: dict(nt.get("resources") or {}) for name, nt in sorted(config["available_node_types"].items())}
    return config


OPEN_TEMPLATE = "<shape-open node types>"      # the template's stand-in name while the backend settles its image


def settle_images(config: dict[str, Any], bundle: ProviderBundle) -> ProviderBundle:
    """Static, before planning: a node type's image as Ray would default it (the backend's `fill_default_images`;
    AWS: Ray's default AMI per region). A shape-open cluster's template of generated types (`provider.open.
    node_config`, as the YAML wrote the key) is settled the same way, as one more node type, so a generated type
    boots what a declared one would (a KubeRay cluster's groups get theirs here too). The bundle to go on with:
    read again when the template changed, since it is the provider's own setting."""
    bundle.backend_config.fill_default_images(bundle.backend_settings, config)
    types = config.get("available_node_types")
    if not isinstance(types, dict) or not shape_open(bundle.core, types, str(config.get("head_node_type", ""))):
        return bundle
    key = bundle.core.open.key("node_config")       # provider.open.node_config or provider.open_node_config
    if key == "provider.open.node_config" and not isinstance(config["provider"].get("open"), dict):
        key = f"provider.{flat_key('open', 'node_config')}"    # no `open:` mapping to put it in: the flat key
    probe = {"available_node_types": {OPEN_TEMPLATE: {"node_config": dict(bundle.core.open.node_config)}}}
    try:
        bundle.backend_config.fill_default_images(bundle.backend_settings, probe)
    except ConfigError as e:      # named under the template's key, not the stand-in node type's
        raise ConfigError(f"{key}.ImageId", str(e)[len(e.key) + 2:]) from None
    block: Any = config
    *path, last = key.split(".")
    for part in path:
        block = block.setdefault(part, {})
    block[last] = probe["available_node_types"][OPEN_TEMPLATE]["node_config"]
    return load_provider(config["provider"])


def fillout_available_node_types_resources(cluster_config: dict[str, Any]) -> dict[str, Any]:
    """Fill in node types' resources from the one instance type each is pinned to, as Ray's own providers do.

    A node type is pinned when every offering its plan can launch is of one instance type (an `InstanceType` /
    `machineType`, or an `instance_types` allow-list of one). Ray's AWS rule (`AWSNodeProvider.
    fillout_available_node_types_resources`): CPU, GPU / neuron_cores and `accelerator_type:<name>`, memory for
    worker types only, then the declared resources on top (core/node_resources.py; the catalog cloud's part of the
    rule is its backend config's `fill_rule`). Ray's GCP provider fills
    nothing for VM node types, so on GCP a pinned node type that declares CPU or GPU is left as Ray leaves it; one
    that declares neither gets the AWS rule (otherwise the autoscaler could never scale it for demand).
    A node type that is not pinned is never filled: the instance it gets depends on its shape, so a shape cannot
    be invented from it (Ray's AWS provider needs an InstanceType too). Launch keys (ImageId, ...) are not checked
    here: `bootstrap_config` does that after Ray has called this.
    """
    from ray_nodeless.core.cluster_plan import plan_cluster
    from ray_nodeless.core.node_resources import ray_filled_resources
    from ray_nodeless.operate.config import catalog_for

    config = copy.deepcopy(cluster_config)
    types = config.get("available_node_types") or {}
    if not types or in_teardown():
        return config      # `ray down` needs no resources: it must not need the catalog either
    bundle = load_provider(config.get("provider"))
    settings = bundle.core
    cp = plan_cluster(config, backend_overrides=bundle.requirement_overrides, catalog=catalog_for(settings),
                      settings=settings)
    for name, plan in cp.plans.items():
        declared = dict(types[name].get("resources") or {})
        pinned: dict[str, Any] = {}
        for o in plan.candidates():
            pinned[o.instance_type.name] = o.instance_type
            if len(pinned) > 1:
                break
        if len(pinned) != 1:
            if not {"CPU", "GPU"} & set(declared):
                logger.warning("%s: resources state no CPU or GPU and the node type is not pinned to one instance "
                               "type; Ray's autoscaler can then start it only for min_workers (state its "
                               "resources, or pin an instance type)", name)
            continue
        [t] = pinned.values()
        rule = backend_config(t.cloud).fill_rule()       # the catalog cloud's part of Ray's rule
        if rule.keeps(declared):
            continue
        filled = ray_filled_resources(t, declared, is_head=name == cp.head_node_type, rule=rule)
        if filled != declared:
            logger.info("%s: resources %s filled from %s: %s", name, declared, t.name, filled)
            types[name]["resources"] = filled
    return config
