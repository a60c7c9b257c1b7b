"""The bridge's cloud credentials are the pod's identity, through the SDK's default chain: a RayCluster annotation
without keys gives a provider block without keys, and its backend reaches the cloud with what the pod's environment
offers. AWS (moto's EC2): static keys; IRSA's web identity (AWS_ROLE_ARN + AWS_WEB_IDENTITY_TOKEN_FILE, exchanged at
moto's STS); EKS Pod Identity (botocore's container provider: AWS_CONTAINER_CREDENTIALS_FULL_URI +
AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE, served by testing/fake_metadata.py as EKS's agent does). GCP (testing/fake_gce):
GKE Workload Identity, i.e. google-auth's default chain asking the metadata server (testing/fake_metadata.py) for
a token, which the fake GCE must then receive as the bearer. With none of them it fails naming credentials, and
nothing is launched."""
from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from ray_nodeless.core.catalog import InstanceType, Offering
from ray_nodeless.errors import ConfigError
from ray_nodeless.operate.config import load_provider
from ray_nodeless.providers.base import TAG_CLUSTER, LaunchSpec
from ray_nodeless.kuberay import bridge as K
from ray_nodeless.ray_compat.kuberay import derive_config
from ray_nodeless.testing.fake_gce.server import FakeGce
from ray_nodeless.testing.fake_metadata import FakeMetadataServer
from tests.kuberay.test_kuberay_config import sample_cluster

GCP_PROJECT = "wi-project"
GCP_REGION = "us-central1"


def _provider(moto) -> dict:
    rc = sample_cluster({"cloud": "aws", "region": "us-east-1", "endpoint_url": moto.url, "image_id": moto.ami(),
                         "kubernetes": {"join": {"method": "eks", "cluster": "c", "endpoint": "https://127.0.0.1:1",
                                                 "ca": "Y2E=", "cidr": "10.100.0.0/16"}}})
    p = K.bridge_config(rc, derive_config(rc))["provider"]
    p.pop("kuberay")
    assert "aws_credentials" not in p
    return p


def _gcp_provider(fake: FakeGce) -> dict:
    rc = sample_cluster({"cloud": "gcp", "region": GCP_REGION, "project_id": GCP_PROJECT, "api_endpoint": fake.url,
                         "kubernetes": {"join": {"method": "kubeadm", "endpoint": "https://127.0.0.1:1",
                                                 "token": "abcdef.0123456789abcdef",
                                                 "ca_cert_hash": "sha256:" + "0" * 64}}})
    p = K.bridge_config(rc, derive_config(rc))["provider"]
    p.pop("kuberay")
    assert "credentials" not in p and "gcp_credentials" not in p
    return p


def _list(provider: dict) -> list:
    backend = load_provider(provider).make_backend("kuberay-creds")
    try:
        return backend.list_machines()
    finally:
        backend.close()


def _no_ambient(monkeypatch, tmp_path) -> None:
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
              "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
              "AWS_CONTAINER_AUTHORIZATION_TOKEN", "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


@pytest.fixture
def metadata() -> Iterator[FakeMetadataServer]:
    with FakeMetadataServer(gce_project=GCP_PROJECT) as m:
        yield m


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


def _pod_identity(monkeypatch, tmp_path, metadata: FakeMetadataServer, token: str) -> None:
    """The environment EKS gives a pod with a Pod Identity association (the agent's link-local address replaced
    by the fake's loopback one, which botocore allows as it allows 169.254.170.23)."""
    path = tmp_path / "eks-pod-identity-token"
    path.write_text(token)
    monkeypatch.setenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", metadata.url + "/v1/credentials")
    monkeypatch.setenv("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE", str(path))


def test_eks_pod_identity_reaches_ec2(moto, metadata, monkeypatch, tmp_path):
    _no_ambient(monkeypatch, tmp_path)
    _pod_identity(monkeypatch, tmp_path, metadata, metadata.state.eks_token)
    assert _list(_provider(moto)) == []
    # botocore fetched the role's keys from the agent, with the pod's token as the Authorization header
    assert metadata.state.authorizations and set(metadata.state.authorizations) == {metadata.state.eks_token}


