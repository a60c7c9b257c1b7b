"""The gcp backend's declared provider-block keys (GcpSettings): errors name the key, before any client exists."""
from __future__ import annotations

from typing import Any

import pytest

from ray_nodeless.core.schema import declared_keys, parse_section
from ray_nodeless.errors import ConfigError
from ray_nodeless.providers.gcp.backend import GcpBackend
from ray_nodeless.providers.gcp.settings import DEFAULT_IMAGE, GcpSettings

BASE = {"cloud": "gcp", "region": "us-central1", "project_id": "p"}


def test_defaults() -> None:
    s = parse_section(GcpSettings, BASE, "provider")
    assert (s.project_id, s.region, s.image, s.disk_size_gb, s.max_attempts) == ("p", "us-central1", DEFAULT_IMAGE,
                                                                               50, 6)
    assert s.credentials is None and s.api_endpoint is None


@pytest.mark.parametrize("key, value, message", [
    ("project_id", None, "must be a string, got None"),
    ("project_id", "", "must not be empty"),
    ("disk_size_gb", "big", "must be an integer, got 'big'"),
    ("disk_size_gb", 5, "must be >= 10"),
    ("max_attempts", 0, "must be >= 1"),
    ("call_timeout_s", "60s", "must be a number"),
    ("operation_timeout_s", 0, "must be > 0"),
    ("retry_base_s", float("nan"), "must be a finite number"),
    ("credentials", "/home/me/key.json", "must be `anonymous` or a google.auth Credentials object"),
    ("credentials", {"token": "x"}, "must be `anonymous`"),
    ("image", "", "must not be empty"),
])
def test_bad_values_name_the_key(key: str, value: Any, message: str) -> None:
    with pytest.raises(ConfigError) as ei:
        GcpBackend.from_provider({**BASE, key: value}, "c")          # fails before building a client
    assert ei.value.key == f"provider.{key}"
    assert message in str(ei.value)


def test_missing_project_id() -> None:
    with pytest.raises(ConfigError) as ei:
        parse_section(GcpSettings, {"region": "us-central1"}, "provider")
    assert ei.value.key == "provider.project_id" and "is required" in str(ei.value)


def test_credentials_object_is_accepted() -> None:
    from google.auth.credentials import AnonymousCredentials

    creds = AnonymousCredentials()
    assert parse_section(GcpSettings, {**BASE, "credentials": creds}, "provider").credentials is creds


def test_every_key_passes_the_provider_block_check_and_typos_get_a_suggestion() -> None:
    """The loader (operate/config.py) rejects keys no section declares: every key the backend reads must be declared."""
    from ray_nodeless.operate.config import load_provider

    full = {**BASE, "api_endpoint": "http://127.0.0.1:1", "credentials": "anonymous", "image": "projects/x/y",
            "network": "global/networks/n", "disk_size_gb": 100, "operation_timeout_s": 60, "call_timeout_s": 10,
            "max_attempts": 3, "retry_base_s": 0.1, "retry_max_s": 2, "poll_interval_s": 0.5}
    assert set(full) - {"cloud"} <= declared_keys(GcpSettings)
    bundle = load_provider(full)
    assert bundle.backend_class() is GcpBackend and isinstance(bundle.backend_settings, GcpSettings)
    with pytest.raises(ConfigError) as ei:
        load_provider({**BASE, "disk_size_gbs": 100})
    assert ei.value.key == "provider.disk_size_gbs" and "disk_size_gb" in str(ei.value)


# ------------------------------------------------------------------------------ Ray's keys: the swap-in mapping

from ray_nodeless.providers.gcp import node_config as gcp_nc   # noqa: E402

NC_KEY = "available_node_types.w.node_config"
PROVIDER = {**BASE, "region": "us-west1", "availability_zone": "us-west1-b"}


def check(node_config: dict[str, Any], provider: dict[str, Any] | None = None) -> dict[str, Any]:
    settings = parse_section(GcpSettings, provider if provider is not None else PROVIDER, "provider")
    gcp_nc.check_node_config("w", node_config, NC_KEY, settings)
    return gcp_nc.requirement_overrides(node_config, settings)


def check_error(node_config: dict[str, Any], provider: dict[str, Any] | None = None) -> ConfigError:
    with pytest.raises(ConfigError) as e:
        check(node_config, provider)
    return e.value


