"""The bridge's cloud credentials are the pod's identity, through the SDK's default chain: a RayCluster annotation
without keys gives a provider block without keys, and its AWS backend reaches EC2 (moto) with the environment's
credentials: static keys, and IRSA's web identity (AWS_ROLE_ARN + AWS_WEB_IDENTITY_TOKEN_FILE, exchanged at STS, moto
here); with none of them it fails naming no key of ours (nothing is read from the RayCluster)."""
from __future__ import annotations

import pytest

from ray_nodeless.launch.config import load_provider
from ray_nodeless.ray_adapter import kuberay as K
from ray_nodeless.ray_adapter.compat.kuberay import derive_config
from tests.ray_adapter.test_kuberay_config import sample_cluster


def _provider(moto) -> dict:
    rc = sample_cluster({"cloud": "aws", "region": "us-east-1", "endpoint_url": moto.url, "image_id": moto.ami(),
                         "kubernetes": {"join": {"method": "eks", "cluster": "c", "endpoint": "https://127.0.0.1:1",
                                                 "ca": "Y2E=", "cidr": "10.100.0.0/16"}}})
    p = K.bridge_config(rc, derive_config(rc))["provider"]
    p.pop("kuberay")
    assert "aws_credentials" not in p
    return p


def _list(provider: dict) -> list:
    backend = load_provider(provider).make_backend("kuberay-creds")
    try:
        return backend.list_machines()
    finally:
        backend.close()


def _no_ambient(monkeypatch, tmp_path) -> None:
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


def test_environment_keys_reach_ec2(moto):
    assert _list(_provider(moto)) == []        # moto's EC2 answered with the environment's keys


def test_irsa_web_identity_reaches_ec2(moto, monkeypatch, tmp_path):
    _no_ambient(monkeypatch, tmp_path)
    token = tmp_path / "token"
    token.write_text("eyJhbGciOiJSUzI1NiJ9.e30.sig")      # what EKS projects into the pod
    monkeypatch.setenv("AWS_ROLE_ARN", "arn:aws:iam::123456789012:role/ray-nodeless-head")
    monkeypatch.setenv("AWS_WEB_IDENTITY_TOKEN_FILE", str(token))
    monkeypatch.setenv("AWS_ENDPOINT_URL_STS", moto.url)
    assert _list(_provider(moto)) == []


def test_without_any_identity_it_fails(moto, monkeypatch, tmp_path):
    _no_ambient(monkeypatch, tmp_path)
    with pytest.raises(Exception, match="(?i)credential"):
        _list(_provider(moto))