def test_eks_pod_identity_with_a_wrong_token_fails(moto, metadata, monkeypatch, tmp_path):
    _no_ambient(monkeypatch, tmp_path)
    _pod_identity(monkeypatch, tmp_path, metadata, "not-the-pods-token")
    with pytest.raises(Exception, match="(?i)credential"):
        _list(_provider(moto))
    assert metadata.state.authorizations and "not-the-pods-token" in metadata.state.authorizations


def test_without_any_identity_it_fails(moto, monkeypatch, tmp_path):
    _no_ambient(monkeypatch, tmp_path)
    with pytest.raises(Exception, match="(?i)credential"):
        _list(_provider(moto))


# ----- GCP: GKE Workload Identity --------------------------------------------------------------------------------

def _no_google_ambient(monkeypatch, tmp_path, metadata_host: str) -> None:
    """No key file, no gcloud ADC; the metadata server at `metadata_host` (GKE's is metadata.google.internal /
    169.254.169.254). google-auth reads GCE_METADATA_HOST once, at import (compute_engine/_metadata.py), so its
    module-level copy is set too; GCE_METADATA_IP (the ping's address) it reads per call."""
    from google.auth.compute_engine import _metadata

    for k in ("GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_CLOUD_PROJECT", "GCLOUD_PROJECT", "NO_GCE_CHECK"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "gcloud"))     # no application_default_credentials.json
    monkeypatch.setenv("GCE_METADATA_HOST", metadata_host)
    monkeypatch.setenv("GCE_METADATA_IP", metadata_host)
    monkeypatch.setattr(_metadata, "_GCE_METADATA_HOST", metadata_host)
    # google-auth also takes a GCE VM's DMI product name as being on GCE: on such a CI runner the chain would
    # find the real metadata server's identity instead of none.
    monkeypatch.setattr(_metadata, "_GCE_PRODUCT_NAME_FILE", str(tmp_path / "no-dmi-product-name"))


def _launch(provider: dict) -> None:
    backend = load_provider(provider).make_backend("kuberay-creds")
    try:
        it = InstanceType(cloud="gcp", name="e2-standard-4", family="e2", vcpus=4, memory_gib=16,
                          machine_type="e2-standard-4")
        backend.launch(LaunchSpec(cluster_name="kuberay-creds", node_type="cpu-group",
                                  offering=Offering(it, GCP_REGION, "us-central1-a", "on-demand", 0.1), count=1,
                                  tags={TAG_CLUSTER: "kuberay-creds"}, node_config={},
                                  request_token=str(uuid.uuid4())))
    finally:
        backend.close()


def test_gke_workload_identity_reaches_gce(metadata, monkeypatch, tmp_path):
    _no_google_ambient(monkeypatch, tmp_path, metadata.host_port)
    with FakeGce(project=GCP_PROJECT) as fake:
        assert _list(_gcp_provider(fake)) == []
        calls = [r for r in fake.requests if r.method != "unknown"]
        assert calls and {r.authorization for r in calls} == {f"Bearer {metadata.state.gce_access_token}"}
    paths = {p for _, p in metadata.requests_seen()}
    assert any(p.startswith("/computeMetadata/v1/instance/service-accounts/default/token") for p in paths)


def test_gcp_without_identity_fails_and_launches_nothing(monkeypatch, tmp_path):
    with FakeMetadataServer() as gone:       # a port nothing listens on once stopped: no metadata server
        closed = gone.host_port
    _no_google_ambient(monkeypatch, tmp_path, closed)
    with FakeGce(project=GCP_PROJECT) as fake:
        with pytest.raises(ConfigError, match="provider.credentials: not set, and google.auth found no "
                                              "Application Default Credentials"):
            _launch(_gcp_provider(fake))
        assert fake.requests == []          # not one call reached the API: nothing launched
