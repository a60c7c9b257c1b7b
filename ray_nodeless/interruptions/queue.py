"""The provider-side path: EC2 spot interruption warnings from an SQS queue (`provider.interruption_queue_url`).

The queue client comes from the backend config (`BackendConfig.interruption_queue_client`: AWS's is
providers/aws/interruption_queue.py); backends whose `supports_interruption_queue` is False refuse the key.

An EventBridge rule (source aws.ec2, detail-type "EC2 Spot Instance Interruption Warning") with the queue as its
target delivers each warning as an SQS message whose body is the event JSON. The provider polls the queue once per
autoscaler update (`non_terminated_nodes`), bounded (QUEUE_MAX_RECEIVES receives of up to 10 messages, each waiting
at most QUEUE_WAIT_S for the first message), so Ray's update loop is never held long; and it never raises (Ray v1's
monitor gives up after five failed updates). This path needs nothing on the workers: it covers machines whose
watcher did not start (no ray_nodeless in the worker image, updaters that start Ray over SSH).

What each message becomes:
- a warning for a machine of this cluster (in the provider's listing, which holds only machines tagged
  `ray-cluster-name=<cluster>`): its Ray node (by instance id, else by the machine's private IP in the GCS node
  table) is drained, then the message is deleted. A machine with no live Ray node (not joined yet, already gone)
  has nothing to drain: deleted too. A drain that failed (GCS unreachable) keeps the message: SQS shows it again
  after its visibility timeout and the next update retries.
- a warning for any other instance: left alone (another cluster may share the queue), unless its deadline passed
  more than STALE_AFTER_S ago: then it can help nobody and is deleted, so a shared queue does not fill up.
- anything else (not JSON, another event type on the same rule's queue): deleted, logged once per kind.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from ray_nodeless.errors import DrainError, NoticeFormatError
from ray_nodeless.interruptions.drain import RayDrainer
from ray_nodeless.interruptions.notices import Notice, is_spot_warning, parse_event_json, parse_spot_event
from ray_nodeless.providers.base import Machine

logger = logging.getLogger(__name__)

# SQS returns at most 10 messages per receive.
QUEUE_BATCH = 10
# Long-poll wait of the first receive only: 1 s finds a message SQS's short poll could miss, and costs at most 1 s
# of a 5 s autoscaler update when the queue is empty. Later receives of the same poll do not wait.
QUEUE_WAIT_S = 1
# Receives per poll: 30 warnings per update is far beyond a cluster's simultaneous interruptions; what is left
# waits for the next update (5 s later), so one poll is bounded in time.
QUEUE_MAX_RECEIVES = 3
# A warning whose machine went this long ago is no use to anyone; delete it even if it is not ours.
STALE_AFTER_S = 600.0
# Polls closer together than this are skipped: Ray may list several times per update (and from several threads);
# one poll per update is the point.
MIN_POLL_INTERVAL_S = 2.0


@dataclass
class QueueReport:
    """What one poll did (for logs and tests)."""

    drained: dict[str, str] = field(default_factory=dict)      # machine id -> Ray node id
    not_in_ray: list[str] = field(default_factory=list)          # ours, but no live Ray node: nothing to drain
    foreign: list[str] = field(default_factory=list)             # other instances' warnings, left in the queue
    failed: dict[str, str] = field(default_factory=dict)         # machine id -> why (message kept for a retry)
    deleted: int = 0
    ignored: int = 0                                             # not a spot warning (deleted)
    error: str = ""                                              # the SQS call that failed, if any


class InterruptionQueue:
    def __init__(self, sqs: Any, queue_url: str, drainer: RayDrainer, clock: Callable[[], float] = time.time,
                 min_interval_s: float = MIN_POLL_INTERVAL_S):
        self.sqs = sqs
        self.queue_url = queue_url
        self.drainer = drainer
        self.min_interval_s = min_interval_s
        self._clock = clock
        self._warned_kinds: set[str] = set()
        self._lock = threading.Lock()         # one poll at a time; a concurrent caller skips rather than waits
        self._polled_at = float("-inf")
        self.last_report: QueueReport | None = None     # what the last poll did (status, tests)

    def poll(self, machines: Mapping[str, Machine]) -> QueueReport | None:
        """Handle what the queue holds now for `machines` (this cluster's listing). Never raises. None when skipped
        (polled less than `min_interval_s` ago, or another thread is polling)."""
        if not self._lock.acquire(blocking=False):
            return None
        try:
            if time.monotonic() - self._polled_at < self.min_interval_s:
                return None
            self._polled_at = time.monotonic()
            self.last_report = self._poll(machines)
            return self.last_report
        finally:
            self._lock.release()

    def _poll(self, machines: Mapping[str, Machine]) -> QueueReport:
        report = QueueReport()
        try:
            for i in range(QUEUE_MAX_RECEIVES):
                messages = self.sqs.receive_message(
                    QueueUrl=self.queue_url, MaxNumberOfMessages=QUEUE_BATCH,
                    WaitTimeSeconds=QUEUE_WAIT_S if i == 0 else 0).get("Messages", [])
                for msg in messages:
                    if self._handle(msg, machines, report):
                        self.sqs.delete_message(QueueUrl=self.queue_url, ReceiptHandle=msg["ReceiptHandle"])
                        report.deleted += 1
                if len(messages) < QUEUE_BATCH:
                    break
        except Exception as e:  # noqa: BLE001 - botocore's and the network's; Ray's update must go on
            report.error = f"{type(e).__name__}: {e}"
            logger.warning("spot interruption queue %s: %s", self.queue_url, report.error)
        if report.drained or report.failed:
            logger.warning("spot interruption queue: drained %s; failed %s", report.drained, report.failed)
        return report

    def _handle(self, msg: Mapping[str, Any], machines: Mapping[str, Machine], report: QueueReport) -> bool:
        """Act on one message; True if it should be deleted."""
        try:
            event = parse_event_json(msg.get("Body", ""))
            if not is_spot_warning(event):
                self._ignore(str(event.get("detail-type")), report)
                return True
            notice = parse_spot_event(event)
        except NoticeFormatError as e:
            self._ignore(str(e).split(":")[0], report, str(e))
            return True
        machine = machines.get(notice.machine_id or "")
        if machine is None:
            report.foreign.append(notice.machine_id or "")
            return self._clock() > notice.deadline + STALE_AFTER_S
        return self._drain(machine, notice, report)

    def _drain(self, machine: Machine, notice: Notice, report: QueueReport) -> bool:
        try:
            node = self.drainer.find(instance_id=machine.id, ip=machine.internal_ip)
            if node is None:
                report.not_in_ray.append(machine.id)
                return True
            self.drainer.drain(node, notice)
        except DrainError as e:
            report.failed[machine.id] = str(e)
            return False
        report.drained[machine.id] = node.node_id
        return True

    def _ignore(self, kind: str, report: QueueReport, detail: str = "") -> None:
        report.ignored += 1
        if kind not in self._warned_kinds:
            self._warned_kinds.add(kind)
            logger.info("spot interruption queue: deleting messages that are not spot interruption warnings "
                        "(%s)", detail or kind)
