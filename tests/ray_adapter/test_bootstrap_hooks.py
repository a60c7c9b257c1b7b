"""`bootstrap_config` reaches a cloud's own `ray up` steps only through the backend's hooks (`fill_default_images`
on its BackendConfig, `bootstrap` on its class): a third-party backend gets them the way AWS and GCP do, and one
that overrides neither gets nothing done."""
from __future__ import annotations

from typing import Any, Mapping

import pytest

from ray_nodeless.errors import ConfigError, NoFeasibleOffering
from ray_nodeless.providers import backend_class, backend_config, register_backend
from ray_nodeless.providers.base import BackendConfig, MachineBackend
from ray_nodeless.ray_adapter.bootstrap import bootstrap_config
from ray_nodeless.testing import fake_backend
from ray_nodeless.testing.fake_backend import FakeBackend

ZONE = "us-west-2b"
CALLS: list[tuple[str, Any]] = []


class HookedBackend(FakeBackend):
    """A backend of a third party's cloud with both hooks: it settles an image, then its cloud set-up pins every
    node type to the zones its (pretend) subnets are in, as AWS's does."""

    cloud = "hooked"
    subnet_zones: list[str] = [ZONE]
    narrows = True

    @classmethod
    def fill_default_images(cls, settings: Any, cluster_config: dict[str, Any]) -> None:
        CALLS.append(("fill_default_images", sorted(cluster_config["available_node_types"])))
        for nt in cluster_config["available_node_types"].values():
            nt["node_config"].setdefault("image", "hooked-default-image")

    @classmethod
    def bootstrap(cls, cluster_config: dict[str, Any], registration: str,
                  allowed_zones: Mapping[str, frozenset[str] | None]) -> bool:
        CALLS.append(("bootstrap", (registration, dict(allowed_zones))))
        for nt in cluster_config["available_node_types"].values():
            nt["node_config"]["zones"] = list(cls.subnet_zones)
        return cls.narrows


register_backend("hooked", __name__, "HookedBackend")


@pytest.fixture(autouse=True)
def _fresh():
    CALLS.clear()
    fake_backend.reset()
    yield
    HookedBackend.subnet_zones, HookedBackend.narrows = [ZONE], True


def _config(cloud: str) -> dict[str, Any]:
    return {"cluster_name": "hooks", "max_workers": 1, "head_node_type": "head",
            "provider": {"type": "external", "module": "ray_nodeless.NodelessProvider", "cloud": cloud,
                         "simulate_cloud": "aws", "region": "us-west-2"},
            "available_node_types": {"head": {"resources": {"CPU": 2}, "node_config": {"zones": ["us-west-2a", ZONE]}},
                                     "worker": {"resources": {"CPU": 4}, "node_config": {}, "max_workers": 1}}}


def test_the_hooks_run_in_order_with_the_plans_zones():
    out = bootstrap_config(_config("hooked"))
    assert [c[0] for c in CALLS] == ["fill_default_images", "bootstrap"]
    registration, allowed = CALLS[1][1]
    assert registration == "vm"
    assert allowed == {"head": frozenset({"us-west-2a", ZONE}), "worker": None}
    assert {n: t["node_config"]["image"] for n, t in out["available_node_types"].items()} == {
        "head": "hooked-default-image", "worker": "hooked-default-image"}


def test_a_bootstrap_that_narrowed_zones_is_planned_again():
    HookedBackend.subnet_zones = ["us-west-2z"]       # no offering there: the second plan must fail on it
    with pytest.raises((ConfigError, NoFeasibleOffering), match="zone"):
        bootstrap_config(_config("hooked"))


def test_a_bootstrap_that_says_nothing_changed_is_not_planned_again():
    HookedBackend.subnet_zones, HookedBackend.narrows = ["us-west-2z"], False
    bootstrap_config(_config("hooked"))
    assert [c[0] for c in CALLS] == ["fill_default_images", "bootstrap"]


def test_a_backend_without_hooks_gets_nothing_done():
    config = _config("fake")
    out = bootstrap_config(config)
    assert CALLS == []
    assert out["available_node_types"]["worker"]["node_config"] == {}
    assert FakeBackend.bootstrap(config, "vm", {}) is False
    assert BackendConfig.fill_default_images(None, config) is None
    assert MachineBackend.bootstrap(config, "vm", {}) is False


def test_built_in_clouds_answer_the_hooks_from_their_own_package():
    assert backend_config("aws").fill_default_images.__qualname__.startswith("AwsConfig.")
    assert backend_class("aws").bootstrap.__qualname__.startswith("AwsBackend.")
    assert backend_class("gcp").bootstrap.__qualname__.startswith("GcpBackend.")
    assert backend_config("local").fill_default_images.__qualname__.startswith("BackendConfig.")
