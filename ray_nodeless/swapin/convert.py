"""`ray-nodeless convert`: an existing Ray cluster YAML for `type: aws` / `type: gcp` becomes a ray_nodeless one.

What it does, in order:
1. Ray's own defaults for the cloud are merged exactly as `ray up` merges them (`ray_defaults.merge_ray_defaults`),
   and Ray's own checks must accept the YAML as it is (`prepare_config` + `validate_config`).
2. The provider block is swapped: `type: external`, `module: ray_nodeless.NodelessProvider`, `cloud: aws|gcp`;
   every other key is kept (region, availability_zone, project_id, aws_credentials, gcp_credentials,
   use_internal_ips, ...), except what ray_nodeless cannot honour: `cache_stopped_nodes: true` is dropped with a
   note, and a null `project_id` (without `--project-id`) stops the conversion with an error naming the key.
3. Node types keep their launch keys. Two of Ray's bootstrap-time fill-ins are written out: an AWS node type
   without ImageId (or with `latest_dlami`) gets Ray's default AMI of the region; a GCP `scheduling` in Ray's list
   form becomes one mapping. A pinned type is kept (`InstanceType` / `machineType` + `guestAccelerators`: the
   backend maps it to an allow-list of one), or with `free_instance_types` replaced by the shape it implies: the
   resources Ray's AWS provider would fill in for it, plus `min_memory_gib` (its memory), `min_vcpus` (when the
   resources state fewer CPUs) and `gpus: [model]`, so the planner may pick a cheaper fit of the same shape.
4. The result must pass Ray's own checks and ray_nodeless's (`operate.config.check_cluster`, the path of `ray up`'s
   bootstrap and `ray-nodeless plan`); a pinned type the catalog cannot price or launch is an error naming the key.
5. Per node type: what Ray's own provider would launch (`before`: the pinned type, its capacity and catalog price)
   and what ray_nodeless will launch (`after`: the plan), and the idle / ceiling cost of both.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import yaml

from ray_nodeless.core.yaml_bounds import YamlBoundsError, load_bounded
from ray_nodeless.core import catalog as catalog_mod
from ray_nodeless.core.cluster_plan import ClusterPlan
from ray_nodeless.core.cost import NodeTypeCost, cluster_cost
from ray_nodeless.core.node_resources import ray_filled_resources
from ray_nodeless.errors import ConfigError
from ray_nodeless.operate.config import catalog_for, check_cluster, load_provider
from ray_nodeless.providers import backend_config
from ray_nodeless.providers.swapin import SwapIn
from ray_nodeless.swapin import keymap, ray_defaults, yaml_text

MODULE = "ray_nodeless.NodelessProvider"
NODE_TYPES = "available_node_types"

@dataclass(frozen=True)
class Side:
    """One node type's instance before (under Ray's own provider) or after (under ray_nodeless)."""

    instance_type: str | None
    capacity: str | None
    hourly_price: float | None

    def to_dict(self) -> dict[str, Any]:
        return {"instance_type": self.instance_type, "capacity": self.capacity, "hourly_price": self.hourly_price}


@dataclass(frozen=True)
class NodeTypeChange:
    name: str
    is_head: bool
    min_workers: int
    max_workers: int
    before: Side
    after: Side
    freed: bool


@dataclass
class Conversion:
    source: str
    cloud: str
    region: str
    ray_version: str
    config: dict[str, Any]                      # the converted cluster YAML
    text: str                                   # ... as written
    comments_kept: bool
    node_types: dict[str, NodeTypeChange]
    summary: dict[str, float | None]
    plan: ClusterPlan
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The `--json` document: exactly `node_types` and `summary`."""
        return {"node_types": {n: {"before": c.before.to_dict(), "after": c.after.to_dict()}
                               for n, c in self.node_types.items()},
                "summary": dict(self.summary)}


