"""Interruption notices, parsed from what each cloud sends: pure (no SDK, no network, no Ray).

Three sources, one result (`Notice`):
- EC2 IMDS `GET /latest/meta-data/spot/instance-action`: 404 while there is no notice, then
  `{"action": "terminate" | "stop" | "hibernate", "time": "2026-01-01T00:02:00Z"}`, about two minutes ahead.
- GCE `GET /computeMetadata/v1/instance/preempted`: `FALSE`, then `TRUE` once the VM is being preempted. GCE gives a
  spot/preemptible VM about 30 s from that moment (its "ACPI G2 soft off" grace); the body carries no time.
- The EventBridge event "EC2 Spot Instance Interruption Warning" as an SQS message body: the event JSON, with
  `detail.instance-id`, `detail.instance-action` and `time` (when EC2 emitted the warning, two minutes ahead).

Every parse answers a Notice, "no notice" (None), or raises `NoticeFormatError`: a deadline is never invented
from a body we do not understand, because draining on a misread notice would empty a healthy node.
"""
from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass
from typing import Any

from ray_nodeless.errors import NoticeFormatError

# EC2 warns two minutes before it reclaims a spot instance (the warning's `time` is that moment in IMDS; in the
# EventBridge event `time` is when the warning was emitted, so the deadline is that plus two minutes).
AWS_NOTICE_S = 120.0
# GCE sends the preemption notice and then gives the guest 30 s before it is stopped.
GCE_NOTICE_S = 30.0
# EC2's instance actions that end the machine (all three take the node out of Ray: a stopped or hibernated spot
# instance keeps no Ray process).
AWS_ACTIONS = frozenset({"terminate", "stop", "hibernate"})
# The EventBridge event a spot interruption queue receives (source aws.ec2).
SPOT_EVENT_DETAIL_TYPE = "EC2 Spot Instance Interruption Warning"
SPOT_EVENT_SOURCE = "aws.ec2"

SOURCE_IMDS = "aws-imds"
SOURCE_GCE = "gce-metadata"
SOURCE_EVENTBRIDGE = "aws-eventbridge"


