"""Parsing the three notice formats: what each cloud sends becomes a Notice, "no notice", or a NoticeFormatError;
a deadline is never invented from a body we do not understand."""
from __future__ import annotations

import json

import pytest

from ray_nodeless.errors import NoticeFormatError
from ray_nodeless.interruptions.notices import (
    AWS_NOTICE_S, GCE_NOTICE_S, SOURCE_EVENTBRIDGE, SOURCE_GCE, SOURCE_IMDS, Notice, parse_event_json,
    parse_gce_preempted, parse_imds_instance_action, parse_spot_event, parse_time, spot_event,
)

T0 = 1_800_000_000.0     # 2027-01-15T08:00:00Z


def test_imds_404_is_no_notice_and_200_carries_action_and_time():
    assert parse_imds_instance_action(404, b"<html>Not Found</html>") is None
    n = parse_imds_instance_action(200, b'{"action": "terminate", "time": "2027-01-15T08:02:00Z"}')
    assert n == Notice(machine_id=None, deadline=T0 + 120, source=SOURCE_IMDS, action="terminate")
    assert n.deadline_ms == int((T0 + 120) * 1000)
    assert "2027-01-15T08:02:00Z" in n.describe() and "terminate" in n.describe()


@pytest.mark.parametrize("action", ["stop", "hibernate"])
def test_imds_stop_and_hibernate_are_notices_too(action):
    n = parse_imds_instance_action(200, json.dumps({"action": action, "time": "2027-01-15T08:02:00.000Z"}))
    assert n.action == action and n.deadline == T0 + 120


@pytest.mark.parametrize("status,body,match", [
    (200, b"not json", "not JSON"),
    (200, b"[1, 2]", "JSON object"),
    (200, b'{"action": "reboot", "time": "2027-01-15T08:02:00Z"}', "action"),
    (200, b'{"action": "terminate"}', "time"),
    (200, b'{"action": "terminate", "time": "in two minutes"}', "ISO-8601"),
    (500, b"", "status 500"),
])
def test_imds_bodies_we_cannot_read_are_errors(status, body, match):
    with pytest.raises(NoticeFormatError, match=match):
        parse_imds_instance_action(status, body)


def test_a_time_without_zone_is_utc_not_local():
    assert parse_time("2027-01-15T08:00:00", "x") == T0
    assert parse_time("2027-01-15T08:00:00+01:00", "x") == T0 - 3600


@pytest.mark.parametrize("body", [b"FALSE", "false\n", b" False "])
def test_gce_false_is_no_notice(body):
    assert parse_gce_preempted(body, T0) is None


def test_gce_true_gives_thirty_seconds_from_reading():
    n = parse_gce_preempted(b"TRUE", T0)
    assert n == Notice(machine_id=None, deadline=T0 + GCE_NOTICE_S, source=SOURCE_GCE, action="preempt")


def test_gce_anything_else_is_an_error():
    with pytest.raises(NoticeFormatError, match="TRUE or FALSE"):
        parse_gce_preempted(b"<html>", T0)


def test_eventbridge_warning_as_aws_documents_it():
    body = json.dumps({
        "version": "0", "id": "1e5527d7-bb36-4607-3370-4164db56a40e",
        "detail-type": "EC2 Spot Instance Interruption Warning", "source": "aws.ec2",
        "account": "123456789012", "time": "2027-01-15T08:00:00Z", "region": "us-east-1",
        "resources": ["arn:aws:ec2:us-east-1b:instance/i-1234567890abcdef0"],
        "detail": {"instance-id": "i-1234567890abcdef0", "instance-action": "terminate"}})
    n = parse_spot_event(parse_event_json(body))
    assert n == Notice(machine_id="i-1234567890abcdef0", deadline=T0 + AWS_NOTICE_S, source=SOURCE_EVENTBRIDGE,
                       action="terminate")
    assert parse_spot_event(spot_event("i-0abc", T0, "stop")).action == "stop"   # our builder round-trips


@pytest.mark.parametrize("mutate,match", [
    (lambda e: e.update({"detail-type": "EC2 Instance Rebalance Recommendation"}), "not a spot interruption"),
    (lambda e: e.update({"source": "custom.app"}), "not a spot interruption"),
    (lambda e: e.update({"detail": "i-0abc"}), "detail"),
    (lambda e: e["detail"].pop("instance-id"), "instance-id"),
    (lambda e: e["detail"].update({"instance-id": "vol-0abc"}), "instance-id"),
    (lambda e: e["detail"].update({"instance-action": "reboot"}), "action"),
    (lambda e: e.pop("time"), "time"),
])
def test_eventbridge_events_we_cannot_use_are_errors(mutate, match):
    event = spot_event("i-0abc", T0)
    mutate(event)
    with pytest.raises(NoticeFormatError, match=match):
        parse_spot_event(event)


def test_sqs_body_that_is_not_an_event():
    with pytest.raises(NoticeFormatError, match="not JSON"):
        parse_event_json("hello")
