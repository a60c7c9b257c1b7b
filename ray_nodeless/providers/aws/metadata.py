"""What a booted EC2 instance reads from its own instance metadata service (IMDSv2): its instance id, for the boot
scripts ray_nodeless writes (`AwsConfig.instance_id_snippet`), and the spot interruption notice, for the watcher
(`AwsConfig.interruption_source`). The HTTP client itself is interruptions/metadata.py (standard library only)."""
from __future__ import annotations

from ray_nodeless.interruptions.metadata import AWS_METADATA_URL, ImdsClient
from ray_nodeless.interruptions.notices import Notice


def instance_id_snippet(var: str) -> str:
    """Bash lines setting `var` to this instance's id (= our machine id) through IMDSv2 (a session token first)."""
    return ('TOKEN=$(curl -sf -X PUT http://169.254.169.254/latest/api/token '
            '-H "X-aws-ec2-metadata-token-ttl-seconds: 300")\n'
            f'{var}=$(curl -sf -H "X-aws-ec2-metadata-token: $TOKEN" '
            'http://169.254.169.254/latest/meta-data/instance-id)')


class ImdsSource:
    """IMDS `spot/instance-action` as a notice source. IMDS has no hanging GET: `blocks` is False, so the watcher
    sleeps its poll interval between polls (AWS recommends every 5 s)."""

    blocks = False

    def __init__(self, client: ImdsClient):
        self.client = client

    def poll(self, wait_s: float = 0.0) -> Notice | None:
        return self.client.poll()


def interruption_source(metadata_url: str | None) -> ImdsSource:
    return ImdsSource(ImdsClient(metadata_url or AWS_METADATA_URL))
