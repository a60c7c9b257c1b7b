"""The node-side watcher: `python -m ray_nodeless.interruptions.watch --cloud aws|gcp --gcs-address HEAD:PORT`.

Runs on a spot worker beside Ray (our boot script starts it, see registrations/vm_boot.py). It reads the machine's
own metadata server (EC2 IMDSv2 `spot/instance-action` every `--poll-s`, as AWS recommends; GCE `preempted` with
the server's hanging GET) and, on a notice, drains its own Ray node through Ray's drain API with the cloud's
deadline, then exits. Ray then stops placing work on the node and reschedules at once, instead of noticing only
when the machine vanishes (the raylet heartbeat timeout, tens of seconds after the machine is gone).

Where the notice comes from is the backend's (`BackendConfig.interruption_source`: providers/aws/metadata.py,
providers/gcp/metadata.py); `--cloud` is any backend that has one. The metadata base URL is `--metadata-url`, else
`RAY_NODELESS_METADATA_URL`, else the cloud's own; the tests point it at ray_nodeless/testing/fake_metadata.py.
The Ray node is the one whose instance id is `--instance-id` (default `RAY_CLOUD_INSTANCE_ID`, which the boot
script exports before `ray start`), else the one on `--node-ip`.

Exit status: 0 once the node is drained, 1 if the deadline passed without a drain (no such node, GCS gone), 2 for
bad arguments.
"""
from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import time
from dataclasses import dataclass
from typing import Callable, Protocol

from ray_nodeless.errors import DrainError, MetadataError, NoticeFormatError
from ray_nodeless.interruptions.drain import RayDrainer
from ray_nodeless.interruptions.notices import Notice
from ray_nodeless.providers import backend_config, backend_names

logger = logging.getLogger("ray_nodeless.interruptions.watch")

METADATA_URL_ENV = "RAY_NODELESS_METADATA_URL"
# AWS: IMDS publishes the notice two minutes ahead and recommends polling every 5 s.
DEFAULT_POLL_S = 5.0
# GCE: how long one hanging GET waits for a change before it is re-issued, so a connection that died silently is
# replaced within a minute (the notice itself arrives as soon as the value changes).
GCE_WAIT_S = 60.0
# Between drain attempts while the node is not in the node table yet or GCS does not answer.
DRAIN_RETRY_S = 1.0


class NoticeSource(Protocol):
    """A machine's own interruption notices, as a backend's `interruption_source` gives them."""

    blocks: bool        # True: `poll` waits (a hanging GET) by itself; False: the loop sleeps `poll_s` in between

    def poll(self, wait_s: float = 0.0) -> Notice | None: ...


@dataclass
class Watcher:
    source: NoticeSource
    drainer: RayDrainer
    instance_id: str | None
    node_ip: str | None
    poll_s: float = DEFAULT_POLL_S
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.time

    def wait_for_notice(self) -> Notice:
        """Poll until a notice comes. Metadata errors and unreadable notices are logged and polled again: the
        watcher must outlive a metadata server restart."""
        while True:
            try:
                notice = self.source.poll(GCE_WAIT_S if self.source.blocks else 0.0)
            except (MetadataError, NoticeFormatError) as e:
                logger.warning("%s", e)
                self.sleep(self.poll_s)
                continue
            if notice is not None:
                logger.warning("interruption notice: %s", notice.describe())
                return notice
            if not self.source.blocks:
                self.sleep(self.poll_s)

    def drain(self, notice: Notice) -> bool:
        """Drain this machine's Ray node; retried (the node may still be joining, GCS may blink) until the
        deadline. True once GCS accepted the drain."""
        last = ""
        while True:
            try:
                node = self.drainer.find(instance_id=self.instance_id, ip=self.node_ip)
                if node is None:
                    raise DrainError(f"no live Ray node with instance id {self.instance_id!r} or IP "
                                     f"{self.node_ip!r} at {self.drainer.gcs_address}")
                self.drainer.drain(node, notice)
                return True
            except DrainError as e:
                if str(e) != last:
                    logger.warning("%s; retrying until the deadline", e)
                    last = str(e)
            if self.clock() >= notice.deadline:
                logger.error("the deadline passed without a drain")
                return False
            self.sleep(DRAIN_RETRY_S)

    def run(self) -> int:
        return 0 if self.drain(self.wait_for_notice()) else 1


def _local_ip() -> str | None:
    try:
        from ray_nodeless.ray_compat.node_ip import node_ip_address
        return node_ip_address()
    except Exception:   # noqa: BLE001 - only a fallback for finding the node; the instance id usually suffices
        return None


def notice_source(cloud: str, metadata_url: str | None) -> NoticeSource | None:
    """The backend's notice source (None: its machines get no notices), at `metadata_url` (None: the cloud's own
    metadata server, unless RAY_NODELESS_METADATA_URL says otherwise)."""
    return backend_config(cloud).interruption_source(metadata_url or os.environ.get(METADATA_URL_ENV) or None)


def build(args: argparse.Namespace) -> Watcher:
    source = notice_source(args.cloud, args.metadata_url)
    if source is None:
        raise ValueError(f"--cloud {args.cloud}: that backend's machines get no interruption notices")
    instance_id = args.instance_id if args.instance_id is not None else os.environ.get("RAY_CLOUD_INSTANCE_ID")
    node_ip = args.node_ip or _local_ip()
    return Watcher(source=source, drainer=RayDrainer(args.gcs_address), instance_id=instance_id or None,
                   node_ip=node_ip, poll_s=args.poll_s)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m ray_nodeless.interruptions.watch", description=__doc__.split("\n")[0])
    p.add_argument("--cloud", choices=backend_names(), required=True,
                   help="the machine's backend (one whose machines get interruption notices)")
    p.add_argument("--gcs-address", required=True, help="the head's GCS address, HOST:PORT")
    p.add_argument("--metadata-url", default=None, help=f"metadata base URL (default: ${METADATA_URL_ENV}, else "
                                                        "the cloud's own metadata server)")
    p.add_argument("--instance-id", default=None, help="this machine's instance id (default: $RAY_CLOUD_INSTANCE_ID)")
    p.add_argument("--node-ip", default=None, help="this node's IP in Ray (default: Ray's guess of this host's)")
    p.add_argument("--poll-s", type=float, default=DEFAULT_POLL_S, help="seconds between IMDS polls and retries")
    args = p.parse_args(argv)
    if args.poll_s <= 0:
        p.error("--poll-s must be > 0")
    if notice_source(args.cloud, args.metadata_url) is None:
        p.error(f"--cloud {args.cloud}: that backend's machines get no interruption notices")
    return args


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s ray_nodeless.watch: %(message)s")
    # SIGTERM stops it whatever the boot shell left ignored (a background job of a shell that ignores it; a
    # process the test runner started): the boot's pid file is how it is stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    watcher = build(parse_args(argv))
    logger.info("watching %s for interruption notices (Ray node: instance %s, IP %s, GCS %s)",
                type(watcher.source).__name__, watcher.instance_id, watcher.node_ip,
                watcher.drainer.gcs_address)
    return watcher.run()


if __name__ == "__main__":
    sys.exit(main())
