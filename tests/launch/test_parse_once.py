"""The provider block is parsed once per provider object (issue 15, "parse once").

Counted, not assumed: every declared settings section (core, backend, registration) is a pydantic model deriving
from `core.schema.Section`, and every parse of one goes through pydantic's `model_validate`. The `validations`
fixture wraps that classmethod (calling through to pydantic unchanged) and records which model validated what, so a
second parse of the provider block anywhere on the path (a backend constructor, a registration, a per-launch
requirement check, the interruption queue's client) shows up as a second count of the same model.
"""
from __future__ import annotations

from collections import Counter
from typing import Any, Iterator

import pytest
from pydantic import BaseModel

from ray_nodeless.core.schema import Section
from ray_nodeless.core.settings import CoreSettings
from ray_nodeless.launch.config import ProviderBundle, load_provider
from ray_nodeless.providers.aws.settings import AwsSettings
from ray_nodeless.ray_adapter.provider import NodelessProvider
from ray_nodeless.registrations.vm import VmSettings
from ray_nodeless.testing import fake_backend
from ray_nodeless.testing.moto_server import CREDS, REGION, MotoServer

WORKER_TAGS = {"ray-node-type": "worker", "ray-user-node-type": "gpu_worker", "ray-node-status": "uninitialized",
               "ray-node-name": "ray-c1-worker", "ray-launch-config": "abc"}
RULES = [{"name": "gpu-spot-first", "match": {"GPU": ">=1"}, "capacity": ["spot", "on-demand"]},
         {"name": "cpu", "match": {}, "capacity": ["on-demand"]}]
FAKE = {"type": "external", "module": "ray_nodeless.NodelessProvider", "cloud": "fake", "simulate_cloud": "aws",
        "region": "us-west-2", "list_cache_s": 0, "exclude": {"gpus": ["M60", "K80"]}, "rules": RULES}
AMI = "ami-12c6146b"    # moto launches any image id


class Validations:
    """Which Section models pydantic validated, and how often."""

    def __init__(self) -> None:
        self.counts: Counter[type] = Counter()

    def clear(self) -> None:
        self.counts.clear()

    def of(self, model: type) -> int:
        return self.counts[model]

    def repeated(self) -> dict[str, int]:
        return {m.__qualname__: n for m, n in sorted(self.counts.items(), key=lambda kv: kv[0].__qualname__)
                if n > 1}


@pytest.fixture
def validations(monkeypatch: pytest.MonkeyPatch) -> Iterator[Validations]:
    seen = Validations()
    validate = BaseModel.model_validate.__func__     # pydantic's own classmethod, called through unchanged

    def counting(cls: type[BaseModel], obj: Any, *args: Any, **kwargs: Any) -> BaseModel:
        seen.counts[cls] += 1
        return validate(cls, obj, *args, **kwargs)

    monkeypatch.setattr(Section, "model_validate", classmethod(counting))
    yield seen


def test_the_loader_parses_every_section_once(validations: Validations) -> None:
    bundle = load_provider(dict(FAKE))
    assert isinstance(bundle, ProviderBundle) and isinstance(bundle.core, CoreSettings)
    # core keys, the fake backend's (no keys of its own: the bare Section), the vm registration's
    assert validations.of(CoreSettings) == 1 and validations.of(Section) == 1 and validations.of(VmSettings) == 1
    assert validations.repeated() == {}
    assert bundle.core.rules.rules[0].name == "gpu-spot-first" and bundle.core.price_cloud == "aws"


def test_fake_backend_provider_and_launches_parse_nothing_again(validations: Validations) -> None:
    cloud = fake_backend.reset()
    provider = NodelessProvider(dict(FAKE), "c1")
    assert validations.of(CoreSettings) == 1 and validations.of(VmSettings) == 1
    assert validations.repeated() == {}
    validations.clear()
    for i in range(3):
        provider.create_node_with_resources_and_labels({}, dict(WORKER_TAGS, **{"ray-launch-request": f"r{i}"}), 1,
                                                       {"CPU": 4, "GPU": 1}, {})
    provider.non_terminated_nodes({})
    assert len(cloud.launches) == 3
    assert validations.counts == Counter()     # launching re-reads no part of the provider block
    # The parts handed down are the bundle's own objects, not re-parsed copies.
    assert provider.backend.settings is provider.bundle.backend_settings
    assert provider.settings is provider.bundle.core


