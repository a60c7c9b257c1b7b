"""Shape-open node types at run time (launch/open_types.py): what one monitor loop writes into the cluster config,
checked against Ray's own config loading and against the launch path that later gets those node types."""
from __future__ import annotations

import copy

import pytest
import yaml

from ray_nodeless.core.availability import UnavailableOfferings
from ray_nodeless.core.demand import Demand, canonical_resources, parse_demand
from ray_nodeless.core.open_pack import Packer
from ray_nodeless.core.open_plan import OpenFitter
from ray_nodeless.core.planner import Planner
from ray_nodeless.core.settings import Resolver
from ray_nodeless.launch.open_types import DROP_AFTER_S, OpenTypes, RayNode, Snapshot, is_open_type
from ray_nodeless.operate.config import catalog_for, load_provider
from ray_nodeless.providers.base import TAG_CLUSTER, Machine
from ray_nodeless.ray_compat.defaults import prepare_config, validate_config
from ray_nodeless.ray_adapter.open_driver import YamlFileStore, snapshot_of
from ray_nodeless.testing.clock import FakeClock
from tests import REPO_ROOT


class DictStore:
    def __init__(self, config):
        self.config = copy.deepcopy(config)
        self.writes = 0

    def read(self):
        return copy.deepcopy(self.config)

    def write(self, config):
        self.config = copy.deepcopy(config)
        self.writes += 1


def _config(**provider):
    cfg = yaml.safe_load((REPO_ROOT / "cluster-configs" / "local-nodeless.yaml").read_text())
    cfg["provider"].update(provider)
    return cfg


def _open_types(cfg, clock=None):
    bundle = load_provider(cfg["provider"])
    resolver = Resolver(bundle.core, bundle.requirement_overrides)
    planner = Planner(catalog_for(bundle.core))
    fitter = OpenFitter(resolver, planner, UnavailableOfferings(180), bundle.core.open_node_config)
    store = DictStore(cfg)
    return OpenTypes(bundle.core, Packer(fitter), store, clock or FakeClock()), store, resolver, planner


def _machine(mid, node_type, kind="worker"):
    return Machine(id=mid, tags={TAG_CLUSTER: "c", "ray-user-node-type": node_type, "ray-node-type": kind})


def test_one_loop_writes_pinned_labelled_node_types_with_quotas_ray_accepts():
    cfg = _config()
    ot, store, resolver, planner = _open_types(cfg)
    demands = [parse_demand('{"CPU": 16}'), parse_demand('{"GPU": 1}'),
               parse_demand('{"CPU": 1}', [{"ray.io/availability-zone": "us-west-2b"}])]
    result = ot.step(Snapshot(demands, []), {})
    assert result.written and store.writes == 1
    types = store.config["available_node_types"]
    generated = {n: t for n, t in types.items() if is_open_type(t)}
    assert sorted(generated) == sorted(result.packing.new)
    assert types["head"] == cfg["available_node_types"]["head"]
    # Ray's own loading (prepare_config + validate_config, what its config readers run every loop) accepts it.
    validate_config(prepare_config(copy.deepcopy(store.config)))
    prices = {}
    for name, t in generated.items():
        assert t["max_workers"] == result.packing.new[name] and t["min_workers"] == 0
        assert set(t["labels"]) >= {"ray.io/market-type", "ray.io/availability-zone", "ray.io/availability-region"}
        # The launch path Ray will take for this node type plans exactly the offering the packing chose.
        plan = planner.plan(resolver.request(name, t["resources"], t["node_config"], is_head=False))
        o = result.packing.types[name].offering
        assert plan.chosen.key == o.key and len(plan) == 1
        prices[name] = o.hourly_price
    # Cheaper types get the higher priority (Ray breaks ties by it).
    ranked = sorted(generated, key=lambda n: -generated[n]["priority"])
    assert [prices[n] for n in ranked] == sorted(prices[n] for n in ranked)


def test_quota_is_live_machines_plus_planned_and_never_below_live():
    ot, store, *_ = _open_types(_config())
    d = parse_demand('{"GPU": 1}')
    first = ot.step(Snapshot([d], []), {})
    [name] = first.packing.new
    # The machine launched and has not joined Ray yet: the demand waits for it, nothing more is planned.
    second = ot.step(Snapshot([d], []), {"m1": _machine("m1", name)})
    assert second.quotas[name] == 1 and not second.packing.new
    # It joined and runs the work; the demand is gone: the quota stays at the live machine.
    node = RayNode("m1", name, {"GPU": 1.0, "CPU": 4.0}, {"CPU": 3.0}, {})
    third = ot.step(Snapshot([], [node]), {"m1": _machine("m1", name)})
    assert third.quotas[name] == 1
    assert store.config["available_node_types"][name]["max_workers"] == 1


def test_idle_generated_type_is_dropped_after_a_while():
    clock = FakeClock()
    ot, store, *_ = _open_types(_config(), clock)
    first = ot.step(Snapshot([parse_demand('{"CPU": 2}')], []), {})
    [name] = first.packing.new
    ot.step(Snapshot([], []), {})
    assert store.config["available_node_types"][name]["max_workers"] == 0
    clock.advance(DROP_AFTER_S + 1)
    ot.step(Snapshot([], []), {})
    assert name not in store.config["available_node_types"]


