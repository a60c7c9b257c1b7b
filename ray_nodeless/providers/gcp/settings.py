"""The provider-block keys of the gcp backend, declared once (see core/schema.py).

    provider:
      cloud: gcp
      region: us-central1
      project_id: my-project       # required
      image: projects/debian-cloud/global/images/family/debian-12
      network: global/networks/default
      disk_size_gb: 50             # the default boot disk (when node_config has no `disks`)
      api_endpoint: ...            # another Compute endpoint (a fake server in tests)
      credentials: anonymous       # omit for Application Default Credentials
      gcp_credentials:             # Ray's key, with Ray's meaning (instead of `credentials`):
        type: service_account      #   service_account: `credentials` is the key file's JSON (a string, as in Ray)
        credentials: '{"type": "service_account", ...}'   # credentials_token: an OAuth2 access token
      cache_stopped_nodes: false   # Ray's key: only false can be honoured (VMs are deleted, never stopped)
      call_timeout_s: 60           # one API call, its retries included
      max_attempts: 6              # attempts per call when GCE throttles or answers 5xx
      retry_base_s: 0.5            # first backoff (full jitter, doubling) ...
      retry_max_s: 16              # ... and its cap
      operation_timeout_s: 300     # how long a launch or terminate waits for its zone operations
      poll_interval_s: 1           # the longest pause between two polls of an operation
"""
from __future__ import annotations

import json
from typing import Any, Literal, Mapping

from pydantic import Field, SecretStr, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

from ray_nodeless.core.schema import Section

DEFAULT_IMAGE = "projects/debian-cloud/global/images/family/debian-12"
DEFAULT_NETWORK = "global/networks/default"
ANONYMOUS = "anonymous"

# Default boot disk size: room for Ray, a Python environment and a few wheels on top of a 10 GB public image.
DEFAULT_DISK_SIZE_GB = 50
# GCE's smallest pd-balanced disk (and the size of the public images): a smaller default disk cannot be created.
MIN_DISK_SIZE_GB = 10
# GCE's largest persistent disk.
MAX_DISK_SIZE_GB = 65_536
# Zone operations of an insert usually finish in 10-60 s; 5 minutes covers a slow GPU host without letting a
# stuck operation hold a launch thread of the autoscaler for long.
OPERATION_TIMEOUT_S = 300.0
# One Compute API call with its retries: long enough for a slow aggregatedList page plus the backoff below,
# short enough that a hung connection fails the autoscaler update instead of stalling it.
CALL_TIMEOUT_S = 60.0
# Attempts per call under throttling/5xx: with the backoff below, about 15 s of waiting in the worst case.
MAX_ATTEMPTS = 6
# First retry pause (full jitter: uniform in [0, pause]), doubled per attempt up to RETRY_MAX_S; GCE asks clients
# to back off exponentially from about half a second.
RETRY_BASE_S = 0.5
RETRY_MAX_S = 16.0
# The longest pause between two polls of a zone operation. GCE's operations.wait blocks server-side until the
# operation is done (up to about 2 minutes), so this only paces a server that answers at once.
POLL_INTERVAL_S = 1.0


# Keys google.oauth2.service_account.Credentials.from_service_account_info needs in a service account key.
SERVICE_ACCOUNT_KEYS = ("client_email", "private_key", "token_uri")


class GcpCredentials(Section):
    """Ray's `provider.gcp_credentials` (ray.autoscaler._private.gcp.config.construct_clients_from_provider_config):
    `type: service_account` with the key file's JSON as a string in `credentials`, or `type: credentials_token`
    with an OAuth2 access token. Checked here, without google.auth; built into credentials only for a client."""

    model_config = Section.model_config | {"extra": "forbid"}

    type: Literal["service_account", "credentials_token"]
    credentials: SecretStr            # never in a repr, a log line or a traceback

    @model_validator(mode="before")
    @classmethod
    def _mapping(cls, data: Any) -> Any:
        if not isinstance(data, Mapping):
            raise PydanticCustomError("dict_type", "must be a mapping ({type: service_account|credentials_token, "
                                                   "credentials: ...})")
        # A misspelt key may hold the secret, and errors quote the value they reject.
        return {k: (v if k in cls.model_fields else "<hidden>") for k, v in data.items()}

    @field_validator("credentials")
    @classmethod
    def _usable(cls, value: SecretStr, info: ValidationInfo) -> SecretStr:
        if info.data.get("type") == "service_account":
            service_account_info(value.get_secret_value())     # raises with the reason
        elif not value.get_secret_value().strip():
            raise PydanticCustomError("credentials", "an empty access token")
        return value

    def build(self) -> Any:
        """google.auth credentials, as Ray builds them from this key."""
        secret = self.credentials.get_secret_value()
        if self.type == "service_account":
            from google.oauth2 import service_account

            return service_account.Credentials.from_service_account_info(service_account_info(secret))
        from google.oauth2.credentials import Credentials as OAuthCredentials

        return OAuthCredentials(secret)


