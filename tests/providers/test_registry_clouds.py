"""Which catalog cloud prices a backend, and which of Ray's own provider types it stands for, are the backend
registry's answers (`BackendConfig.catalog_cloud`, `BackendConfig.ray_provider_type`), not a list of cloud names
in the core, the adapter or swap-in (tests/cli/test_cloud_switches.py): the built-in clouds answer their own, a
third-party backend registered with `providers.register_backend` is asked the same way, and the callers (the
loader's pricing and its `simulate_cloud` checks, Ray's defaults of bootstrap_config, convert's defaults lookup,
simulate's replay of a cluster YAML) follow the answers."""
from __future__ import annotations

from pathlib import Path

import pytest

from ray_nodeless import providers
from ray_nodeless.core.catalog import embedded
from ray_nodeless.errors import ConfigError
from ray_nodeless.operate.config import load_provider
from ray_nodeless.providers import backend_config, price_clouds, ray_provider_types
from ray_nodeless.testing import fake_backend

ROOT = Path(__file__).resolve().parents[2]


class MeteredBackend(fake_backend.FakeBackend):
    """A third-party backend whose machines are GCE's (priced by the gcp catalog) and that stands for Ray's
    `type: gcp` provider, under a name of its own."""

    cloud = "metered"
    catalog_cloud = "gcp"
    ray_provider_type = "gcp"


@pytest.fixture
def metered(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(providers, "_BACKENDS", dict(providers._BACKENDS))    # the registration ends with the test
    monkeypatch.setattr(providers, "_CONFIGS", dict(providers._CONFIGS))
    providers.register_backend("metered", __name__, "MeteredBackend")


def test_the_built_in_clouds_answer_and_the_rest_default_to_none() -> None:
    assert price_clouds() == ["aws", "gcp"]
    assert ray_provider_types() == {"aws": "aws", "gcp": "gcp"}
    for name in ("local", "fake"):
        assert backend_config(name).catalog_cloud is None and backend_config(name).ray_provider_type is None
    # every catalog cloud a backend names is one the embedded catalog prices
    assert set(price_clouds()) <= set(embedded().clouds)


def test_the_loader_prices_a_block_by_its_backends_catalog_cloud(metered: None) -> None:
    assert load_provider({"cloud": "gcp", "region": "us-central1", "project_id": "p"}).core.price_cloud == "gcp"
    assert load_provider({"cloud": "aws", "region": "us-east-1"}).core.price_cloud == "aws"
    assert load_provider({"cloud": "metered", "region": "us-central1"}).core.price_cloud == "gcp"
    # a backend that is not a cloud: simulate_cloud, else the default
    assert load_provider({"cloud": "local", "region": "us-central1", "simulate_cloud": "gcp"}).core.price_cloud == "gcp"
    assert load_provider({"cloud": "fake", "region": "us-east-1"}).core.price_cloud == "aws"


def test_simulate_cloud_is_checked_against_the_registry(metered: None) -> None:
    with pytest.raises(ConfigError) as e:
        load_provider({"cloud": "local", "region": "us-east-1", "simulate_cloud": "azure"})
    assert e.value.key == "provider.simulate_cloud" and "['aws', 'gcp']" in str(e.value) and "'azure'" in str(e.value)
    with pytest.raises(ConfigError) as e:
        load_provider({"cloud": "local", "region": "us-east-1", "simulate_cloud": ""})
    assert e.value.key == "provider.simulate_cloud" and "must not be empty" in str(e.value)
    for cloud in ("aws", "metered"):      # a backend with a catalog cloud of its own is priced by it
        with pytest.raises(ConfigError) as e:
            load_provider({"cloud": cloud, "region": "us-central1", "simulate_cloud": "aws"})
        assert e.value.key == "provider.simulate_cloud" and f"not {cloud!r}" in str(e.value)


def test_ray_defaults_follow_the_ray_provider_type(metered: None) -> None:
    from ray_nodeless.ray_adapter.ray_defaults import fill_ray_defaults, ray_defaults

    gcp = ray_defaults("gcp")
    assert gcp["provider"]["type"] == "gcp" and gcp["head_start_ray_commands"]
    assert ray_defaults("metered") == gcp                  # the registry's answer, not the backend's name
    assert ray_defaults("aws")["provider"]["type"] == "aws"
    assert ray_defaults("local") == {} and ray_defaults("no-such-backend") == {}
    config = {"provider": {"cloud": "metered", "region": "us-central1"}}
    assert "head_start_ray_commands" in fill_ray_defaults(config)
    assert config["head_start_ray_commands"] == gcp["head_start_ray_commands"]


def test_convert_reads_ray_defaults_only_of_a_type_a_backend_stands_for() -> None:
    from ray_nodeless.swapin.ray_defaults import defaults_path

    assert defaults_path("aws").name == "defaults.yaml" and defaults_path("aws").parent.name == "aws"
    for ray_type in ("azure", "local", None):
        with pytest.raises(ConfigError) as e:
            defaults_path(ray_type)
        assert e.value.key == "provider.type" and "['aws', 'gcp']" in str(e.value)


def test_simulate_prices_a_gcp_cluster_from_the_gcp_catalog() -> None:
    from ray_nodeless.simulate.config import config_from_cluster

    sim = config_from_cluster(str(ROOT / "cluster-configs" / "gcp-gpu-head.yaml"), "all-parallel", False)
    gcp = embedded().region("gcp", "us-central1")
    for name, offer in sorted(sim.offers.items()):
        assert gcp.find(offer.instance_type, offer.zone, offer.capacity) is not None, (name, offer)
