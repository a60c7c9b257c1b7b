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
        GcpBackend({**BASE, key: value}, "c")          # fails before building a client
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
    """The launch layer rejects keys no section declares: every key the backend reads must be declared."""
    from ray_nodeless.launch.config import load_provider

    full = {**BASE, "api_endpoint": "http://127.0.0.1:1", "credentials": "anonymous", "image": "projects/x/y",
            "network": "global/networks/n", "disk_size_gb": 100, "operation_timeout_s": 60, "call_timeout_s": 10,
            "max_attempts": 3, "retry_base_s": 0.1, "retry_max_s": 2, "poll_interval_s": 0.5}
    assert set(full) - {"cloud"} <= declared_keys(GcpSettings)
    _, cls = load_provider(full)
    assert cls is GcpBackend and cls.settings_model is GcpSettings
    with pytest.raises(ConfigError) as ei:
        load_provider({**BASE, "disk_size_gbs": 100})
    assert ei.value.key == "provider.disk_size_gbs" and "disk_size_gb" in str(ei.value)
