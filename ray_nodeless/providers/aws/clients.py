"""The boto3 session and the botocore clients: the backend's two EC2 clients (the session and the live
catalog's clients: sessions.py).

Retries are botocore's own (`Config(retries=...)`), except for RunInstances: its client has retries switched off
and the backend re-issues it itself, after looking the request token up (see backend.py), because a botocore retry
after a lost response would create a second set of machines wherever ClientToken is not honoured (moto, proxies).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from botocore.client import BaseClient
from botocore.config import Config

from ray_nodeless.providers.aws.settings import AwsSettings
# The session and the live catalog's clients are in sessions.py (no AwsSettings there: AwsConfig's catalog hook
# reaches them without an import cycle); re-exported for this module's callers.
from ray_nodeless.providers.aws.sessions import (  # noqa: F401
    CATALOG_CONNECT_TIMEOUT_S, CATALOG_MAX_ATTEMPTS, CATALOG_READ_TIMEOUT_S, PRICING_REGION, catalog_clients, session,
)


@dataclass
class Ec2Clients:
    ec2: BaseClient         # every call but RunInstances: botocore retries throttling and 5xx (all are idempotent)
    launch: BaseClient      # RunInstances only: one attempt per call; the backend's loop does the retrying

    def close(self) -> None:
        for c in (self.ec2, self.launch):
            try:
                c.close()
            except Exception:  # noqa: BLE001 - closing is best effort
                pass


def ec2_clients(settings: AwsSettings) -> Ec2Clients:
    s = session(settings.session_kwargs())
    common: dict[str, Any] = {"region_name": settings.region}
    if settings.endpoint_url:           # unset: botocore honours AWS_ENDPOINT_URL itself
        common["endpoint_url"] = settings.endpoint_url

    def client(attempts: int) -> BaseClient:
        # `total_max_attempts` counts the first try; botocore's `max_attempts` key would count retries only.
        retries = {"mode": settings.aws_retry_mode, "total_max_attempts": attempts}
        return s.client("ec2", config=Config(retries=retries), **common)

    return Ec2Clients(ec2=client(settings.aws_max_attempts), launch=client(1))
