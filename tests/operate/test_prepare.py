"""`ray-nodeless plan` prepares a YAML the way `ray up` does without importing Ray: checked against Ray's own
`prepare_config` on every shipped cluster config."""
from __future__ import annotations

import copy

import pytest
import yaml
from ray.autoscaler._private.util import prepare_config

from ray_nodeless.errors import ConfigError
from ray_nodeless.operate.config import RAY_REQUIRED_KEYS, prepare_like_ray_up
from tests import REPO_ROOT

CONFIGS = sorted(p for p in (REPO_ROOT / "cluster-configs").glob("*.yaml") if "rbac" not in p.name)


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_node_types_equal_rays_preparation(path):
    cfg = yaml.safe_load(path.read_text())
    ours = prepare_like_ray_up(cfg)
    rays = prepare_config(copy.deepcopy(cfg))
    assert ours["head_node_type"] == rays["head_node_type"]
    for name, nt in rays["available_node_types"].items():
        mine = ours["available_node_types"][name]
        assert (mine["min_workers"], mine["max_workers"]) == (nt["min_workers"], nt["max_workers"]), name
        assert mine.get("resources") == nt.get("resources") and mine.get("node_config") == nt.get("node_config")


@pytest.mark.parametrize("key", RAY_REQUIRED_KEYS)
def test_a_key_ray_requires_is_an_error_here_too(key):
    cfg = yaml.safe_load((REPO_ROOT / "cluster-configs" / "aws-gpu-head.yaml").read_text())
    del cfg[key]
    with pytest.raises(ConfigError) as ours:
        prepare_like_ray_up(cfg)
    assert ours.value.key == key
    with pytest.raises((KeyError, AssertionError)):
        prepare_config(copy.deepcopy(cfg))          # Ray refuses the same YAML


@pytest.mark.parametrize("module, says", [
    ("ray_nodeles.NodelessProvider", "did you mean 'ray_nodeless.NodelessProvider'?"),
    ("ray_nodeless.NodelesProvider", "did you mean 'ray_nodeless.NodelessProvider'?"),
    ("mycorp_providers.Provider", "no module 'mycorp_providers' to import"),
    ("NodelessProvider", "must be a dotted path"),
    (7, "must be a dotted path"),
])
def test_a_provider_module_ray_could_not_import_is_named(module, says):
    """Ray imports `provider.module` only at `ray up` (ModuleNotFoundError there); `plan` names it first."""
    cfg = yaml.safe_load((REPO_ROOT / "cluster-configs" / "aws-gpu-head.yaml").read_text())
    cfg["provider"]["module"] = module
    with pytest.raises(ConfigError) as e:
        prepare_like_ray_up(cfg)
    assert e.value.key == "provider.module" and says in str(e.value)


def test_a_users_own_provider_class_and_ours_pass():
    cfg = yaml.safe_load((REPO_ROOT / "cluster-configs" / "aws-gpu-head.yaml").read_text())
    for module in ("ray_nodeless.NodelessProvider", "ray_nodeless.kuberay.provider.KubeRayNodelessProvider",
                   "tests.operate.test_prepare.MyProvider"):      # a module that exists (its class is Ray's to load)
        prepare_like_ray_up({**cfg, "provider": {**cfg["provider"], "module": module}})