@dataclass(frozen=True)
class Notice:
    """The machine `machine_id` (None when the notice came from the machine itself) goes at `deadline` (epoch
    seconds) for `action`; `source` says which channel told us."""

    machine_id: str | None
    deadline: float
    source: str
    action: str = "terminate"

    @property
    def deadline_ms(self) -> int:
        """What Ray's DrainNode takes (`deadline_timestamp_ms`)."""
        return int(self.deadline * 1000)

    def describe(self) -> str:
        """The drain reason message Ray shows (in `ray status` and in the errors of tasks the node loses)."""
        when = dt.datetime.fromtimestamp(self.deadline, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        who = f"{self.machine_id} " if self.machine_id else ""
        return f"{who}{self.action} notice from {self.source}: the machine goes at {when}"


def parse_time(value: Any, what: str) -> float:
    """An ISO-8601 UTC timestamp as EC2 writes it (`2026-01-01T00:02:00Z`, optional fraction) -> epoch seconds."""
    if not isinstance(value, str) or not value:
        raise NoticeFormatError(f"{what}: `time` must be an ISO-8601 timestamp, got {value!r}")
    text = value.strip()
    if text.endswith(("Z", "z")):
        text = text[:-1] + "+00:00"
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        raise NoticeFormatError(f"{what}: `time` is not an ISO-8601 timestamp: {value!r}") from None
    if when.tzinfo is None:        # EC2 always writes UTC; a bare time is read as UTC rather than local time
        when = when.replace(tzinfo=dt.timezone.utc)
    return when.timestamp()


def _json_object(body: str | bytes, what: str) -> dict[str, Any]:
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise NoticeFormatError(f"{what}: not JSON ({e})") from None
    if not isinstance(data, dict):
        raise NoticeFormatError(f"{what}: expected a JSON object, got {type(data).__name__}")
    return data


def _aws_action(value: Any, what: str) -> str:
    if value not in AWS_ACTIONS:
        raise NoticeFormatError(f"{what}: `action` must be one of {sorted(AWS_ACTIONS)}, got {value!r}")
    return str(value)


def parse_imds_instance_action(status: int, body: str | bytes) -> Notice | None:
    """The answer of IMDS `spot/instance-action`: 404 is "no notice"; 200 carries the action and its time."""
    what = "IMDS spot/instance-action"
    if status == 404:
        return None
    if status != 200:
        raise NoticeFormatError(f"{what}: unexpected HTTP status {status}")
    data = _json_object(body, what)
    return Notice(machine_id=None, deadline=parse_time(data.get("time"), what), source=SOURCE_IMDS,
                  action=_aws_action(data.get("action"), what))


def parse_gce_preempted(body: str | bytes, now: float) -> Notice | None:
    """The body of GCE `instance/preempted`: FALSE is "no notice"; TRUE means the VM goes GCE_NOTICE_S after `now`
    (the moment we read it: GCE publishes no time)."""
    text = (body.decode(errors="replace") if isinstance(body, bytes) else body).strip().upper()
    if text == "FALSE":
        return None
    if text == "TRUE":
        return Notice(machine_id=None, deadline=now + GCE_NOTICE_S, source=SOURCE_GCE, action="preempt")
    raise NoticeFormatError(f"GCE instance/preempted: expected TRUE or FALSE, got {text[:40]!r}")


def is_spot_warning(event: dict[str, Any]) -> bool:
    """Is this EventBridge event an EC2 spot interruption warning (and not, e.g., a rebalance recommendation or a
    state-change event sharing the queue)?"""
    return event.get("detail-type") == SPOT_EVENT_DETAIL_TYPE and event.get("source") == SPOT_EVENT_SOURCE


def parse_event_json(body: str | bytes) -> dict[str, Any]:
    """An SQS message body holding an EventBridge event (EventBridge's SQS target delivers the event JSON itself)."""
    return _json_object(body, "SQS message")


def parse_spot_event(event: dict[str, Any]) -> Notice:
    """An "EC2 Spot Instance Interruption Warning" event -> a Notice for its instance. The deadline is the event's
    `time` plus AWS_NOTICE_S (the event does not repeat the instance-action time)."""
    what = "EventBridge spot interruption warning"
    if not is_spot_warning(event):
        raise NoticeFormatError(f"{what}: not a spot interruption warning (detail-type "
                                f"{event.get('detail-type')!r}, source {event.get('source')!r})")
    detail = event.get("detail")
    if not isinstance(detail, dict):
        raise NoticeFormatError(f"{what}: `detail` must be an object")
    instance_id = detail.get("instance-id")
    if not isinstance(instance_id, str) or not instance_id.startswith("i-"):
        raise NoticeFormatError(f"{what}: `detail.instance-id` must be an EC2 instance id, got {instance_id!r}")
    emitted = parse_time(event.get("time"), what)
    return Notice(machine_id=instance_id, deadline=emitted + AWS_NOTICE_S, source=SOURCE_EVENTBRIDGE,
                  action=_aws_action(detail.get("instance-action"), what))


def spot_event(instance_id: str, when: float, action: str = "terminate", region: str = "us-east-1",
               account: str = "123456789012") -> dict[str, Any]:
    """An EventBridge spot interruption warning exactly as AWS documents it (for fakes, tests and replays)."""
    stamp = dt.datetime.fromtimestamp(when, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "version": "0", "id": f"spot-{instance_id}-{int(when)}", "detail-type": SPOT_EVENT_DETAIL_TYPE,
        "source": SPOT_EVENT_SOURCE, "account": account, "time": stamp, "region": region,
        "resources": [f"arn:aws:ec2:{region}b:instance/{instance_id}"],
        "detail": {"instance-id": instance_id, "instance-action": action},
    }
