"""The configurations a trace is replayed under: a cluster YAML (planned by the provider's own planner) or a fixed
baseline (`fixed:3xg4dn.4xlarge`), each with the trace schedule it replays.
"""
from __future__ import annotations

import copy
import logging
import re
from pathlib import Path
from typing import Any, Iterable

from ray_nodeless.core.catalog import Catalog
from ray_nodeless.core.cluster_plan import load_catalog, load_cluster_yaml, plan_cluster, planner_for
from ray_nodeless.core.idle import SOURCE_NODE_TYPE, capped_break_even_s
from ray_nodeless.core.prices import priced
from ray_nodeless.core.requirements import GIB
from ray_nodeless.errors import ConfigError
from ray_nodeless.launch.open_types import is_open_type, shape_open
from ray_nodeless.operate.config import load_provider
from ray_nodeless.simulate.model import TICK_MS, Offer, SimConfig
from ray_nodeless.simulate.open import OpenCluster
from ray_nodeless.trace.model import Trace

logger = logging.getLogger(__name__)

# `--capacity` -> which variants of each cluster config to replay (True: every capacity forced to on-demand).
CAPACITY_VARIANTS: dict[str, tuple[bool, ...]] = {
    "as-configured": (False,),
    "on-demand": (True,),
    "both": (True, False),
}


def force_on_demand(cfg: dict[str, Any]) -> dict[str, Any]:
    """Every rule and node_config that names a capacity gets `[on-demand]` (the default for the rest)."""
    cfg = copy.deepcopy(cfg)
    prov = cfg.get("provider") or {}
    for rule in prov.get("rules") or []:
        if isinstance(rule, dict) and "capacity" in rule:
            rule["capacity"] = ["on-demand"]
    for nt in (cfg.get("available_node_types") or {}).values():
        if isinstance(nt, dict) and isinstance(nt.get("node_config"), dict) and "capacity" in nt["node_config"]:
            nt["node_config"]["capacity"] = ["on-demand"]
    return cfg


# `--idle-release` -> how idle workers are released: each node type's timeout as the cluster plan decides it (what
# Ray v2 does with the per-type idle_timeout_s bootstrap_config writes) and, where `provider.idle.learn_gaps` is on
# (the default), the monitor's release at once of types whose gaps have been longer than a launch; the same
# without that learning ("break-even"); or Ray v1's one idle_timeout_minutes.
IDLE_RELEASE = ("as-configured", "cluster-wide", "break-even")

# `--reversion` -> replay each spot config with provider.reversion as configured (True), off (False), or both.
REVERSION_VARIANTS: dict[str, tuple[bool, ...]] = {"as-configured": (True,), "off": (False,), "both": (True, False)}


_UPDATE_INTERVAL = re.compile(r"(?:^|\s)AUTOSCALER_UPDATE_INTERVAL_S=([0-9]*\.?[0-9]+)(?=\s|$)")


def autoscaler_tick_ms(cluster: dict[str, Any]) -> int:
    """The autoscaler's loop period the cluster runs with: Ray's monitor reads AUTOSCALER_UPDATE_INTERVAL_S from its
    environment, which is the head's `ray start` environment; a config sets it in head_start_ray_commands (the local
    configs use 1 s). Otherwise Ray's default, 5 s."""
    for cmd in cluster.get("head_start_ray_commands") or []:
        m = _UPDATE_INTERVAL.search(str(cmd))
        if m and float(m.group(1)) > 0:
            return max(1, int(round(float(m.group(1)) * 1000)))
    return TICK_MS


def _ms(seconds: float | None) -> int:
    return -1 if seconds is None else int(round(seconds * 1000))


def _offer(o: Any) -> Offer:
    return Offer(instance_type=o.instance_type.name, capacity=o.capacity, zone=o.zone,
                 hourly_price=float(o.hourly_price or 0.0))


