"""The boto3 session (one botocore data loader per process) and the live catalog's clients. Imports no AwsSettings:
`AwsConfig.live_catalog` (settings.py) -> catalog.py -> here must not lead back to settings.py."""
from __future__ import annotations

import threading
from typing import Any

import boto3
import botocore.exceptions
import botocore.loaders
import botocore.session
from botocore.client import BaseClient
from botocore.config import Config

from ray_nodeless.errors import ConfigError

# The Pricing API is served from us-east-1 (and ap-south-1, eu-central-1), whatever region is priced.
PRICING_REGION = "us-east-1"
# Live catalog calls: a few attempts and generous timeouts (large paginated reads); a failure falls back anyway.
CATALOG_MAX_ATTEMPTS = 4
CATALOG_CONNECT_TIMEOUT_S = 10
CATALOG_READ_TIMEOUT_S = 60


_loader: botocore.loaders.Loader | None = None
_loader_lock = threading.Lock()


def _shared_loader() -> botocore.loaders.Loader:
    """One botocore data loader per process. Each session would otherwise parse the EC2 service model (megabytes
    of JSON) again: about 0.3 s per client, paid by every provider object (a monitor restart, each CLI call)."""
    global _loader
    with _loader_lock:
        if _loader is None:
            _loader = botocore.loaders.create_loader()
        return _loader


def session(session_kwargs: dict[str, Any] | None = None) -> boto3.session.Session:
    """A boto3 session with these `boto3.session.Session` arguments (provider.aws_credentials)."""
    kwargs = dict(session_kwargs or {})
    shared = kwargs.get("botocore_session") is None     # a session given by the caller is used as it is
    if shared:
        kwargs["botocore_session"] = botocore.session.Session()
        kwargs["botocore_session"].register_component("data_loader", _shared_loader())
    try:
        s = boto3.session.Session(**kwargs)
        if shared:
            kwargs["botocore_session"].get_scoped_config()     # an unknown profile fails here, as without the loader
            loader = _shared_loader()
            with _loader_lock:      # boto3 appends its data path to the loader of every session: keep it once
                loader.search_paths[:] = list(dict.fromkeys(loader.search_paths))
        return s
    except botocore.exceptions.ProfileNotFound as e:
        raise ConfigError("provider.aws_credentials.profile_name", str(e)) from None


def catalog_clients(region: str, session_kwargs: dict[str, Any] | None, endpoint_url: str | None,
                    pricing_endpoint_url: str | None) -> tuple[BaseClient, BaseClient]:
    """(EC2 client of `region`, Pricing client) for the live catalog refresh."""
    s = session(session_kwargs)
    cfg = Config(retries={"mode": "standard", "total_max_attempts": CATALOG_MAX_ATTEMPTS},
                 connect_timeout=CATALOG_CONNECT_TIMEOUT_S, read_timeout=CATALOG_READ_TIMEOUT_S)
    ec2_kw: dict[str, Any] = {"region_name": region, "config": cfg}
    if endpoint_url:
        ec2_kw["endpoint_url"] = endpoint_url
    pricing_kw: dict[str, Any] = {"region_name": PRICING_REGION, "config": cfg}
    if pricing_endpoint_url or endpoint_url:
        pricing_kw["endpoint_url"] = pricing_endpoint_url or endpoint_url
    return s.client("ec2", **ec2_kw), s.client("pricing", **pricing_kw)