def test_declared_worker_type_that_fits_is_left_to_ray():
    cfg = _config(open_shapes=True)
    cfg["available_node_types"]["cpu4"] = {"resources": {"CPU": 4}, "node_config": {}, "min_workers": 0,
                                           "max_workers": 2}
    ot, store, *_ = _open_types(cfg)
    result = ot.step(Snapshot([parse_demand('{"CPU": 2}')], []), {})
    assert not result.packing.new and not result.written
    # A shape the declared type cannot hold gets its own machine.
    result = ot.step(Snapshot([parse_demand('{"CPU": 16}')], []), {})
    assert sum(result.packing.new.values()) == 1


def test_cluster_with_declared_workers_is_not_shape_open_by_default():
    cfg = _config()
    cfg["available_node_types"]["cpu4"] = {"resources": {"CPU": 4}, "node_config": {}}
    ot, store, *_ = _open_types(cfg)
    result = ot.step(Snapshot([parse_demand('{"CPU": 16}')], []), {})
    assert not result.written and store.writes == 0


def test_max_open_node_types_caps_the_menu():
    ot, store, *_ = _open_types(_config(max_open_node_types=1))
    ot.step(Snapshot([parse_demand('{"CPU": 16}'), parse_demand('{"GPU": 1}')], []), {})
    assert sum(1 for t in store.config["available_node_types"].values() if is_open_type(t)) == 1


def test_infeasible_demand_is_reported_once():
    ot, store, *_ = _open_types(_config())
    d = parse_demand('{"GPU": 1, "accelerator_type:K80": 0.001}')
    first = ot.step(Snapshot([d], []), {})
    assert len(first.reports) == 1 and "K80" in first.reports[0]
    assert ot.step(Snapshot([d], []), {}).reports == []