def config_from_cluster(path: str, schedule: str, on_demand: bool, catalog: Catalog | None = None,
                        idle_release: str = "as-configured", reversion: bool = True) -> SimConfig:
    """`reversion=False` replays the config with `provider.reversion` off (as-configured otherwise)."""
    raw = load_cluster_yaml(path)
    cfg = force_on_demand(raw) if on_demand else raw
    # The provider block read by the operate layer's loader, as `ray up` reads it: the backend registry says which
    # catalog cloud prices it (a gcp block is priced from the gcp catalog) and what its node_config keys imply.
    bundle = load_provider(cfg.get("provider"))
    cp = plan_cluster(cfg, backend_overrides=bundle.requirement_overrides, catalog=catalog, settings=bundle.core)
    node_types: dict[str, dict[str, Any]] = {}
    offers: dict[str, Offer] = {}
    candidates: dict[str, tuple[Offer, ...]] = {}
    for name, nt in cp.node_types.items():
        is_head = name == cp.head_node_type
        res = {k: float(v) for k, v in (nt.get("resources") or {}).items()}
        node_types[name] = {"resources": res,
                            "min_workers": 0 if is_head else int(nt.get("min_workers", 0)),
                            "max_workers": 0 if is_head else int(nt.get("max_workers", cp.global_max_workers))}
        o = cp.plans[name].chosen
        offers[name] = _offer(o)
        if not is_head:
            candidates[name] = tuple(_offer(c) for c in cp.plans[name].candidates())
    open_cluster = None
    if shape_open(cp.settings, cfg.get("available_node_types") or {}, cp.head_node_type):
        # Generated types a config file kept (a copy of a running head's) are the monitor's to make again.
        declared = {n: t["resources"] for n, t in node_types.items()
                    if n != cp.head_node_type and not is_open_type(cp.node_types[n])}
        for n in [n for n in node_types if is_open_type(cp.node_types[n])]:
            del node_types[n], offers[n]
            candidates.pop(n, None)
        planner = planner_for(priced(catalog or load_catalog(cp.settings.catalog), cp.settings.price_overrides))
        open_cluster = OpenCluster.build(cp.settings, planner, declared, bundle.requirement_overrides)
    idle_min = raw.get("idle_timeout_minutes")
    if idle_min is None:
        # Under v2 a missing idle_timeout_minutes means never; v1 would KeyError. Say so rather than guess.
        logger.warning("%s has no idle_timeout_minutes: idle workers without a per-type idle_timeout_s are never "
                       "terminated in the replay", path)
        idle_ms = -1
    else:
        idle_ms = int(round(float(idle_min) * 60_000))
    by_type: dict[str, int] = {}
    open_idle = None
    learning = None
    learn_types: set[str] = set()
    if idle_release in ("as-configured", "break-even"):
        by_type = {name: _ms(idle.seconds) for name, idle in cp.idle.items() if name in node_types}
        s = cp.settings
        if idle_release == "as-configured" and s.cost_aware_idle and s.idle.learn_gaps:
            # As the monitor's idle lane (launch/idle_release.py): the types whose timeout is the plan's.
            learning = (s.expected_launch_s, s.idle.learn_window, s.idle.learn_min_gap_s)
            learn_types = {name for name, idle in cp.idle.items()
                           if name in node_types and idle.source != SOURCE_NODE_TYPE}
        if s.cost_aware_idle:
            # As launch/open_types.py: a generated type gets the break-even of its one offering.
            def open_idle(price: float | None) -> int:
                be = capped_break_even_s(price, s.expected_launch_s, s.relaunch_overhead_usd,
                                         None if idle_ms < 0 else idle_ms / 1000)
                return idle_ms if be is None else _ms(round(be, 3))
    label = Path(path).stem + (":on-demand" if on_demand else "") + {
        "cluster-wide": ":cluster-idle", "break-even": ":break-even"}.get(idle_release, "") + (
        "" if reversion else ":no-reversion")
    return SimConfig(label=label, kind="autoscaled", schedule=schedule, head_node_type=cp.head_node_type,
                     node_types=node_types, offers=offers, max_workers=cp.global_max_workers,
                     upscaling_speed=float(raw.get("upscaling_speed", 1.0)), idle_timeout_ms=idle_ms,
                     idle_cost_per_hour=cp.cost.idle_cost_per_hour, source=str(path), open=open_cluster,
                     idle_timeout_ms_by_type=by_type, open_idle_ms=open_idle,
                     idle_learning=learning, learn_types=learn_types, tick_ms=autoscaler_tick_ms(raw),
                     candidates=candidates, unavailable_ttl_ms=_ms(cp.settings.unavailable_ttl_s),
                     unavailable_cap_ms=_ms(cp.settings.unavailable_backoff_cap_s),
                     unavailable_probes=cp.settings.unavailable_probes,
                     reversion=cp.settings.reversion if reversion else None,
                     max_hourly_cost=cp.settings.max_hourly_cost)