class _Notes:
    """Notes for the user: one list for the report, and the same text as comments at the key in the YAML."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.at: dict[tuple[str, ...], list[str]] = {}

    def add(self, path: tuple[str, ...], text: str) -> None:
        self.lines.append(f"{'.'.join(path)}: {text}")
        self.at.setdefault(path, []).append(f"{path[-1]}: {text}")


def convert_file(path: str | Path, **kw: Any) -> Conversion:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(str(p), f"cannot read cluster YAML: {e}") from e
    except UnicodeDecodeError as e:
        raise ConfigError(str(p), f"not a text file (cluster YAMLs are UTF-8): {e}") from e
    try:
        doc = load_bounded(text)
    except yaml.YAMLError as e:
        raise ConfigError(str(p), f"not valid YAML: {e}") from e
    except YamlBoundsError as e:
        raise ConfigError(str(p), f"refused before reading it: {e}") from e
    if not isinstance(doc, dict):
        raise ConfigError(str(p), "a cluster YAML must be a mapping")
    return convert(doc, source_text=text, source_name=p.name, **kw)


def convert(ray_config: Mapping[str, Any], *, source_text: str | None = None, source_name: str = "<yaml>",
            free_instance_types: bool = False, project_id: str | None = None,
            catalog: catalog_mod.Catalog | None = None) -> Conversion:
    """Convert a Ray cluster YAML (as loaded) for `type: aws` / `type: gcp`. Raises ConfigError naming the key."""
    provider = ray_config.get("provider")
    if not isinstance(provider, Mapping):
        raise ConfigError("provider", "a Ray cluster YAML needs a provider block")
    cloud = provider.get("type")
    if cloud == "external":
        raise ConfigError("provider.type", "external: this YAML already names a provider module; convert reads "
                                           "Ray YAMLs for " + " or ".join(f"`type: {c}`" for c in keymap.convertible()))
    swap = keymap.strategy(cloud)        # the backend named after Ray's provider type: its SwapIn
    cloud = str(cloud)                   # a convertible type's name (strategy refused anything else)
    notes = _Notes()
    merged = ray_defaults.merge_ray_defaults(ray_config)
    if swap.ray_fills_resources:
        # Ray's own provider fills in `resources` before Ray's schema (which requires the key) sees the YAML;
        # ray_nodeless fills a pinned type's the same way at `ray up`.
        for name, nt in (merged.get(NODE_TYPES) or {}).items():
            if isinstance(nt, dict) and "resources" not in nt:
                nt["resources"] = {}
                notes.add((NODE_TYPES, name, "resources"), "{} written out: filled from the pinned instance type "
                                                           f"at `ray up`, as Ray's {cloud} provider fills it")
    ray_defaults.ray_checks(merged)                  # Ray itself must accept the YAML as it is
    for legacy in ("head_node", "worker_nodes"):
        if legacy in ray_config and legacy not in merged:
            notes.add((legacy,), "dropped, as Ray's own config preparation drops an empty legacy field")

    new_provider = _swap_provider(cloud, swap, merged["provider"], project_id, notes)
    converted = _ordered(ray_config, merged)
    converted["provider"] = new_provider
    _install_plugin(converted, notes)
    core = load_provider(new_provider).core
    region = core.region
    catalog = catalog or catalog_for(core)
    head: str = converted["head_node_type"]      # required by Ray's schema (ray_checks above)
    node_types = converted[NODE_TYPES]
    before: dict[str, keymap.RayLaunch] = {}
    freed: set[str] = set()
    for name, nt in node_types.items():
        key = f"{NODE_TYPES}.{name}.node_config"
        nc = nt.setdefault("node_config", {})
        for path, text in swap.settle_node_config(new_provider, nc, key):     # Ray's bootstrap-time fill-ins
            notes.add((NODE_TYPES, name, *path), text)
        before[name] = keymap.ray_launch(cloud, new_provider, nc)
        if before[name].instance_type is None:
            notes.add((NODE_TYPES, name, "node_config"),
                      f"pins no instance type: Ray's own provider would have none to launch ({swap.unpinned_launch}); "
                      "ray_nodeless plans it from its resources")
            continue
        if free_instance_types and _free(cloud, swap, name, nt, head, catalog, region, notes):
            freed.add(name)
        else:
            _check_pinned_offered(cloud, swap, name, nc, before[name], catalog, region, free_instance_types)

    # What `ray up` would then do with it: Ray's preparation, our fill-in, Ray's schema, our bootstrap checks.
    from ray_nodeless.ray_adapter.bootstrap import fillout_available_node_types_resources

    prepared = ray_defaults.ray_checks(converted)
    ray_defaults.ray_checks(fillout_available_node_types_resources(prepared))
    cp = check_cluster(prepared, catalog=catalog)

    changes: dict[str, NodeTypeChange] = {}
    for name in sorted(node_types):
        nt = prepared[NODE_TYPES][name]
        b = before[name]
        o = keymap.cheapest_offering(catalog, cloud, region, b)
        chosen = cp.plans[name].chosen
        changes[name] = NodeTypeChange(
            name=name, is_head=name == head, min_workers=0 if name == head else int(nt.get("min_workers", 0)),
            max_workers=0 if name == head else int(nt.get("max_workers", converted.get("max_workers", 0))),
            before=Side(b.instance_type, b.capacity if b.instance_type else None,
                        o.hourly_price if o is not None else None),
            after=Side(chosen.instance_type.name, chosen.capacity, chosen.hourly_price),
            freed=name in freed)
    summary = _summary(changes, converted.get("max_workers"))

    header = [f"Converted from {source_name} (Ray `type: {cloud}`) by `ray-nodeless convert"
              f"{' --free-instance-types' if free_instance_types else ''}`: the provider block now names "
              f"ray_nodeless; every key Ray {ray_defaults.ray_version()} merges from its {cloud} defaults.yaml "
              f"for `type: {cloud}` is written out (`type: external` gets none of them). "
              "Preview what launches: `ray-nodeless plan <this file>`."]
    text, kept = yaml_text.render(converted, source_text, ray_defaults.defaults_text(swap.ray_type), notes.at,
                                  header)
    if not kept:
        notes.lines.append("comments: the YAML layout could not be copied; written without the file's comments")
    return Conversion(source=source_name, cloud=cloud, region=str(region), ray_version=ray_defaults.ray_version(),
                      config=converted, text=text, comments_kept=kept, node_types=changes, summary=summary,
                      plan=cp, notes=notes.lines)


# --------------------------------------------------------------------------------------------- provider block


def _swap_provider(cloud: str, swap: SwapIn, ray_provider: Mapping[str, Any], project_id: str | None,
                   notes: _Notes) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "external", "module": MODULE, "cloud": cloud}
    for k, v in ray_provider.items():
        if k == "type":
            continue
        if k == "cache_stopped_nodes" and v:
            notes.add(("provider", k), f"{v} dropped: ray_nodeless terminates instances on scale-down and never "
                                       "reuses stopped ones (a stopped instance would keep a type and zone "
                                       "outside the plan)")
            continue
        out[k] = v
    swap.complete_provider(out, project_id)
    return out


def _ordered(user: Mapping[str, Any], merged: Mapping[str, Any]) -> dict[str, Any]:
    """The merged config with the user's top-level keys first, in the user's order, then Ray's defaults."""
    out = {k: copy.deepcopy(merged[k]) for k in user if k in merged}
    out.update({k: copy.deepcopy(v) for k, v in merged.items() if k not in out})
    return out