def aws_provider(moto: MotoServer) -> dict[str, Any]:
    return {"type": "external", "module": "ray_nodeless.NodelessProvider", "cloud": "aws", "region": REGION,
            "endpoint_url": moto.url, "image_id": AMI, "aws_credentials": dict(CREDS), "aws_max_attempts": 1,
            "list_cache_s": 0, "exclude": {"gpus": ["M60", "K80"], "families": ["g5"]}, "rules": RULES,
            "availability_zone": f"{REGION}a,{REGION}b"}


def test_aws_provider_and_launches_on_moto_parse_once(moto: MotoServer, validations: Validations) -> None:
    provider = NodelessProvider(aws_provider(moto), "c1")
    try:
        assert validations.of(CoreSettings) == 1 and validations.of(AwsSettings) == 1
        assert validations.of(VmSettings) == 1 and validations.repeated() == {}
        validations.clear()
        for i in range(2):
            out = provider.create_node_with_resources_and_labels(
                {"InstanceType": "m5.xlarge"} if i else {}, dict(WORKER_TAGS, **{"ray-launch-request": f"r{i}"}),
                1, {"CPU": 4}, {})
            assert out and all(v["zone"] in (f"{REGION}a", f"{REGION}b") for v in out.values())
        assert len(provider.non_terminated_nodes({})) == 2
        # Neither the node_config mapping (InstanceType, the zones of availability_zone) nor RunInstances
        # re-parsed the AWS keys.
        assert validations.of(AwsSettings) == 0 and validations.of(CoreSettings) == 0
        assert provider.backend.settings is provider.bundle.backend_settings
    finally:
        provider.terminate_nodes(provider.non_terminated_nodes({}))
        provider.backend.close()


class KnobSettings(Section):
    """A third-party backend's own provider keys."""

    fake_knob: int = 1


class KnobBackend(fake_backend.FakeBackend):
    """A backend registered from outside the package (`providers.register_backend`) that declares its own keys."""

    cloud = "knob"
    settings_model = KnobSettings


@pytest.fixture
def knob_registered(monkeypatch: pytest.MonkeyPatch) -> None:
    from ray_nodeless import providers

    monkeypatch.setattr(providers, "_BACKENDS", dict(providers._BACKENDS))    # the registration ends with the test
    monkeypatch.setattr(providers, "_CONFIGS", dict(providers._CONFIGS))
    providers.register_backend("knob", __name__, "KnobBackend")


def test_a_registered_backend_gets_its_own_section_parsed(knob_registered: None, validations: Validations) -> None:
    """The contract of providers/base.py: `Backend(settings, cluster_name)`, `settings` its settings_model parsed
    once by the loader; a wrong value of its key is an error naming the key, before any backend exists."""
    from ray_nodeless.errors import ConfigError

    fake_backend.reset()
    provider = NodelessProvider(dict(FAKE, cloud="knob", fake_knob=3), "c1")
    assert isinstance(provider.backend, KnobBackend) and provider.backend.cluster_name == "c1"
    assert provider.backend.settings == KnobSettings(fake_knob=3) and validations.of(KnobSettings) == 1
    with pytest.raises(ConfigError) as e:
        load_provider(dict(FAKE, cloud="knob", fake_knob="three"))
    assert e.value.key == "provider.fake_knob" and "must be an integer" in str(e.value)
    with pytest.raises(ConfigError) as e:
        load_provider(dict(FAKE, cloud="knob", fake_knop=3))
    assert e.value.key == "provider.fake_knop" and "fake_knob" in str(e.value)
