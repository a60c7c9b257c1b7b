"""The provider block is parsed once per provider object (issue 15, "parse once"), and the walk of
`provider_config` from the adapter goes down only: after the loader, nothing reads the raw block again.

Counted, not assumed: every declared settings section (core, backend, registration) is a pydantic model deriving
from `core.schema.Section`, and every parse of one goes through pydantic's `model_validate`. The `validations`
fixture wraps that classmethod (calling through to pydantic unchanged) and records which model validated what, so a
second parse of the provider block anywhere on the path (a backend constructor, a registration, a per-launch
requirement check, the interruption queue's client) shows up as a second count of the same model. The
`loader_calls` fixture does the same for the loader's functions (`load_provider`, `parse_provider`,
`parse_section`): each is wrapped, calling through unchanged, in every module that holds it. And the raw block
itself is emptied once the provider object exists: a part that climbed back up for a key would then fail.
"""
from __future__ import annotations

import functools
import sys
from collections import Counter
from typing import Any, Callable, Iterator

import pytest
from pydantic import BaseModel

import ray_nodeless.operate.sweep  # noqa: F401 - every module holding a loader function is imported before wrapping
import ray_nodeless.providers.aws.backend  # noqa: F401
import ray_nodeless.providers.aws.interruption_queue  # noqa: F401
from ray_nodeless.core import catalog as catalog_mod
from ray_nodeless.core import schema, settings
from ray_nodeless.core.catalog.refresh import CACHE_DIR_ENV, LiveCatalog, LiveFetch
from ray_nodeless.core.schema import Section
from ray_nodeless.core.settings import CoreSettings
from ray_nodeless.operate import config as operate_config
from ray_nodeless.operate.config import ProviderBundle, load_provider
from ray_nodeless.providers.aws.config import AwsConfig
from ray_nodeless.providers.aws.settings import AwsSettings
from ray_nodeless.ray_adapter.context import MonitorContext
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
        provider.stop()
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


# --------------------------------------------------------------------------------- the walk goes down only

LOADER_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "load_provider": operate_config.load_provider,
    "parse_provider": settings.parse_provider,
    "parse_section": schema.parse_section,
}


