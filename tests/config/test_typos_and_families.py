"""Issue 31: a typo at every level is named with its did-you-mean from the schema, all missing keys in one error,
rules that never apply are warnings, and family names are checked against the cloud (every region, plus the
retired families of core/family_names.py), not the region. Issue 26: the provider block's nested groups."""
from __future__ import annotations

import copy
import logging

import pytest
import yaml

from ray_nodeless.core.settings import parse_provider
from ray_nodeless.errors import ConfigError, ConfigErrors
from ray_nodeless.operate.config import check_cluster, load_provider, prepare_like_ray_up
from tests import REPO_ROOT
from tests.config.corpus import base


def check(cfg: dict):
    return check_cluster(prepare_like_ray_up(copy.deepcopy(cfg)))


def _worker(c: dict) -> str:
    return next(n for n in sorted(c["available_node_types"]) if n != c["head_node_type"])


def _rename(where, old: str, new: str):
    def f(c: dict) -> None:
        d = where(c)
        d[new] = d.pop(old)
    return f


def _add(where, **kv):
    return lambda c: where(c).update(kv)


prov = lambda c: c["provider"]                                     # noqa: E731
rule0 = lambda c: c["provider"]["rules"][0]                         # noqa: E731
match0 = lambda c: c["provider"]["rules"][0].setdefault("match", {})   # noqa: E731
nc = lambda c: c["available_node_types"][_worker(c)].setdefault("node_config", {})   # noqa: E731

# (level, base, mutation, the key named, the suggestion)
TYPOS = [
    ("provider", "aws", _rename(prov, "region", "regoin"), "provider.regoin", "region"),
    ("provider", "gcp", _rename(prov, "project_id", "projectid"), "provider.projectid", "project_id"),
    ("provider", "local", _add(prov, unavailabel_ttl_s=5), "provider.unavailabel_ttl_s", "unavailable_ttl_s"),
    ("top-level", "aws", _rename(lambda c: c, "max_workers", "max_worker"), "max_worker", "max_workers"),
    ("top-level", "local", _rename(lambda c: c, "setup_commands", "setup_command"), "setup_command",
     "setup_commands"),
    ("rule", "aws", _rename(rule0, "match", "mach"), "provider.rules[0].mach", "match"),
    ("rule", "gcp", _add(rule0, familes=["n2"]), "provider.rules[0].familes", "families"),
    ("rule", "local", _add(rule0, capacty=["spot"]), "provider.rules[0].capacty", "capacity"),
    ("match", "aws", _add(match0, node_typ="gpu*"), "provider.rules[0].match.node_typ", "node_type"),
    ("match", "local", _add(match0, GPUS=">=1"), "provider.rules[0].match.GPUS", "GPU"),
    ("exclude", "aws", _add(prov, exclude={"familes": ["g3"]}), "provider.exclude.familes", "families"),
    ("node_config", "aws", _add(nc, InstanceTyp="g4dn.xlarge"), "node_config.InstanceTyp", "InstanceType"),
    ("node_config", "aws", _add(nc, min_memory=16), "node_config.min_memory", "min_memory_gib"),
    ("node_config", "gcp", _add(nc, machineTyp="n1-standard-4"), "node_config.machineTyp", "machineType"),
    ("node_config", "gcp", _add(nc, min_vcpu=4), "node_config.min_vcpu", "min_vcpus"),
    ("node_config", "local", _add(nc, min_memory=16), "node_config.min_memory", "min_memory_gib"),
    ("group", "local", _add(prov, idle={"expected_lanch_s": 60}), "provider.idle.expected_lanch_s",
     "expected_launch_s"),
    ("group", "local", _add(prov, open={"max_node_type": 4}), "provider.open.max_node_type", "max_node_types"),
    ("group", "local", _add(prov, reversion={"max_inflight": 2}), "provider.reversion.max_inflight",
     "max_in_flight"),
    ("price_overrides", "aws", _add(prov, price_overrides=[{"familes": ["g5"], "discount": 0.1}]),
     "provider.price_overrides[0].familes", "families"),
]


@pytest.mark.parametrize("level,b,mutate,key,close", TYPOS, ids=[f"{t[0]}-{t[1]}-{t[3]}" for t in TYPOS])
def test_a_typo_is_named_with_its_suggestion(level, b, mutate, key, close):
    cfg = base(b)
    mutate(cfg)
    with pytest.raises(ConfigError) as e:
        check(cfg)
    typo = key.rsplit(".", 1)[-1]
    assert key in str(e.value) and f"unknown key {typo!r}" in str(e.value) \
        and f"did you mean {close!r}?" in str(e.value), str(e.value)


def test_the_list_of_rule_keys_names_match_and_name():
    cfg = base("aws")
    cfg["provider"]["rules"][0]["frobnicate"] = 1
    with pytest.raises(ConfigError) as e:
        check(cfg)
    assert "known keys:" in str(e.value) and "match" in str(e.value).split("known keys:")[1] \
        and "name" in str(e.value).split("known keys:")[1]


def test_the_headline_yaml_names_every_missing_key_in_one_error():
    """The docs' headline YAML (docs/index.md: a provider block and node types only), as a user copies it."""
    text = (REPO_ROOT / "docs" / "index.md").read_text()
    cfg = yaml.safe_load(text.split("```yaml\n", 1)[1].split("```", 1)[0])
    cfg["provider"]["regoin"] = cfg["provider"].pop("region")
    with pytest.raises(ConfigErrors) as e:
        prepare_like_ray_up(cfg)
    keys = [x.key for x in e.value.errors]
    assert keys[:4] == ["setup_commands", "head_setup_commands", "worker_setup_commands", "max_workers"]
    assert {"head_node_type", "provider.regoin", "provider.region"} <= set(keys)
    assert "unknown key 'regoin'; did you mean 'region'?" in str(e.value)