def _install_plugin(config: dict[str, Any], notes: _Notes) -> None:
    """The head gets ray_nodeless from its wheel (file_mounts + head_setup_commands: operate/plugin_install.py)."""
    from ray_nodeless.operate.plugin_install import install_on_head

    for key, text in install_on_head(config, ray_defaults.ray_version()).items():
        notes.add((key,), text)


# --------------------------------------------------------------------------------------------- node types


def _free(cloud: str, swap: SwapIn, name: str, nt: dict[str, Any], head: str, catalog: catalog_mod.Catalog,
          region: str, notes: _Notes) -> bool:
    """Replace the node type's pinned instance type by the shape it implies. False when it stays pinned."""
    nc = nt["node_config"]
    key = f"{NODE_TYPES}.{name}.node_config"
    pin_key = swap.pin_key
    t = swap.pinned_type(nc, catalog, key)
    if t is None:
        raise ConfigError(f"{key}.{pin_key}", f"{nc[pin_key]!r} is not in the catalog's {cloud} instance types, nor "
                                              "among the retired types convert knows, so the shape it implies is "
                                              "unknown; replace it by the node type's resources (CPU, GPU, memory)")
    if t.accelerator:
        notes.add((NODE_TYPES, name, "node_config", pin_key),
                  f"kept: {t.name} carries {t.accelerator} accelerators, which the planner cannot choose by shape")
        return False
    off_catalog = swap.off_catalog_note(t, catalog)       # retired EC2 types, GCE custom machine types
    if off_catalog:
        notes.add((NODE_TYPES, name, "node_config", pin_key), off_catalog)
    model = t.gpu_model
    if t.gpu_count and not _gpu_offered(cloud, model, catalog, region):
        where = ("retired" if not any(x.gpu_model == model for x in catalog.types(cloud))
                 else "not offered")
        notes.add((NODE_TYPES, name, "node_config", pin_key),
                  f"{model} is {where} in {cloud} {region}: {t.gpu_count} GPU(s) of any model (models there: "
                  f"{', '.join(_gpu_models(cloud, catalog, region)) or 'none'}); add `accelerator_type:<MODEL>` "
                  "to the node type's resources, or `gpus` / `exclude_gpus` rules, to narrow")
        model = ""
    declared = dict(nt.get("resources") or {})
    is_head = name == head
    rule = backend_config(cloud).fill_rule()
    if rule.keeps(declared):
        resources = declared             # what Ray's own provider leaves them as (GCP)
    else:
        resources = ray_filled_resources(t, declared, is_head, rule=rule)
        if t.gpu_count and not model:
            # Ray's fill-in names the pinned model (`accelerator_type:K80`); no offering has it any more.
            for k in [k for k in resources if k.startswith("accelerator_type:") and k not in declared]:
                del resources[k]
    implied: dict[str, Any] = {"min_memory_gib": round(t.memory_gib, 4)}
    if float(resources.get("CPU", 0)) < t.vcpus:
        implied["min_vcpus"] = t.vcpus
    if t.gpu_count:
        if model:
            implied["gpus"] = [model]
        if not resources.get("GPU"):
            implied["allow_gpu_instances"] = True
    for k in swap.pin_keys:
        nc.pop(k, None)
    nc.update(implied)
    nt["resources"] = resources
    notes.add((NODE_TYPES, name, "node_config", pin_key),
              f"{t.name} freed (--free-instance-types): any type with at least its {_shape_text(t, model)} may be "
              "chosen")
    return True


