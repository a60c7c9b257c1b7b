"""Ray's GCP provider keys a hand-swapped YAML may carry in its provider block (issue 10): `gcp_credentials` is
declared, checked and used to build the clients, as Ray builds them; `cache_stopped_nodes: true` cannot be
honoured (VMs are deleted on scale-down, never stopped) and is an error naming it, as on AWS."""
from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from ray_nodeless.cli import main
from ray_nodeless.core.schema import parse_section
from ray_nodeless.errors import ConfigError
from ray_nodeless.operate.config import check_cluster, load_provider
from ray_nodeless.providers.gcp.backend import GcpBackend
from ray_nodeless.providers.gcp.clients import ComputeClients
from ray_nodeless.providers.gcp.settings import GcpSettings
from ray_nodeless.ray_adapter.provider import NodelessProvider
from ray_nodeless.testing.fake_gce import FakeGce
from tests import REPO_ROOT

REGION, PROJECT = "us-central1", "proj"
BASE = {"type": "external", "module": "ray_nodeless.NodelessProvider", "cloud": "gcp", "region": REGION,
        "project_id": PROJECT}
SECRET = "s3cr3t-token-value"


def service_account_key() -> str:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    pem = rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()).decode()
    return json.dumps({"type": "service_account", "project_id": PROJECT, "private_key_id": "k1",
                       "private_key": pem, "client_email": f"ray@{PROJECT}.iam.gserviceaccount.com",
                       "token_uri": "https://oauth2.googleapis.com/token"})


def cluster(**provider: Any) -> dict:
    cfg = yaml.safe_load((REPO_ROOT / "cluster-configs" / "gcp-gpu-head.yaml").read_text())
    cfg["provider"].update(provider)
    return cfg


# ------------------------------------------------------------------------------------------- cache_stopped_nodes


@pytest.mark.parametrize("how", ["settings", "plan", "bootstrap_config"])
def test_cache_stopped_nodes_true_is_an_error_naming_it_everywhere(how: str, tmp_path: Path) -> None:
    cfg = cluster(cache_stopped_nodes=True)
    if how == "settings":
        with pytest.raises(ConfigError) as e:
            load_provider(cfg["provider"])
        assert e.value.key == "provider.cache_stopped_nodes" and "never reuses stopped" in str(e.value)
    elif how == "plan":
        path = tmp_path / "c.yaml"
        path.write_text(yaml.safe_dump(cfg))
        r = CliRunner().invoke(main, ["plan", str(path)])
        assert r.exit_code == 2 and "provider.cache_stopped_nodes" in r.output, r.output
    else:
        with pytest.raises(ConfigError) as e:
            NodelessProvider.bootstrap_config(cfg)
        assert e.value.key == "provider.cache_stopped_nodes"


def test_cache_stopped_nodes_false_is_accepted_as_on_aws() -> None:
    assert check_cluster(cluster(cache_stopped_nodes=False)).plans


# ----------------------------------------------------------------------------------------------- gcp_credentials


@pytest.mark.parametrize("value,key,words", [
    ("a-token", "provider.gcp_credentials", "must be a mapping"),
    ({"credentials": SECRET}, "provider.gcp_credentials.type", "is required"),
    ({"type": "oauth", "credentials": SECRET}, "provider.gcp_credentials.type", "service_account"),
    ({"type": "credentials_token"}, "provider.gcp_credentials.credentials", "is required"),
    ({"type": "credentials_token", "credentials": ""}, "provider.gcp_credentials.credentials", "empty"),
    ({"type": "service_account", "credentials": SECRET}, "provider.gcp_credentials.credentials", "not JSON"),
    ({"type": "service_account", "credentials": json.dumps({"client_email": SECRET})},
     "provider.gcp_credentials.credentials", "lacks private_key, token_uri"),
    ({"type": "credentials_token", "credentials": SECRET, "token": SECRET}, "provider.gcp_credentials.token",
     "unknown key"),
])
def test_a_bad_gcp_credentials_is_an_error_naming_the_key_and_never_the_secret(value, key, words) -> None:
    with pytest.raises(ConfigError) as e:
        load_provider({**BASE, "gcp_credentials": value})
    assert e.value.key == key and words in str(e.value), str(e.value)
    assert SECRET not in str(e.value)


