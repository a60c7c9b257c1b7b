"""The metadata clients against a fake metadata server on 127.0.0.1 speaking IMDSv2 and GCE's protocol."""
from __future__ import annotations

import threading
import time
from typing import Iterator

import pytest

from ray_nodeless.errors import MetadataError, NoticeFormatError
from ray_nodeless.interruptions.metadata import GceClient, ImdsClient
from ray_nodeless.interruptions.notices import GCE_NOTICE_S, SOURCE_GCE, SOURCE_IMDS
from ray_nodeless.testing.fake_metadata import FakeMetadataServer
from ray_nodeless.testing.ray_processes import free_port


@pytest.fixture
def fake() -> Iterator[FakeMetadataServer]:
    with FakeMetadataServer() as srv:
        yield srv


def test_imds_no_notice_then_notice_with_one_token(fake):
    client = ImdsClient(fake.url)
    assert client.poll() is None
    assert client.poll() is None
    when = fake.aws_notice("terminate", in_s=120)
    n = client.poll()
    assert (n.action, n.deadline, n.source, n.machine_id) == ("terminate", when, SOURCE_IMDS, None)
    puts = [r for r in fake.requests_seen() if r[0] == "PUT"]
    assert puts == [("PUT", "/latest/api/token")]          # IMDSv2: one token serves every poll


def test_imds_expired_token_is_renewed_once(fake):
    client = ImdsClient(fake.url)
    assert client.poll() is None
    fake.expire_tokens()
    fake.aws_notice("stop")
    assert client.poll().action == "stop"
    assert [r[0] for r in fake.requests_seen()] == ["PUT", "GET", "GET", "PUT", "GET"]


def test_imds_token_past_its_ttl_is_renewed_before_use(fake):
    now = [0.0]
    client = ImdsClient(fake.url, clock=lambda: now[0])
    client.poll()
    now[0] = 21600.0
    client.poll()
    assert [r[0] for r in fake.requests_seen()] == ["PUT", "GET", "PUT", "GET"]


def test_imds_errors_are_typed(fake):
    client = ImdsClient(fake.url)
    fake.fail_next(500)                       # the token PUT
    with pytest.raises(MetadataError, match="token"):
        client.poll()
    fake.fail_next(503)                       # the GET, with a fresh token
    with pytest.raises(MetadataError, match="503"):
        client.poll()
    fake.aws_raw_action({"action": "explode", "time": "2027-01-01T00:00:00Z"})
    with pytest.raises(NoticeFormatError):
        client.poll()


def test_unreachable_metadata_server_is_a_metadata_error():
    with pytest.raises(MetadataError, match="unreachable"):
        ImdsClient(f"http://127.0.0.1:{free_port()}", timeout=0.5).poll()
    with pytest.raises(MetadataError, match="unreachable"):
        GceClient(f"http://127.0.0.1:{free_port()}", timeout=0.5).poll()


def test_gce_reads_preempted_with_the_flavor_header(fake):
    client = GceClient(fake.url, clock=lambda: 1000.0)
    assert client.poll() is None
    fake.gce_preempt()
    n = client.poll()
    assert (n.deadline, n.source) == (1000.0 + GCE_NOTICE_S, SOURCE_GCE)


def test_gce_hanging_get_returns_as_soon_as_the_value_changes(fake):
    """The watcher's GCE loop: after a first read, a wait_for_change GET blocks until preempted flips."""
    client = GceClient(fake.url)
    assert client.poll() is None
    flip = threading.Timer(0.5, fake.gce_preempt)
    flip.start()
    t0 = time.monotonic()
    n = client.poll(wait_s=30)
    took = time.monotonic() - t0
    assert n is not None and 0.4 < took < 5, took
    path = fake.requests_seen()[-1][1]
    assert "wait_for_change=true" in path and "last_etag=" in path


def test_gce_hanging_get_gives_up_after_its_timeout(fake):
    client = GceClient(fake.url)
    client.poll()
    t0 = time.monotonic()
    assert client.poll(wait_s=1) is None
    assert 0.9 < time.monotonic() - t0 < 4


def test_gce_change_before_the_hanging_get_is_not_missed(fake):
    """last_etag: a flip between two reads answers the next wait at once instead of waiting out the timeout."""
    client = GceClient(fake.url)
    client.poll()
    fake.gce_preempt()
    t0 = time.monotonic()
    assert client.poll(wait_s=30) is not None
    assert time.monotonic() - t0 < 2


def test_gce_error_status_is_a_metadata_error(fake):
    fake.fail_next(503)
    with pytest.raises(MetadataError, match="503"):
        GceClient(fake.url).poll()