def _shape_text(t: catalog_mod.InstanceType, model: str) -> str:
    gpu = (f", {t.gpu_count}x{model}" if model else f", {t.gpu_count} GPU(s) of any model") if t.gpu_count else ""
    return f"{t.vcpus:g} vCPU, {t.memory_gib:g} GiB{gpu}"


def _offered(catalog: catalog_mod.Catalog, cloud: str, region: str) -> set[catalog_mod.InstanceType]:
    rc = catalog.region(cloud, region)
    return {rc.types[int(i)] for i in set(rc.o_type.tolist())}


def _gpu_offered(cloud: str, model: str, catalog: catalog_mod.Catalog, region: str) -> bool:
    return any(t.gpu_model == model for t in _offered(catalog, cloud, region))


def _gpu_models(cloud: str, catalog: catalog_mod.Catalog, region: str) -> list[str]:
    return sorted({t.gpu_model for t in _offered(catalog, cloud, region) if t.gpu_model})


def _check_gpu_offered(cloud: str, model: str, catalog: catalog_mod.Catalog, region: str, key: str) -> None:
    if _gpu_offered(cloud, model, catalog, region):
        return
    here = _gpu_models(cloud, catalog, region)
    anywhere = any(t.gpu_model == model for t in catalog.types(cloud))
    why = (f"the catalog has no {model} machines in {cloud} {region}" if anywhere else
           f"the catalog has no {model} machines in {cloud} at all (a GPU the cloud no longer offers)")
    raise ConfigError(key, f"{why}; GPU models there: {', '.join(here) or 'none'}; `ray-nodeless convert "
                           "--free-instance-types` keeps the GPU count and lets the planner choose the model")