def test_gcp_credentials_beside_credentials_is_an_error() -> None:
    with pytest.raises(ConfigError) as e:
        load_provider({**BASE, "credentials": "anonymous",
                       "gcp_credentials": {"type": "credentials_token", "credentials": SECRET}})
    assert e.value.key == "provider.gcp_credentials" and "not both" in str(e.value)
    assert SECRET not in str(e.value)


def test_settings_never_show_the_secret() -> None:
    s = parse_section(GcpSettings, {**BASE, "gcp_credentials": {"type": "credentials_token", "credentials": SECRET}},
                      "provider")
    assert SECRET not in repr(s) and SECRET not in str(s)


def test_a_service_account_key_builds_service_account_credentials_as_ray_does() -> None:
    from google.oauth2 import service_account

    s = parse_section(GcpSettings, {**BASE, "gcp_credentials": {"type": "service_account",
                                                                "credentials": service_account_key()}}, "provider")
    creds = s.client_credentials()
    assert isinstance(creds, service_account.Credentials)
    assert creds.service_account_email == f"ray@{PROJECT}.iam.gserviceaccount.com"
    clients = ComputeClients.connect(s)
    try:
        assert clients.instances._transport._credentials is creds or \
            clients.instances._transport._credentials.service_account_email == creds.service_account_email
    finally:
        clients.close()


def test_a_credentials_token_drives_the_backend_against_the_fake_gce() -> None:
    """No Application Default Credentials exist here: the launch works only because the backend's clients carry
    the token of gcp_credentials (what Ray's OAuthCredentials(token) gives)."""
    from google.oauth2.credentials import Credentials

    from tests.providers.gcp.test_gcp_backend import spec

    with FakeGce(project=PROJECT) as fake:
        cfg = {**BASE, "api_endpoint": fake.url, "retry_base_s": 0.001, "retry_max_s": 0.01,
               "poll_interval_s": 0.01, "operation_timeout_s": 5,
               "gcp_credentials": {"type": "credentials_token", "credentials": SECRET}}
        b = GcpBackend.from_provider(copy.deepcopy(cfg), "c1")
        try:
            creds = b._clients.instances._transport._credentials
            assert isinstance(creds, Credentials) and creds.token == SECRET
            ids = b.launch(spec(cluster="c1"))
            assert [m.id for m in b.list_machines()] == ids
            b.terminate(ids)
        finally:
            b.close()


def test_plan_takes_gcp_credentials_without_importing_google_auth(tmp_path: Path) -> None:
    from tests.cli.test_plan_imports import forbidden, plan_modules

    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cluster(gcp_credentials={"type": "service_account",
                                                            "credentials": service_account_key()})))
    code, out, modules = plan_modules(str(path))
    assert code == 0, out
    assert forbidden(modules) == []


def test_convert_keeps_gcp_credentials_and_drops_cache_stopped_nodes_with_a_note(tmp_path: Path) -> None:
    from ray_nodeless.swapin.convert import convert_file
    from tests.swapin.helpers import example, quiet_ray

    quiet_ray()
    ray_yaml = yaml.safe_load(example("gcp-example-minimal.yaml").read_text())
    creds = {"type": "credentials_token", "credentials": SECRET}
    ray_yaml["provider"].update(project_id=PROJECT, gcp_credentials=creds, cache_stopped_nodes=True)
    path = tmp_path / "ray.yaml"
    path.write_text(yaml.safe_dump(ray_yaml))
    conv = convert_file(path)
    assert conv.config["provider"]["gcp_credentials"] == creds
    assert "cache_stopped_nodes" not in conv.config["provider"]
    assert any("cache_stopped_nodes" in n for n in conv.notes)
    assert SECRET not in "\n".join(conv.notes)