@pytest.mark.parametrize("scheduling, capacity", [
    ([{"preemptible": True}, {"onHostMaintenance": "TERMINATE"}], ["spot"]),      # Ray's own examples
    ({"preemptible": True}, ["spot"]),
    ({"provisioningModel": "SPOT", "instanceTerminationAction": "DELETE"}, ["spot"]),
    ({"preemptible": False}, ["on-demand"]),
    ([{"provisioningModel": "STANDARD"}], ["on-demand"]),
    ({"onHostMaintenance": "TERMINATE"}, None),
])
def test_scheduling_in_list_or_map_form_pins_the_capacity(scheduling: Any, capacity: list[str] | None) -> None:
    out = check({"machineType": "n1-standard-2", "scheduling": scheduling})
    assert out == {"instance_types": ["n1-standard-2"], "zones": ["us-west1-b"],
                   **({"capacity": capacity} if capacity else {})}


@pytest.mark.parametrize("scheduling, key", [
    ({"preemptible": True, "provisioningModel": "STANDARD"}, "scheduling.provisioningModel"),
    ([{"preemptible": True}, {"preemptible": False}], "scheduling[1].preemptible"),
    ({"provisioningModel": "FLEX_START"}, "scheduling.provisioningModel"),
    ({"provisioningModel": "SPOT", "instanceTerminationAction": "STOP"}, "scheduling.instanceTerminationAction"),
    ({"preemptible": True, "automaticRestart": True}, "scheduling.automaticRestart"),
    ({"preemptible": True, "onHostMaintenance": "MIGRATE"}, "scheduling.onHostMaintenance"),
    ([{"preemptable": True}], "scheduling"),
    (["preemptible"], "scheduling[0]"),
])
def test_scheduling_that_cannot_be_honoured_names_the_key(scheduling: Any, key: str) -> None:
    assert check_error({"machineType": "n1-standard-2", "scheduling": scheduling}).key == f"{NC_KEY}.{key}"


def test_guest_accelerators_give_the_gpu_model_and_count() -> None:
    acc = [{"acceleratorType": "projects/p/zones/us-west1-b/acceleratorTypes/nvidia-tesla-t4",
            "acceleratorCount": 2}]
    assert check({"machineType": "zones/us-west1-b/machineTypes/n1-standard-8", "guestAccelerators": acc}) == {
        "instance_types": ["n1-standard-8+2xT4"], "zones": ["us-west1-b"]}
    e = check_error({"machineType": "n1-standard-8", "guestAccelerators": [
        {"acceleratorType": "nvidia-tesla-k8O", "acceleratorCount": 1}]})
    assert e.key == f"{NC_KEY}.guestAccelerators[0].acceleratorType"
    e = check_error({"machineType": "n1-standard-8", "guestAccelerators": [
        {"acceleratorType": "nvidia-tesla-t4", "acceleratorCount": 0}]})
    assert e.key == f"{NC_KEY}.guestAccelerators[0].acceleratorCount"
    e = check_error({"machineType": "a2-highgpu-1g", "guestAccelerators": [
        {"acceleratorType": "nvidia-tesla-a100", "acceleratorCount": 1}]})
    assert e.key == f"{NC_KEY}.guestAccelerators" and "comes with its own GPUs" in str(e)


@pytest.mark.parametrize("machine_type", ["custom-6-16384", "n2-custom-8-32768", "e2-custom-4-8192",
                                          "zones/us-west1-b/machineTypes/n1-custom-2-13312-ext"])
def test_custom_machine_types_are_a_clear_error(machine_type: str) -> None:
    e = check_error({"machineType": machine_type})
    assert e.key == f"{NC_KEY}.machineType"
    assert "custom machine type" in str(e) and "no per-vCPU / per-GB rates" in str(e)


def test_availability_zone_names_zones_of_the_region() -> None:
    assert check({}, {**PROVIDER, "availability_zone": "us-west1-b,us-west1-a"}) == {
        "zones": ["us-west1-a", "us-west1-b"]}
    assert check({}, {**PROVIDER, "availability_zone": None}) == {}
    e = check_error({}, {**PROVIDER, "availability_zone": "us-east1-b"})
    assert e.key == "provider.availability_zone" and "not a zone of region 'us-west1'" in str(e)


def test_availability_zone_reaches_the_plan() -> None:
    from ray_nodeless.operate.config import check_cluster

    cfg = {"cluster_name": "c", "max_workers": 1, "head_node_type": "h", "available_node_types": {
        "h": {"resources": {"CPU": 2}, "node_config": {"machineType": "n1-standard-2"}}},
        "provider": {"type": "external", "module": "ray_nodeless.NodelessProvider", "cloud": "gcp",
                     "region": "us-west1", "project_id": "p", "availability_zone": "us-west1-b"}}
    assert {o.zone for o in check_cluster(cfg).plans["h"].candidates()} == {"us-west1-b"}
