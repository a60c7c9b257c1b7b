"""AwsSettings: every provider-block key of the AWS backend is declared, and a wrong value is a ConfigError naming
the key, raised before any client exists (so `ray up` and `ray-nodeless plan` stop on it too)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ray_nodeless.core.schema import declared_keys, parse_section
from ray_nodeless.errors import ConfigError
from ray_nodeless.operate.config import load_provider
from ray_nodeless.providers.aws.backend import AwsBackend
from ray_nodeless.providers.aws.settings import (
    DEFAULT_MAX_ATTEMPTS, DEFAULT_RETRY_BASE_DELAY_S, DEFAULT_SETTLE_WAIT_S, MAX_DESCRIBE_PAGE_SIZE, AwsSettings,
)

REGION = "us-east-1"
SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"


def provider(**extra: Any) -> dict[str, Any]:
    return {"cloud": "aws", "region": REGION, **extra}


def config_error(**extra: Any) -> ConfigError:
    """The error of the backend's own parse, which must be the loader's error too (what the class-level checks and
    the provider object are given)."""
    with pytest.raises(ConfigError) as e:
        AwsBackend.from_provider(provider(**extra), "c1")
    with pytest.raises(ConfigError) as e2:
        load_provider(provider(**extra))
    assert (e2.value.key, str(e2.value)) == (e.value.key, str(e.value))
    return e.value


def test_backend_declares_every_key_it_reads() -> None:
    assert AwsBackend.settings_model is AwsSettings
    assert declared_keys(AwsSettings) == {
        "region", "image_id", "subnets", "endpoint_url", "aws_credentials", "aws_max_attempts", "aws_retry_mode",
        "aws_retry_base_delay_s", "aws_describe_page_size", "aws_settle_wait_s", "availability_zone",
        "cache_stopped_nodes"}


def test_defaults() -> None:
    s = parse_section(AwsSettings, provider(), "provider")
    assert (s.aws_max_attempts, s.aws_retry_mode, s.aws_retry_base_delay_s, s.aws_describe_page_size) == (
        DEFAULT_MAX_ATTEMPTS, "standard", DEFAULT_RETRY_BASE_DELAY_S, MAX_DESCRIBE_PAGE_SIZE)
    assert s.aws_settle_wait_s == DEFAULT_SETTLE_WAIT_S
    assert s.image_id is None and s.subnets is None and s.endpoint_url is None and s.session_kwargs() == {}


@pytest.mark.parametrize("extra, key, words", [
    ({"aws_max_attempts": "five"}, "provider.aws_max_attempts", "must be an integer"),
    ({"aws_max_attempts": 0}, "provider.aws_max_attempts", ">= 1"),
    ({"aws_max_attempts": 2.0}, "provider.aws_max_attempts", "must be an integer"),
    ({"aws_retry_mode": "fast"}, "provider.aws_retry_mode", "'standard', 'adaptive' or 'legacy'"),
    ({"aws_retry_base_delay_s": -1}, "provider.aws_retry_base_delay_s", ">= 0"),
    ({"aws_retry_base_delay_s": float("nan")}, "provider.aws_retry_base_delay_s", "finite"),
    ({"aws_describe_page_size": 4}, "provider.aws_describe_page_size", ">= 5"),
    ({"aws_settle_wait_s": -1}, "provider.aws_settle_wait_s", ">= 0"),
    ({"aws_settle_wait_s": "soon"}, "provider.aws_settle_wait_s", "number"),
    ({"aws_describe_page_size": 1001}, "provider.aws_describe_page_size", "<= 1000"),
    ({"aws_credentials": "x"}, "provider.aws_credentials", "must be a mapping"),
    ({"aws_credentials": ["x"]}, "provider.aws_credentials", "must be a mapping"),
    ({"aws_credentials": {"aws_access_key_id": 5}}, "provider.aws_credentials.aws_access_key_id", "string"),
    ({"aws_credentials": {"region_name": REGION}}, "provider.aws_credentials.region_name", ""),
    ({"subnets": "subnet-1"}, "provider.subnets", "must be a mapping"),
    ({"subnets": {"us-east-1a": 7}}, "provider.subnets.us-east-1a", "must be a string"),
    ({"image_id": ""}, "provider.image_id", "must not be empty"),
    ({"image_id": 5}, "provider.image_id", "must be a string"),
    ({"endpoint_url": True}, "provider.endpoint_url", "must be a string"),
])
def test_bad_values_name_the_key(extra: dict[str, Any], key: str, words: str) -> None:
    e = config_error(**extra)
    assert e.key == key and words in str(e)


def test_region_is_required() -> None:
    with pytest.raises(ConfigError) as e:
        AwsBackend.from_provider({"cloud": "aws"}, "c1")
    assert e.value.key == "provider.region"


def test_secrets_never_reach_an_error_or_a_repr() -> None:
    # A misspelt key: rejected by name, its value (likely the secret) not quoted.
    e = config_error(aws_credentials={"aws_access_key_id": "AKIDEXAMPLE", "aws_secret_acces_key": SECRET})
    assert e.key == "provider.aws_credentials.aws_secret_acces_key" and SECRET not in str(e)
    s = parse_section(AwsSettings, provider(aws_credentials={"aws_access_key_id": "AKIDEXAMPLE",
                                                             "aws_secret_access_key": SECRET,
                                                             "aws_session_token": SECRET}), "provider")
    assert SECRET not in repr(s) and SECRET not in str(s)
    assert s.session_kwargs() == {"aws_access_key_id": "AKIDEXAMPLE", "aws_secret_access_key": SECRET,
                                  "aws_session_token": SECRET}


def test_unknown_profile_is_a_config_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "config"
    config.write_text("[profile ml]\nregion = us-east-1\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    AwsBackend.from_provider(provider(aws_credentials={"profile_name": "ml"}), "c1").close()
    with pytest.raises(ConfigError) as e:
        AwsBackend.from_provider(provider(aws_credentials={"profile_name": "nope"}), "c1")
    assert e.value.key == "provider.aws_credentials.profile_name" and "nope" in str(e.value)


def test_launch_layer_accepts_every_aws_key_and_names_a_misspelt_one() -> None:
    full = provider(image_id="ami-1", subnets={"us-east-1a": "subnet-1"}, endpoint_url="http://127.0.0.1:9",
                    aws_credentials={"aws_access_key_id": "a", "aws_secret_access_key": "b",
                                     "aws_session_token": "c", "aws_account_id": "123456789012"},
                    aws_max_attempts=3, aws_retry_mode="adaptive", aws_retry_base_delay_s=0,
                    aws_describe_page_size=50)
    bundle = load_provider(full)
    assert bundle.backend_class() is AwsBackend and bundle.core.region == REGION
    assert isinstance(bundle.backend_settings, AwsSettings) and bundle.backend_settings.aws_describe_page_size == 50
    with pytest.raises(ConfigError) as e:
        load_provider({**full, "aws_max_attempt": 3})
    assert e.value.key == "provider.aws_max_attempt" and "aws_max_attempts" in str(e.value)
    with pytest.raises(ConfigError) as e:
        load_provider({**full, "aws_max_attempts": "five"})
    assert e.value.key == "provider.aws_max_attempts"


# ------------------------------------------------------------------------------ Ray's keys: the swap-in mapping

NC_KEY = "available_node_types.w.node_config"


def overrides(node_config: dict[str, Any], **extra: Any) -> dict[str, Any]:
    settings = parse_section(AwsSettings, provider(**extra), "provider")
    AwsBackend.check_node_config(settings, "w", {"ImageId": "ami-1", **node_config}, NC_KEY)
    return AwsBackend.requirement_overrides(settings, node_config)


def node_config_error(node_config: dict[str, Any], **extra: Any) -> ConfigError:
    with pytest.raises(ConfigError) as e:
        AwsBackend.check_node_config(parse_section(AwsSettings, provider(**extra), "provider"), "w",
                                     {"ImageId": "ami-1", **node_config}, NC_KEY)
    return e.value


def test_rays_spot_market_option_pins_spot_capacity() -> None:
    assert overrides({"InstanceType": "m5.large", "InstanceMarketOptions": {"MarketType": "spot"}}) == {
        "instance_types": ["m5.large"], "capacity": ["spot"]}
    assert overrides({"InstanceMarketOptions": {"MarketType": "spot", "SpotOptions": {
        "MaxPrice": "0.05", "SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"}}}) == {
        "capacity": ["spot"], "max_hourly_price": 0.05}


@pytest.mark.parametrize("market, key", [
    ({"MarketType": "capacity-block"}, "InstanceMarketOptions.MarketType"),
    ({"SpotOptions": {"MaxPrice": "1"}}, "InstanceMarketOptions.MarketType"),
    ({"MarketType": "spot", "SpotOptions": {"SpotInstanceType": "persistent"}},
     "InstanceMarketOptions.SpotOptions.SpotInstanceType"),
    ({"MarketType": "spot", "SpotOptions": {"InstanceInterruptionBehavior": "stop"}},
     "InstanceMarketOptions.SpotOptions.InstanceInterruptionBehavior"),
    ({"MarketType": "spot", "SpotOptions": {"BlockDurationMinutes": 60}},
     "InstanceMarketOptions.SpotOptions.BlockDurationMinutes"),
    ({"MarketType": "spot", "SpotOptions": {"MaxPrice": "cheap"}}, "InstanceMarketOptions.SpotOptions.MaxPrice"),
    ({"MarketType": "spot", "SpotOption": {}}, "InstanceMarketOptions.SpotOption"),
    ("spot", "InstanceMarketOptions"),
])
def test_market_options_that_cannot_be_honoured_name_the_key(market: Any, key: str) -> None:
    assert node_config_error({"InstanceMarketOptions": market}).key == f"{NC_KEY}.{key}"


def test_availability_zone_limits_the_zones() -> None:
    assert overrides({}, availability_zone="us-east-1b, us-east-1a") == {"zones": ["us-east-1a", "us-east-1b"]}
    assert overrides({"Placement": {"AvailabilityZone": "us-east-1b", "Tenancy": "default"}},
                     availability_zone="us-east-1a,us-east-1b") == {"zones": ["us-east-1b"]}
    assert overrides({}, availability_zone="us-east-1a,us-east-1b", subnets={"us-east-1b": "subnet-1",
                                                                            "us-east-1c": "subnet-2"}) == {
        "zones": ["us-east-1b"]}
    e = config_error(availability_zone="us-west-2a")
    assert e.key == "provider.availability_zone" and "not a zone of region 'us-east-1'" in str(e)
    e = node_config_error({}, availability_zone="us-east-1a", subnets={"us-east-1c": "subnet-2"})
    assert e.key == "provider.availability_zone" and "no zone in common" in str(e)
    e = node_config_error({"Placement": {"AvailabilityZone": "us-east-1c"}}, availability_zone="us-east-1a")
    assert e.key == f"{NC_KEY}.Placement.AvailabilityZone"
    assert node_config_error({"Placement": {"AvailabilityZoneId": "use1-az1"}}).key == (
        f"{NC_KEY}.Placement.AvailabilityZoneId")
    assert node_config_error({"Placement": {"AvailabilityZone": "eu-west-1a"}}).key == (
        f"{NC_KEY}.Placement.AvailabilityZone")


def test_cache_stopped_nodes_true_cannot_be_honoured() -> None:
    e = config_error(cache_stopped_nodes=True)
    assert e.key == "provider.cache_stopped_nodes" and "never reuses stopped" in str(e)
    AwsBackend.from_provider(provider(cache_stopped_nodes=False), "c1").close()
    load_provider(provider(cache_stopped_nodes=False, availability_zone="us-east-1a"))


def test_a_hand_swapped_ray_yaml_plans_what_ray_would_launch() -> None:
    """Ray's example-full with only the provider block swapped by hand: the worker is planned on spot, in the
    listed zones, as the pinned type."""
    import yaml

    from ray_nodeless.operate.config import check_cluster
    from tests.swapin.helpers import example

    cfg = yaml.safe_load(example("aws-example-full.yaml").read_text())
    cfg["provider"] = {"type": "external", "module": "ray_nodeless.NodelessProvider", "cloud": "aws",
                       "region": "us-west-2", "availability_zone": "us-west-2a,us-west-2b"}
    cp = check_cluster(cfg)
    worker, head = cp.plans["ray.worker.default"], cp.plans["ray.head.default"]
    assert {(o.instance_type.name, o.capacity) for o in worker.candidates()} == {("m5.large", "spot")}
    assert {(o.instance_type.name, o.capacity) for o in head.candidates()} == {("m5.large", "on-demand")}
    assert {o.zone for o in worker.candidates()} == {"us-west-2a", "us-west-2b"}
    cfg["provider"]["cache_stopped_nodes"] = True
    with pytest.raises(ConfigError) as e:
        check_cluster(cfg)
    assert e.value.key == "provider.cache_stopped_nodes"


def test_pinned_spot_is_launched_as_spot() -> None:
    """launch_params builds InstanceMarketOptions from the offering's capacity: the pinned spot capacity (and
    Ray's MaxPrice) reach RunInstances."""
    from ray_nodeless.core.catalog import embedded
    from ray_nodeless.providers.aws.launch_params import run_instances_params
    from ray_nodeless.providers.base import LaunchSpec

    cat = embedded()
    o = cat.region("aws", "us-west-2").find("m5.large", "us-west-2a", "spot")
    nc = {"ImageId": "ami-1", "InstanceType": "m5.large",
          "InstanceMarketOptions": {"MarketType": "spot", "SpotOptions": {"MaxPrice": "0.05"}}}
    spec = LaunchSpec(cluster_name="c", node_type="w", offering=o, count=1, tags={}, node_config=nc,
                      request_token="t")
    params = run_instances_params(spec, {}, None, lambda zone, subnets: None)
    assert params["InstanceMarketOptions"] == {"MarketType": "spot", "SpotOptions": {
        "SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate", "MaxPrice": "0.05"}}
    assert params["InstanceType"] == "m5.large"


@pytest.mark.parametrize("url", ["not a url", "127.0.0.1:5000", "ftp://host", "http://"])
def test_an_endpoint_url_that_is_not_an_http_url_is_named(url: str) -> None:
    e = config_error(endpoint_url=url)
    assert e.key == "provider.endpoint_url" and "must be an http(s) URL with a host" in str(e)


def test_an_empty_subnet_list_is_named_not_taken_for_any_subnet() -> None:
    e = node_config_error({"SubnetIds": []})
    assert e.key == f"{NC_KEY}.SubnetIds" and "is empty" in str(e)