class _Secret(str):
    """A string value whose repr hides it (pydantic quotes rejected values in errors)."""

    def __repr__(self) -> str:
        return "'<hidden>'"


def hide_gcp_credentials(provider: Any) -> Any:
    """`provider` with `gcp_credentials.credentials` wrapped so that no error message can quote it."""
    gc = provider.get("gcp_credentials") if isinstance(provider, Mapping) else None
    if not isinstance(gc, Mapping) or not isinstance(gc.get("credentials"), str):
        return provider
    return {**provider, "gcp_credentials": {**gc, "credentials": _Secret(gc["credentials"])}}


def service_account_info(text: str) -> dict[str, Any]:
    """The service account key of `gcp_credentials.credentials` (its JSON, as Ray parses it); a
    PydanticCustomError naming what is wrong, never quoting the key."""
    try:
        info = json.loads(text)
    except ValueError:
        raise PydanticCustomError("credentials", "not JSON: for type service_account it is the service account key "
                                                 "file's contents, as a string (as in Ray)") from None
    if not isinstance(info, dict):
        raise PydanticCustomError("credentials", "the service account key must be a JSON object")
    missing = [k for k in SERVICE_ACCOUNT_KEYS if not info.get(k)]
    if missing:
        raise PydanticCustomError("credentials", "the service account key lacks {missing}",
                                  {"missing": ", ".join(missing)})
    return info


class GcpSettings(Section):
    """The gcp backend's provider-block keys (the core's `region` too: the backend reads it)."""

    project_id: str = Field(min_length=1)
    region: str = Field(min_length=1)
    api_endpoint: str | None = Field(None, min_length=1)
    # "anonymous", a google.auth Credentials object (when built from Python), or None for google.auth.default().
    credentials: Any = None
    image: str = Field(DEFAULT_IMAGE, min_length=1)
    network: str = Field(DEFAULT_NETWORK, min_length=1)
    disk_size_gb: int = Field(DEFAULT_DISK_SIZE_GB, ge=MIN_DISK_SIZE_GB, le=MAX_DISK_SIZE_GB)
    operation_timeout_s: float = Field(OPERATION_TIMEOUT_S, gt=0)
    call_timeout_s: float = Field(CALL_TIMEOUT_S, gt=0)
    max_attempts: int = Field(MAX_ATTEMPTS, ge=1)
    retry_base_s: float = Field(RETRY_BASE_S, gt=0)
    retry_max_s: float = Field(RETRY_MAX_S, gt=0)
    poll_interval_s: float = Field(POLL_INTERVAL_S, gt=0)
    # Ray's keys, with Ray's meaning.
    availability_zone: Any = None      # "us-west1-b" or a comma-separated list; node_config.availability_zones
    gcp_credentials: GcpCredentials | None = None
    cache_stopped_nodes: bool | None = None            # only `false` can be honoured

    @field_validator("cache_stopped_nodes")
    @classmethod
    def _never_stopped(cls, value: bool | None) -> bool | None:
        if value:
            raise PydanticCustomError(
                "cache_stopped_nodes", "ray_nodeless deletes VMs on scale-down and never reuses stopped ones (a "
                                       "stopped VM keeps its machine type and zone, outside the plan); remove the "
                                       "key or set it to false")
        return value

    @model_validator(mode="before")
    @classmethod
    def _secrets_hidden(cls, data: Any) -> Any:
        return hide_gcp_credentials(data)

    @field_validator("gcp_credentials")
    @classmethod
    def _one_credentials_key(cls, value: GcpCredentials | None, info: ValidationInfo) -> GcpCredentials | None:
        if value is not None and info.data.get("credentials") is not None:
            raise PydanticCustomError("gcp_credentials", "set either `credentials` or Ray's `gcp_credentials`, "
                                                         "not both")
        return value

    def client_credentials(self) -> Any:
        """What the clients are built with: `credentials` ("anonymous", a Credentials object or None for
        Application Default Credentials), or the credentials Ray's `gcp_credentials` describes."""
        if self.gcp_credentials is not None:
            return self.gcp_credentials.build()
        return self.credentials

    @field_validator("credentials")
    @classmethod
    def _credentials(cls, value: Any) -> Any:
        if value is None or value == ANONYMOUS:
            return value
        if not isinstance(value, str):
            from google.auth.credentials import Credentials

            if isinstance(value, Credentials):
                return value
        raise PydanticCustomError(
            "credentials", "must be `anonymous` or a google.auth Credentials object (omit it to use "
                           "Application Default Credentials)")