@pytest.fixture
def loader_calls(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """How often each loader function ran, wherever it was called from: each is replaced, in every ray_nodeless
    module that holds it (`from ... import parse_section` binds it in the importer), by a wrapper that counts and
    calls through to it unchanged."""
    calls: Counter[str] = Counter()

    def counted(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            calls[name] += 1
            return fn(*args, **kwargs)
        return wrapper

    wrappers = {name: counted(name, fn) for name, fn in LOADER_FUNCTIONS.items()}
    for module_name, module in sorted(sys.modules.items()):
        if module is None or not module_name.startswith("ray_nodeless"):
            continue
        for name, fn in LOADER_FUNCTIONS.items():
            if getattr(module, name, None) is fn:
                monkeypatch.setattr(module, name, wrappers[name])
    return calls


def region_doc(cloud: str, region: str) -> dict[str, Any]:
    """One embedded region as a single-file catalog document (what a live read of the cloud returns)."""
    emb = catalog_mod.embedded()
    rc = emb.region(cloud, region)
    rows = [(o.instance_type.name, o.zone, o.capacity, o.hourly_price) for o in rc.offerings()]
    types = list(emb.types(cloud))
    return {"format": 1, "name": "live-copy", "clouds": {cloud: {
        "types": [catalog_mod.type_row(t) for t in types], "regions": {region: catalog_mod.region_entry(types, rows)}}}}


class LiveSettings(Section):
    """A third-party backend's keys that say where its live catalog is read."""

    live_endpoint: str = "https://catalog.invalid"


class LiveBackend(fake_backend.FakeBackend):
    """A registered backend with a live catalog: its hook records the settings it was handed."""

    cloud = "live"
    settings_model = LiveSettings
    handed: list[Any] = []

    @classmethod
    def live_catalog(cls, settings: Section, region: str) -> LiveCatalog:
        cls.handed.append(settings)
        return LiveCatalog(cloud="aws", region=region, cache_name=f"live-{region}",
                           fetch=lambda: LiveFetch(region_doc("aws", region)), describe=settings.live_endpoint)


@pytest.fixture
def live_registered(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    from ray_nodeless import providers

    monkeypatch.setattr(providers, "_BACKENDS", dict(providers._BACKENDS))
    monkeypatch.setattr(providers, "_CONFIGS", dict(providers._CONFIGS))
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "catalog-cache"))
    monkeypatch.setattr(LiveBackend, "handed", [])
    providers.register_backend("live", __name__, "LiveBackend")


def launch_and_list(provider: NodelessProvider, n: int = 3) -> list[str]:
    for i in range(n):
        assert provider.create_node_with_resources_and_labels(
            {}, dict(WORKER_TAGS, **{"ray-launch-request": f"r{i}"}), 1, {"CPU": 4, "GPU": 1}, {})
    nodes = provider.non_terminated_nodes({})
    assert len(nodes) == n and all(provider.node_tags(m)["ray-user-node-type"] == "gpu_worker" for m in nodes)
    return nodes


def test_the_walk_of_provider_config_goes_down_only(loader_calls: Counter[str], validations: Validations) -> None:
    """Construction: one load_provider, which parses the core once (parse_provider -> parse_section) and the
    backend's and the registration's sections once each. Launches, listing and terminate: nothing, and the raw
    block, emptied after construction, is never read again (a part that climbed back up for a key would fail)."""
    cloud = fake_backend.reset()
    raw = dict(FAKE)
    provider = NodelessProvider(raw, "c1")
    assert loader_calls == Counter({"load_provider": 1, "parse_provider": 1, "parse_section": 3})
    assert validations.repeated() == {}
    loader_calls.clear()
    validations.clear()
    raw.clear()
    nodes = launch_and_list(provider)
    assert provider._catalog.loaded                       # the first launch loaded the catalog, from the bundle
    provider.terminate_nodes(nodes)
    assert provider.non_terminated_nodes({}) == [] and len(cloud.launches) == 3
    assert loader_calls == Counter() and validations.counts == Counter()


def test_a_live_catalog_is_read_with_the_bundles_backend_section(live_registered: None, loader_calls: Counter[str],
                                                                 validations: Validations) -> None:
    """`catalog: live`: at the first launch the backend's live_catalog hook gets the loader's own parsed section
    (not the raw block to parse again), and the block is not read again."""
    fake_backend.reset()
    raw = dict(FAKE, cloud="live", catalog="live", live_endpoint="https://catalog.example")
    provider = NodelessProvider(raw, "c1")
    assert loader_calls["load_provider"] == 1 and validations.of(LiveSettings) == 1
    loader_calls.clear()
    validations.clear()
    raw.clear()
    launch_and_list(provider)
    assert LiveBackend.handed == [provider.bundle.backend_settings]
    assert LiveBackend.handed[0] is provider.bundle.backend_settings
    assert provider._catalog.result.source == "live" and provider._catalog.result.reason.endswith("catalog.example")
    assert loader_calls == Counter() and validations.counts == Counter()


def test_the_interruption_queue_client_gets_the_parsed_aws_section(moto: MotoServer, loader_calls: Counter[str],
                                                                   validations: Validations,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """In the monitor (a context that acts on the cluster) the AWS provider builds its SQS client through the
    backend's hook from the bundle's AwsSettings; polling the queue at each listing re-reads nothing."""
    import boto3

    sqs = boto3.client("sqs", region_name=REGION, endpoint_url=moto.url, **CREDS)
    url = sqs.create_queue(QueueName="parse-once-spot")["QueueUrl"]
    handed: list[Any] = []
    hook = AwsConfig.interruption_queue_client.__func__

    def recording(cls: type, queue_url: str, aws_settings: Section) -> Any:
        handed.append(aws_settings)
        return hook(cls, queue_url, aws_settings)

    monkeypatch.setattr(AwsConfig, "interruption_queue_client", classmethod(recording))
    raw = dict(aws_provider(moto), interruption_queue_url=url)
    provider = NodelessProvider(raw, "c1", context=MonitorContext(gcs_address="127.0.0.1:1", acts_on_cluster=True))
    try:
        assert provider.interruptions is not None
        assert handed == [provider.bundle.backend_settings] and handed[0] is provider.bundle.backend_settings
        assert loader_calls["load_provider"] == 1 and validations.of(AwsSettings) == 1
        loader_calls.clear()
        validations.clear()
        raw.clear()
        provider.create_node_with_resources_and_labels({}, dict(WORKER_TAGS, **{"ray-launch-request": "q1"}), 1,
                                                       {"CPU": 4}, {})
        assert len(provider.non_terminated_nodes({})) == 1      # the loop's first listing polls the queue (empty)
        assert provider.interruptions.last_report is not None and not provider.interruptions.last_report.error
        assert loader_calls == Counter() and validations.counts == Counter()
    finally:
        provider.terminate_nodes(provider.non_terminated_nodes({}))
        provider.stop()
        provider.backend.close()


def test_config_time_checks_take_the_parsed_bundle(validations: Validations) -> None:
    """`plan`'s and bootstrap_config's static half: the cluster check, the registration's `check_config` (here
    Kubernetes': the join keys and the pod template) and the backend's `fill_default_images` (AWS: Ray's default
    AMI of the region) take the loader's sections and parse no part of the block again."""
    from ray_nodeless.registrations.kubernetes.settings import KubernetesSettings
    from ray_nodeless.ray_adapter.bootstrap import settle_images
    from tests.config.corpus import base

    k8s = base("k8s")
    bundle = load_provider(k8s["provider"])
    assert validations.of(KubernetesSettings) == 1
    validations.clear()
    operate_config.check_cluster(k8s, bundle=bundle)
    bundle.registration_class.check_config(bundle.registration_settings)
    assert validations.of(KubernetesSettings) == 0 and validations.of(CoreSettings) == 0

    aws = base("aws")
    for nt in aws["available_node_types"].values():
        nt.get("node_config", {}).pop("ImageId", None)
    bundle = load_provider(aws["provider"])
    validations.clear()
    settle_images(aws, bundle)
    assert all(nt["node_config"].get("ImageId") for nt in aws["available_node_types"].values())
    operate_config.check_cluster(aws, bundle=bundle)
    assert validations.of(AwsSettings) == 0 and validations.of(CoreSettings) == 0
