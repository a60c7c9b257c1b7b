"""What a booted GCE VM reads from its own metadata server: its instance name (= our machine id), for the boot
scripts ray_nodeless writes (`GcpConfig.instance_id_snippet`), and the preemption notice, for the watcher
(`GcpConfig.interruption_source`). The HTTP client itself is interruptions/metadata.py (standard library only)."""
from __future__ import annotations

from ray_nodeless.interruptions.metadata import GCE_METADATA_URL, GceClient
from ray_nodeless.interruptions.notices import Notice


def instance_id_snippet(var: str) -> str:
    """A bash line setting `var` to this VM's instance name, which is our machine id."""
    return (f'{var}=$(curl -sf -H "Metadata-Flavor: Google" '
            'http://metadata.google.internal/computeMetadata/v1/instance/name)')


class GceSource:
    """GCE `instance/preempted` as a notice source; its poll blocks in the metadata server's hanging GET (`blocks`),
    so the notice arrives as soon as the value flips."""

    blocks = True

    def __init__(self, client: GceClient):
        self.client = client

    def poll(self, wait_s: float = 0.0) -> Notice | None:
        return self.client.poll(wait_s)


def interruption_source(metadata_url: str | None) -> GceSource:
    return GceSource(GceClient(metadata_url or GCE_METADATA_URL))
