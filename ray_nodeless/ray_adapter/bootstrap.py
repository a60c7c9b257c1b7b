"""What `ray up` asks of the provider class before any machine exists: validate and plan the cluster YAML
(`bootstrap_config`), and fill in node types' resources from the instance they would get."""
from __future__ import annotations

import copy
import logging
from typing import Any

from ray_nodeless.core.node_resources import instance_resources
from ray_nodeless.core.cluster_plan import ClusterPlan
from ray_nodeless.errors import CatalogError, ConfigError, NoFeasibleOffering
from ray_nodeless.launch.config import check_cluster, check_node_types, load_provider
from ray_nodeless.ray_adapter.compat import in_teardown
from ray_nodeless.registrations.vm_boot import BOOT_KEY

logger = logging.getLogger(__name__)

NODE_TYPE_RESOURCES_KEY = "node_type_resources"   # read by the provider objects Ray builds later


def bootstrap_config(cluster_config: dict[str, Any]) -> dict[str, Any]:
    """Validate every key and plan every node type, so a bad key or an infeasible shape fails `ray up` before
    anything launches; record what later provider objects need in the provider block."""
    config = copy.deepcopy(cluster_config)
    try:
        cp = check_cluster(config)
    except (NoFeasibleOffering, CatalogError) as e:
        if not in_teardown():
            raise
        # `ray down` ends every machine of the cluster whatever the rules say now: keys are still checked (the
        # backend must be built), the plan is not.
        logger.warning("ray down: not planning (%s); terminating the cluster's machines anyway", e)
        settings, cls = load_provider(config.get("provider"))
        check_node_types(config, config["provider"], cls)
    else:
        for name, p in cp.plans.items():
            o = p.chosen
            logger.info("%s: %s in %s (%s) at $%.4f/h by rule %r", name, o.instance_type.name, o.zone,
                        o.capacity, o.hourly_price or 0.0, p.request.rule)
    provider = config["provider"]
    # Workers that start Ray from their own boot script (registrations/vm.py) run these commands.
    provider[BOOT_KEY] = {"setup": list(config.get("setup_commands") or []) +
                          list(config.get("worker_setup_commands") or []),
                          "start": list(config.get("worker_start_ray_commands") or [])}
    # The head is created by `create_node`, which gets no resources: it is planned on the recorded shape.
    provider[NODE_TYPE_RESOURCES_KEY] = {
        name: dict(nt.get("resources") or {}) for name, nt in sorted(config["available_node_types"].items())}
    return config


def plan_like_ray_up(cluster_config: dict[str, Any]) -> ClusterPlan:
    """What `ray up` would launch, by the same path: Ray's own config preparation (defaults, setup-command merge,
    node type min/max workers), then our checks and plan. `ray-nodeless plan` uses this, so the preview and the
    launch cannot disagree, and a YAML `ray up` refuses is refused here too, naming the key."""
    from ray.autoscaler._private.util import prepare_config

    if not isinstance(cluster_config, dict):
        raise ConfigError("cluster", "a cluster YAML must be a mapping")
    check_cluster(cluster_config)    # our checks first: they name the key where Ray's preparation would crash
    try:
        prepared = prepare_config(copy.deepcopy(cluster_config))
    except KeyError as e:
        key = str(e.args[0]) if e.args else "?"
        raise ConfigError(key, "missing: `ray up` needs this top-level key for `type: external` providers (Ray "
                               "fills it only for its own clouds); `ray-nodeless convert` writes a complete YAML") from e
    except (ValueError, TypeError, AttributeError) as e:
        raise ConfigError("cluster", f"Ray's config preparation refused it: {e}") from e
    return check_cluster(prepared)


def fillout_available_node_types_resources(cluster_config: dict[str, Any]) -> dict[str, Any]:
    """Fill CPU/GPU/memory of node types that state only requirements, from the instance they would get."""
    config = copy.deepcopy(cluster_config)
    types = config.get("available_node_types") or {}
    missing = {n for n, t in types.items() if not {"CPU", "GPU"} & set((t or {}).get("resources") or {})}
    if not missing:
        return config
    cp = check_cluster(config)
    for name in sorted(missing):
        declared = types[name].get("resources") or {}
        filled = instance_resources(cp.plans[name].chosen.instance_type, declared)
        out = {k: int(v) for k, v in filled.items() if not k.startswith("accelerator_type:")}
        out.update(declared)
        types[name]["resources"] = out
    return config
