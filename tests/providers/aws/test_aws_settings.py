"""AwsSettings: every provider-block key of the AWS backend is declared, and a wrong value is a ConfigError naming
the key, raised before any client exists (so `ray up` and `ray-nodeless plan` stop on it too)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ray_nodeless.core.schema import declared_keys, parse_section
from ray_nodeless.errors import ConfigError
from ray_nodeless.launch.config import load_provider
from ray_nodeless.providers.aws.backend import AwsBackend
from ray_nodeless.providers.aws.settings import (
    DEFAULT_MAX_ATTEMPTS, DEFAULT_RETRY_BASE_DELAY_S, MAX_DESCRIBE_PAGE_SIZE, AwsSettings,
)

REGION = "us-east-1"
SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"


def provider(**extra: Any) -> dict[str, Any]:
    return {"cloud": "aws", "region": REGION, **extra}


def config_error(**extra: Any) -> ConfigError:
    """The error of the backend's own parse, which must be the class-level checks' error too."""
    with pytest.raises(ConfigError) as e:
        AwsBackend(provider(**extra), "c1")
    with pytest.raises(ConfigError) as e2:
        AwsBackend.check_node_config(provider(**extra), "cpu", {"ImageId": "ami-1"}, "available_node_types.cpu")
    assert (e2.value.key, str(e2.value)) == (e.value.key, str(e.value))
    return e.value


def test_backend_declares_every_key_it_reads() -> None:
    assert AwsBackend.settings_model is AwsSettings
    assert declared_keys(AwsSettings) == {
        "region", "image_id", "subnets", "endpoint_url", "aws_credentials", "aws_max_attempts", "aws_retry_mode",
        "aws_retry_base_delay_s", "aws_describe_page_size"}


def test_defaults() -> None:
    s = parse_section(AwsSettings, provider(), "provider")
    assert (s.aws_max_attempts, s.aws_retry_mode, s.aws_retry_base_delay_s, s.aws_describe_page_size) == (
        DEFAULT_MAX_ATTEMPTS, "standard", DEFAULT_RETRY_BASE_DELAY_S, MAX_DESCRIBE_PAGE_SIZE)
    assert s.image_id is None and s.subnets is None and s.endpoint_url is None and s.session_kwargs() == {}


@pytest.mark.parametrize("extra, key, words", [
    ({"aws_max_attempts": "five"}, "provider.aws_max_attempts", "must be an integer"),
    ({"aws_max_attempts": 0}, "provider.aws_max_attempts", ">= 1"),
    ({"aws_max_attempts": 2.0}, "provider.aws_max_attempts", "must be an integer"),
    ({"aws_retry_mode": "fast"}, "provider.aws_retry_mode", "'standard', 'adaptive' or 'legacy'"),
    ({"aws_retry_base_delay_s": -1}, "provider.aws_retry_base_delay_s", ">= 0"),
    ({"aws_retry_base_delay_s": float("nan")}, "provider.aws_retry_base_delay_s", "finite"),
    ({"aws_describe_page_size": 4}, "provider.aws_describe_page_size", ">= 5"),
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
        AwsBackend({"cloud": "aws"}, "c1")
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
    AwsBackend(provider(aws_credentials={"profile_name": "ml"}), "c1").close()
    with pytest.raises(ConfigError) as e:
        AwsBackend(provider(aws_credentials={"profile_name": "nope"}), "c1")
    assert e.value.key == "provider.aws_credentials.profile_name" and "nope" in str(e.value)


def test_launch_layer_accepts_every_aws_key_and_names_a_misspelt_one() -> None:
    full = provider(image_id="ami-1", subnets={"us-east-1a": "subnet-1"}, endpoint_url="http://127.0.0.1:9",
                    aws_credentials={"aws_access_key_id": "a", "aws_secret_access_key": "b",
                                     "aws_session_token": "c", "aws_account_id": "123456789012"},
                    aws_max_attempts=3, aws_retry_mode="adaptive", aws_retry_base_delay_s=0,
                    aws_describe_page_size=50)
    settings, cls = load_provider(full)
    assert cls is AwsBackend and settings.region == REGION
    with pytest.raises(ConfigError) as e:
        load_provider({**full, "aws_max_attempt": 3})
    assert e.value.key == "provider.aws_max_attempt" and "aws_max_attempts" in str(e.value)
    with pytest.raises(ConfigError) as e:
        load_provider({**full, "aws_max_attempts": "five"})
    assert e.value.key == "provider.aws_max_attempts"
