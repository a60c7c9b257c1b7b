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
      call_timeout_s: 60           # one API call, its retries included
      max_attempts: 6              # attempts per call when GCE throttles or answers 5xx
      retry_base_s: 0.5            # first backoff (full jitter, doubling) ...
      retry_max_s: 16              # ... and its cap
      operation_timeout_s: 300     # how long a launch or terminate waits for its zone operations
      poll_interval_s: 1           # the longest pause between two polls of an operation
"""
from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator
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