def _check_pinned_offered(cloud: str, swap: SwapIn, name: str, nc: Mapping[str, Any], launch: keymap.RayLaunch,
                          catalog: catalog_mod.Catalog, region: str, free: bool) -> None:
    """A kept pin must be a type the catalog prices in the region, zones and capacity: else an error naming the
    key (what the planner would otherwise report as 'no offering')."""
    key = f"{NODE_TYPES}.{name}.node_config"
    attached = swap.check_pinned(nc, catalog, key)      # GPUs attached apart from the type (GCE guestAccelerators)
    if attached is not None:
        _check_gpu_offered(cloud, attached[0], catalog, region, attached[1])
    pin_key = swap.pin_key
    t = catalog.instance_type(cloud, launch.instance_type or "")
    if t is None:
        raise ConfigError(f"{key}.{pin_key}",
                          f"{launch.instance_type!r} is not in the catalog's {cloud} instance types (retired, or "
                          "unknown), so ray_nodeless can neither price nor launch it; pin a current type "
                          f"(`ray-nodeless catalog list --cloud {cloud} --region {region}`) or replace it by the "
                          "node type's resources (CPU, GPU, memory) and let the planner choose"
                          + (f" (`ray-nodeless convert --free-instance-types` writes that: it knows "
                             f"{launch.instance_type}'s shape)"
                             if swap.off_catalog_shape(launch.instance_type or "") is not None else ""))
    if keymap.cheapest_offering(catalog, cloud, region, launch) is None:
        where = f"{cloud} {region}" + (f" zones {list(launch.zones)}" if launch.zones else "")
        hint = " (--free-instance-types lets the planner pick an equivalent type)" if not free else ""
        raise ConfigError(f"{key}.{pin_key}", f"{launch.instance_type} is not offered with a known price as "
                                              f"{launch.capacity} in {where}{hint}")


# --------------------------------------------------------------------------------------------- cost


def _summary(changes: Mapping[str, NodeTypeChange], global_max: int | None) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for side in ("before", "after"):
        items = []
        idle_known = ceiling_known = True
        for c in changes.values():
            price = getattr(c, side).hourly_price
            if price is None:
                idle_known &= not (c.is_head or c.min_workers > 0)
                ceiling_known &= not (c.is_head or c.max_workers > 0)
            items.append(NodeTypeCost(c.name, c.is_head, price or 0.0, c.min_workers, c.max_workers))
        cost = cluster_cost(items, global_max)
        out[f"idle_cost_per_hour_{side}"] = round(cost.idle_cost_per_hour, 6) if idle_known else None
        out[f"ceiling_cost_per_hour_{side}"] = round(cost.ceiling_cost_per_hour, 6) if ceiling_known else None
    return {k: out[k] for k in ("idle_cost_per_hour_before", "idle_cost_per_hour_after",
                                "ceiling_cost_per_hour_before", "ceiling_cost_per_hour_after")}
