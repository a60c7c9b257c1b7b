"""The SQS client of the provider-side interruption path (`provider.interruption_queue_url`, polled by
interruptions/queue.py): `AwsConfig.interruption_queue_client`. boto3 is imported only when a queue is set."""
from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

from ray_nodeless.interruptions.queue import QUEUE_WAIT_S
from ray_nodeless.providers.aws.settings import AwsSettings

# SQS calls: one attempt and a short timeout; the next autoscaler update is the retry. The read timeout covers the
# first receive's long-poll wait plus the answer.
SQS_CONNECT_TIMEOUT_S = 2
SQS_READ_TIMEOUT_S = QUEUE_WAIT_S + 4

_REGION_IN_HOST = (re.compile(r"^sqs[.-]([a-z0-9-]+)\.amazonaws\.com"), re.compile(r"^([a-z0-9-]+)\.queue\.amazonaws"))


def queue_endpoint(queue_url: str) -> tuple[str, str | None]:
    """(endpoint URL, region or None) for a queue URL: SQS accepts requests at the queue URL's own origin
    (`https://sqs.us-east-1.amazonaws.com`, a VPC endpoint, a test server), and its host names the region."""
    parts = urlsplit(queue_url)
    host = parts.hostname or ""
    region = next((m.group(1) for r in _REGION_IN_HOST if (m := r.match(host))), None)
    return f"{parts.scheme}://{parts.netloc}", region


def sqs_client(queue_url: str, settings: AwsSettings) -> Any:
    """A boto3 SQS client for the queue, with the backend's parsed AWS credentials and region."""
    from botocore.config import Config

    from ray_nodeless.providers.aws.clients import session

    endpoint, region = queue_endpoint(queue_url)
    cfg = Config(retries={"mode": "standard", "total_max_attempts": 1}, connect_timeout=SQS_CONNECT_TIMEOUT_S,
                 read_timeout=SQS_READ_TIMEOUT_S)
    return session(settings.session_kwargs()).client("sqs", region_name=region or settings.region,
                                                     endpoint_url=endpoint, config=cfg)