def test_yaml_store_round_trip(tmp_path):
    path = tmp_path / "ray_bootstrap_config.yaml"
    path.write_text(yaml.safe_dump(_config()))
    store = YamlFileStore(str(path))
    cfg = store.read()
    cfg["available_node_types"]["x"] = {"resources": {"CPU": 1}, "node_config": {}}
    store.write(cfg)
    assert yaml.safe_load(path.read_text())["available_node_types"]["x"]["resources"] == {"CPU": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["ray_bootstrap_config.yaml"]


def test_snapshot_from_rays_cluster_resource_state_proto():
    from ray.core.generated import autoscaler_pb2, common_pb2

    from ray_nodeless.ray_compat.demand import state_from_proto

    state = autoscaler_pb2.ClusterResourceState()
    n = state.node_states.add(instance_id="m1", ray_node_type_name="t", status=autoscaler_pb2.NodeStatus.RUNNING)
    n.total_resources["CPU"] = 4
    n.available_resources["CPU"] = 2
    n.labels["ray.io/market-type"] = "spot"
    state.node_states.add(instance_id="gone", status=autoscaler_pb2.NodeStatus.DEAD)
    r = state.pending_resource_requests.add(count=3)
    r.request.resources_bundle["CPU"] = 1
    c = r.request.label_selectors.add().label_constraints.add(
        label_key="ray.io/availability-zone", operator=common_pb2.LabelSelectorOperator.LABEL_OPERATOR_IN)
    c.label_values.append("us-west-2b")
    g = state.pending_gang_resource_requests.add(details="abc123:STRICT_SPREAD|PENDING")
    for _ in range(2):
        b = g.requests.add()
        b.resources_bundle["GPU"] = 1
        b.placement_constraints.add().anti_affinity.label_value = "abc123"
    snap = snapshot_of(state_from_proto(state))
    assert [x.instance_id for x in snap.nodes] == ["m1"] and snap.nodes[0].available == {"CPU": 2.0}
    single, *gang = snap.demands
    assert single.count == 3 and single.selectors[0].matches({"ray.io/availability-zone": "us-west-2b"})
    assert not single.selectors[0].matches({"ray.io/availability-zone": "us-west-2a"})
    assert [(d.gang, d.spread, d.res) for d in gang] == [("abc123", True, {"GPU": 1.0})] * 2


@pytest.mark.parametrize(("open_node_config", "key"), [
    ({"min_vcpus": -1}, "provider.open_node_config.min_vcpus"),
    ({"open_shape": {"CPU": 1}}, "provider.open_node_config.open_shape"),
    ({"gpus": ["K9000"]}, "provider.open_node_config.gpus"),
])
def test_bad_template_is_refused_at_plan_naming_the_key(open_node_config, key):
    from ray_nodeless.errors import ConfigError
    from ray_nodeless.operate.config import check_cluster

    cfg = _config(open_node_config=open_node_config)
    with pytest.raises(ConfigError) as e:
        check_cluster(cfg)
    assert key in str(e.value)


def test_aws_template_launch_keys_are_checked_by_the_backend():
    from ray_nodeless.errors import ConfigError
    from ray_nodeless.operate.config import check_cluster

    cfg = yaml.safe_load((REPO_ROOT / "cluster-configs" / "aws-nodeless.yaml").read_text())
    cfg["provider"]["open"]["node_config"]["InstanceType"] = 5
    with pytest.raises(ConfigError, match=r"provider\.open\.node_config\.InstanceType"):
        check_cluster(cfg)
    # The older flat key: its errors name it as written.
    cfg["provider"]["open_node_config"] = cfg["provider"].pop("open").pop("node_config")
    with pytest.raises(ConfigError, match=r"provider\.open_node_config\.InstanceType"):
        check_cluster(cfg)


def test_unserved_summary_is_short_and_names_the_reason():
    from ray_nodeless.providers.base import TAG_UNSERVED_MAX
    from ray_nodeless.ray_adapter.open_driver import unserved_summary

    ot, *_ = _open_types(_config())
    one = ot.step(Snapshot([parse_demand('{"GPU": 1, "accelerator_type:K80": 0.001}')], []), {})
    text = unserved_summary(one)
    assert "K80" in text and len(text) <= TAG_UNSERVED_MAX
    many = ot.step(Snapshot([parse_demand(f'{{"CPU": 1, "custom{i}": 1}}') for i in range(40)], []), {})
    assert len(unserved_summary(many)) <= TAG_UNSERVED_MAX
    assert unserved_summary(ot.step(Snapshot([], []), {})) == ""


def test_quota_never_falls_below_what_autoscaler_v2_has_requested():
    # Ray v2 stops instances over a type's max_workers, and its instance manager refuses to stop one still
    # REQUESTED: a quota below Ray's requests would wedge the autoscaler.
    ot, store, *_ = _open_types(_config())
    first = ot.step(Snapshot([parse_demand('{"GPU": 1}')], []), {})
    [name] = first.packing.new
    later = ot.step(Snapshot([], [], requested={name: 1}), {})
    assert later.quotas[name] == 1
    later = ot.step(Snapshot([], [], pending_instances=[(name, "i-not-listed-yet")]), {})
    assert later.quotas[name] == 1
    assert ot.step(Snapshot([], []), {}).quotas[name] == 0


def test_placement_group_task_resources_are_not_planned():
    state = {"requests": [{"resources": {"CPU_group_0_b47c8cd0398ccc9bebd24b42575b01000000": 1,
                                         "CPU_group_b47c8cd0398ccc9bebd24b42575b01000000": 1}, "selectors": [],
                           "count": 1},
                          {"resources": {"CPU": 2}, "selectors": [], "count": 1}],
             "requested": {"types": {"nl-x": 2}, "instances": [("nl-x", "i-1")]}}
    snap = snapshot_of(state)
    assert [d.res for d in snap.demands] == [{"CPU": 2.0}]
    assert snap.requested == {"nl-x": 2} and snap.pending_instances == [("nl-x", "i-1")]


def test_request_resources_bundles_count_whole_machines_busy_or_not():
    ot, store, *_ = _open_types(_config())
    bundles = [Demand(canonical_resources({"CPU": 4}), count=2)]
    first = ot.step(Snapshot([], [], constraints=bundles), {})
    assert sum(first.packing.new.values()) >= 1
    held = sum(dict(first.packing.types[n].resources)["CPU"] * c for n, c in first.packing.new.items())
    assert held >= 8
    # A busy node whose whole resources hold the bundles: nothing more to launch for them.
    busy = RayNode("i-1", "x", {"CPU": 8.0}, {"CPU": 0.0}, {})
    assert not ot.step(Snapshot([], [busy], constraints=bundles), {}).packing.new


def test_a_type_whose_offering_failed_loses_its_quota_to_the_next_offering():
    ot, store, *_ = _open_types(_config())
    d = parse_demand('{"GPU": 1, "accelerator_type:A100": 0.001}')
    first = ot.step(Snapshot([d], []), {})
    [name] = first.packing.new
    ot.packer.fitter.unavailable.mark(first.packing.types[name].offering, "InsufficientInstanceCapacity")
    # Ray has requested that type again (its retry): the quota goes to the next offering, not to Ray's retry.
    second = ot.step(Snapshot([d], [], requested={name: 1}), {})
    assert second.quotas[name] == 0
    [other] = second.packing.new
    assert other != name and second.quotas[other] == 1


def test_machines_planned_stay_within_the_clusters_max_workers():
    cfg = _config()
    cfg["max_workers"] = 2
    ot, store, *_ = _open_types(cfg)
    demands = [parse_demand('{"CPU": 16}'), parse_demand('{"GPU": 2}'), parse_demand('{"CPU": 1, "memory": "64GiB"}'),
               parse_demand('{"CPU": 1}', [{"ray.io/availability-zone": "us-west-2c"}])]
    result = ot.step(Snapshot(demands, []), {})
    assert sum(result.packing.new.values()) == 2
    live = {"m1": _machine("m1", "nl-x")}
    assert sum(ot.step(Snapshot(demands, []), live).packing.new.values()) == 1