_FIXED = re.compile(r"^fixed:(\d+)x([A-Za-z0-9.\-_+]+?)(?:@([a-z0-9\-]+))?$")


def config_from_fixed(spec: str, schedule: str, catalog: Catalog, cloud: str = "aws",
                      default_region: str = "us-west-2") -> SimConfig:
    """`fixed:3xg4dn.4xlarge[@region]`: N nodes always on, the first is the head, all run tasks; on-demand price."""
    m = _FIXED.match(spec)
    if not m:
        raise ConfigError("--baseline", f"{spec!r} is not fixed:<N>x<instance type>[@region]")
    n, itype, region = int(m.group(1)), m.group(2), m.group(3) or default_region
    if n < 1:
        raise ConfigError("--baseline", "needs at least one node")
    rc = catalog.region(cloud, region)
    prices = sorted((o.hourly_price, o.zone) for o in rc.offerings()
                    if o.instance_type.name == itype and o.capacity == "on-demand" and o.hourly_price is not None)
    if not prices:
        raise ConfigError("--baseline", f"{itype} has no on-demand price in {cloud} {region} "
                                        f"(catalog {catalog.catalog_id})")
    price, zone = prices[0]
    t = catalog.instance_type(cloud, itype)
    assert t is not None
    res = {"CPU": float(t.vcpus), "memory": float(t.memory_gib * GIB)}
    if t.gpu_count:
        res["GPU"] = float(t.gpu_count)
    return SimConfig(label=spec, kind="fixed", schedule=schedule, head_node_type="fixed",
                     node_types={"fixed": {"resources": res, "min_workers": 0, "max_workers": 0}},
                     offers={"fixed": Offer(itype, "on-demand", zone, float(price))}, max_workers=0,
                     upscaling_speed=1.0, idle_timeout_ms=-1, idle_cost_per_hour=n * float(price), fixed_count=n,
                     source=spec)


def _split_schedule(spec: str) -> tuple[str, str | None]:
    if "#" in spec:
        a, b = spec.rsplit("#", 1)
        return a, b
    return spec, None


def build_configs(trace: Trace, configs: Iterable[str], baselines: Iterable[str], capacity: str,
                  schedule: str | None, catalog: Catalog,
                  idle_release: Iterable[str] = ("as-configured",),
                  reversion: Iterable[bool] = (True,)) -> list[SimConfig]:
    out: list[SimConfig] = []
    reversion = tuple(reversion)
    for spec in baselines:
        s, sched = _split_schedule(spec)
        out.append(config_from_fixed(s, sched or trace.baseline_schedule, catalog))
    for spec in configs:
        path, sched = _split_schedule(spec)
        sched = sched or schedule or trace.default_schedule
        for od in CAPACITY_VARIANTS[capacity]:
            for idle in idle_release:
                for rev in reversion:
                    if od and not rev and True in reversion:
                        continue    # all on demand: no fallback to revert, the same replay twice
                    out.append(config_from_cluster(path, sched, od, catalog=catalog, idle_release=idle,
                                                   reversion=rev))
    labels = [c.label for c in out]
    for c in out:
        if labels.count(c.label) > 1:
            c.label = f"{c.label}#{c.schedule}"
    return out
