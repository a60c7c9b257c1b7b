"""`head_ip` and `gcs_address` are declared once (core.settings.HeadAddress): every provider-block section that
reads them (the local backend and players, `registration: vm`, `registration: kubernetes`) derives from it, so a
block means the same to each and a mistake gets the same error, whichever section reads it first."""
from __future__ import annotations

import importlib
import pkgutil

import pytest

import ray_nodeless
from ray_nodeless.core.schema import Section
from ray_nodeless.core.settings import DEFAULT_GCS_PORT, HeadAddress
from ray_nodeless.errors import ConfigError
from ray_nodeless.operate.config import load_provider
from ray_nodeless.providers.local.settings import DEFAULT_GCS_ADDRESS, KubeletPlayerSettings, LocalSettings
from ray_nodeless.registrations.kubernetes.settings import KubernetesSettings
from ray_nodeless.registrations.vm import VmSettings

HEAD_KEYS = ("head_ip", "gcs_address")
KUBERNETES = {"registration": "kubernetes",
              "kubernetes": {"join": {"method": "k3s", "endpoint": "https://10.0.0.1:6443", "token": "t"}}}


def _sections() -> list[type[Section]]:
    """Every Section model of the package (each module imported, then the subclasses walked)."""
    for info in pkgutil.walk_packages(ray_nodeless.__path__, "ray_nodeless."):
        if not info.name.startswith("ray_nodeless.testing"):
            importlib.import_module(info.name)
    seen: list[type[Section]] = []
    todo = [Section]
    while todo:
        cls = todo.pop()
        for sub in cls.__subclasses__():
            if sub not in seen:
                seen.append(sub)
                todo.append(sub)
    return sorted(seen, key=lambda c: (c.__module__, c.__qualname__))


def test_the_head_keys_are_declared_once() -> None:
    declaring = sorted(f"{c.__module__}.{c.__qualname__}" for c in _sections()
                       if set(HEAD_KEYS) & set(c.__dict__.get("__annotations__", {})))
    assert declaring == ["ray_nodeless.core.settings.HeadAddress"]
    readers = [c for c in _sections() if set(HEAD_KEYS) <= set(c.model_fields)]
    assert {LocalSettings, KubeletPlayerSettings, VmSettings, KubernetesSettings} <= set(readers)
    assert all(issubclass(c, HeadAddress) for c in readers)


@pytest.mark.parametrize("block", [{"cloud": "local"}, {"cloud": "fake", "registration": "vm"},
                                   {"cloud": "fake", **KUBERNETES}], ids=["local", "vm", "kubernetes"])
@pytest.mark.parametrize("value", ["localhost", ":6379", "127.0.0.1:70000", "head:port"])
def test_every_reader_refuses_a_bad_gcs_address_alike(block: dict, value: str) -> None:
    from ray_nodeless.testing import fake_backend  # noqa: F401 - registers `cloud: fake`

    with pytest.raises(ConfigError) as e:
        load_provider({"region": "us-west-2", "simulate_cloud": "aws", **block, "gcs_address": value})
    assert e.value.key == "provider.gcs_address" and 'must be "host:port" with a port in 1-65535' in str(e.value)


def test_each_reader_keeps_its_own_default() -> None:
    assert HeadAddress().gcs_port() == DEFAULT_GCS_PORT == 6379
    assert HeadAddress(gcs_address="10.0.0.5:6380").gcs_port() == 6380
    assert HeadAddress().gcs_address_at("10.0.0.5") == "10.0.0.5:6379"
    assert HeadAddress(gcs_address="h:1").gcs_address_at("10.0.0.5") == "h:1"
    assert LocalSettings(region="r").local_gcs_address() == DEFAULT_GCS_ADDRESS == "127.0.0.1:6379"
    assert LocalSettings(region="r", gcs_address="127.0.0.1:6391").local_gcs_address() == "127.0.0.1:6391"
    vm = load_provider({"cloud": "local", "region": "us-west-2", "gcs_address": "127.0.0.1:6391", "head_ip": "h"})
    assert vm.backend_settings.gcs_address == vm.registration_settings.gcs_address == "127.0.0.1:6391"
    assert vm.registration_settings.gcs_port() == 6391 and vm.registration_settings.head_ip == "h"