def test_every_missing_provider_key_in_one_error():
    cfg = base("gcp")
    for k in ("region", "project_id"):
        cfg["provider"].pop(k)
    with pytest.raises(ConfigErrors) as e:
        load_provider(cfg["provider"])
    assert [x.key for x in e.value.errors] == ["provider.region", "provider.project_id"]


def test_a_rule_after_a_catch_all_or_deciding_nothing_is_a_warning(caplog):
    cfg = base("aws")
    cfg["provider"]["rules"].append({"name": "late", "match": {"GPU": ">=1"}, "capacity": ["spot"]})
    cfg["provider"]["rules"].insert(0, {"name": "nothing", "match": {"node_type": "gpu-wrker*"}})
    with caplog.at_level(logging.WARNING):
        cp = check(cfg)
    assert any("provider.rules[0] ('nothing') matches no node type" in w for w in cp.warnings)
    assert any(w.startswith("provider.rules[4] ('late') stands after the catch-all provider.rules[3]")
               for w in cp.warnings)
    assert all(w in caplog.text for w in cp.warnings)
    assert check(base("aws")).warnings == []        # a trailing catch-all that decides nothing today is no warning


def test_on_a_shape_open_cluster_a_worker_rule_may_decide_demands():
    cfg = yaml.safe_load((REPO_ROOT / "cluster-configs" / "local-nodeless.yaml").read_text())
    assert check(cfg).warnings == []
    cfg["provider"]["rules"].insert(0, {"name": "gpu-glob", "match": {"node_type": "gpu-*"}})
    [w] = check(cfg).warnings
    assert w.startswith("provider.rules[0] ('gpu-glob') matches no node type") and "and no demand" in w


# Exclusion lists as users write them (Ray's AWS examples, SkyPilot and Karpenter users' YAMLs).
AWS_EXCLUSIONS = [["g3"], ["g3", "p2"], ["g3", "g3s", "p2", "p3"], ["m1", "m2", "m3", "c1", "c3", "cc2", "cg1",
                  "cr1", "hi1", "hs1", "i2", "t1"], ["t2", "t3", "t3a"], ["inf1", "inf2", "trn1", "dl1"],
                  ["x1", "x1e", "u-6tb1"], ["p3dn", "p4d", "p5"], ["g4ad", "f1", "mac1", "mac2"], ["g2", "g3"]]
GCP_EXCLUSIONS = [["e2", "f1", "g1"], ["f1", "g1"], ["m1", "m2", "m3"], ["a2", "a3"], ["c4a", "t2a"], ["h3", "z3"]]


@pytest.mark.parametrize("b,families", [("aws", f) for f in AWS_EXCLUSIONS] + [("local", f) for f in AWS_EXCLUSIONS]
                         + [("gcp", f) for f in GCP_EXCLUSIONS])
def test_users_exclusion_lists_plan(b, families):
    cfg = base(b)
    cfg["provider"]["exclude"] = dict(cfg["provider"].get("exclude") or {}, families=families)
    check(cfg)
    cfg = base(b)
    cfg["provider"]["rules"][0]["exclude_families"] = families
    check(cfg)


@pytest.mark.parametrize("families,at", [(["zz9"], 0), (["g3", "zz9"], 1)])
def test_an_unknown_family_is_refused_naming_it(families, at):
    cfg = base("aws")
    cfg["provider"]["exclude"]["families"] = families
    with pytest.raises(ConfigError) as e:
        check(cfg)
    assert e.value.key == f"provider.exclude.families[{at}]" and "'zz9' is not an aws instance family" in str(e.value)


def test_a_family_of_another_region_or_generation_is_a_note_in_an_allow_list():
    from ray_nodeless.core.catalog import embedded

    rc = embedded().region("aws", "us-west-2")
    offered = {rc.types[i].family for i in set(rc.type_ids)}
    elsewhere = sorted({t.family for t in rc.types} - offered)[0]     # priced in another region only
    cfg = base("aws")
    cfg["provider"]["rules"][1]["families"] = ["p3", elsewhere, "g4dn", "g5"]   # the GPU workers' rule
    [note] = check(cfg).warnings
    assert note.startswith(f"provider.rules[1].families: p3, {elsewhere} are aws families us-west-2 does not offer")


def test_groups_nested_and_flat_mean_the_same_and_both_at_once_is_an_error():
    flat = parse_provider({"region": "r", "metrics_port": None, "expected_launch_s": 60, "open_shapes": True,
                           "max_open_node_types": 4})
    nested = parse_provider({"region": "r", "metrics": {"port": None}, "idle": {"expected_launch_s": 60},
                             "open": {"enabled": True, "max_node_types": 4}})
    assert [g.model_dump() for g in (flat.metrics, flat.idle, flat.open)] == \
        [g.model_dump() for g in (nested.metrics, nested.idle, nested.open)]
    assert (flat.metrics_port, flat.expected_launch_s, flat.open_shapes, flat.max_open_node_types) == \
        (None, 60, True, 4)
    with pytest.raises(ConfigError) as e:
        parse_provider({"region": "r", "metrics_port": 1, "metrics": {"port": 2}})
    assert e.value.key == "provider.metrics_port / provider.metrics.port" and "given twice" in str(e.value)
    with pytest.raises(ConfigError) as e:                       # a flat key's error names the flat key
        parse_provider({"region": "r", "ray_status_events": 99})
    assert e.value.key == "provider.ray_status_events"
    with pytest.raises(ConfigError) as e:
        parse_provider({"region": "r", "metrics": {"ray_status_events": 99}})
    assert e.value.key == "provider.metrics.ray_status_events"
