"""The google-cloud-compute clients, built from the provider block (REST transport, `api_endpoint`, `credentials`).

Operations are polled with our own `ZoneOperationsClient` built with the same options. The ExtendedOperation that
`InstancesClient.insert()` returns polls through a client of its own that does not inherit `api_endpoint`, so it
would poll the real Compute API while the instance was created elsewhere (a fake server, a private endpoint). The
backend therefore calls the `*_unary` methods and waits with `ZoneOperationsClient.wait` (see operations.py).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from ray_nodeless.errors import ConfigError
from ray_nodeless.providers.gcp.settings import ANONYMOUS, GcpSettings

logger = logging.getLogger(__name__)


def compute_client_kwargs(api_endpoint: str | None, credentials: Any) -> dict[str, Any]:
    """Keyword arguments for any `compute_v1.*Client`: REST transport, the endpoint, the credentials
    (`"anonymous"`, a google.auth Credentials object, or None for google.auth.default())."""
    from google.api_core.client_options import ClientOptions

    kwargs: dict[str, Any] = {"transport": "rest"}
    if api_endpoint:
        kwargs["client_options"] = ClientOptions(api_endpoint=api_endpoint)
    if credentials == ANONYMOUS:
        from google.auth.credentials import AnonymousCredentials

        kwargs["credentials"] = AnonymousCredentials()
    elif credentials is not None and not isinstance(credentials, str):
        kwargs["credentials"] = credentials
    return kwargs


@dataclass
class ComputeClients:
    """The two clients the backend calls: instances, and the zone operations their mutations return."""

    instances: Any              # compute_v1.InstancesClient
    zone_operations: Any        # compute_v1.ZoneOperationsClient
    reservations: Any = None    # compute_v1.ReservationsClient (capacity `reserved`)

    @classmethod
    def connect(cls, settings: GcpSettings) -> "ComputeClients":
        from google.auth.exceptions import DefaultCredentialsError
        from google.cloud import compute_v1

        kwargs = compute_client_kwargs(settings.api_endpoint, settings.client_credentials())
        try:
            return cls(compute_v1.InstancesClient(**kwargs), compute_v1.ZoneOperationsClient(**kwargs),
                       compute_v1.ReservationsClient(**kwargs))
        except DefaultCredentialsError as e:
            # Without a credentials key the clients take google.auth.default(): say which identity was expected
            # (before any call is made, so nothing is launched) rather than google-auth's generic text alone.
            raise ConfigError("provider.credentials", "not set, and google.auth found no Application Default "
                              "Credentials (on GKE: Workload Identity for the pod's ServiceAccount; elsewhere "
                              f"GOOGLE_APPLICATION_CREDENTIALS or the metadata server): {e}") from e

    def close(self) -> None:
        for c in (self.instances, self.zone_operations, self.reservations):
            if c is None:
                continue
            try:
                c.transport.close()
            except Exception:  # noqa: BLE001 - closing is best effort
                logger.debug("closing a compute client failed", exc_info=True)
