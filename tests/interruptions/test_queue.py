"""The provider-side queue path against moto's SQS: which messages are acted on, kept or deleted, bounded polls,
and no exception from a broken queue. Draining itself (a real Ray) is in tests/e2e/test_interruptions_e2e.py; here
no message reaches GCS, so the drainer points at an address that is never contacted."""
from __future__ import annotations

import json
import time

import pytest

from ray_nodeless.interruptions.drain import RayDrainer
from ray_nodeless.interruptions.notices import spot_event
from ray_nodeless.interruptions.queue import QUEUE_BATCH, QUEUE_MAX_RECEIVES, STALE_AFTER_S, InterruptionQueue
from ray_nodeless.operate.config import load_provider
from ray_nodeless.providers.aws.interruption_queue import queue_endpoint
from ray_nodeless.providers.base import Machine
from ray_nodeless.testing.moto_server import unique
from ray_nodeless.testing.ray_processes import free_port

OURS = {"i-0aaaaaaaaaaaaaaa1": Machine(id="i-0aaaaaaaaaaaaaaa1", tags={"ray-cluster-name": "c"},
                                       internal_ip="10.0.0.5")}
NEVER = RayDrainer("")      # "no GCS address": any drain attempt would be a DrainError, reported as failed


@pytest.fixture
def moto(moto_server):
    """moto's server without a reset (each test makes its own queue; the reset is slow and only EC2 needs it)."""
    return moto_server


@pytest.fixture
def queue(moto):
    sqs = moto.client("sqs")
    # VisibilityTimeout 0: a message we leave is visible again at once, so the test sees what is left.
    url = sqs.create_queue(QueueName=unique("spot"), Attributes={"VisibilityTimeout": "0"})["QueueUrl"]
    return sqs, url


def _send(sqs, url, body) -> None:
    sqs.send_message(QueueUrl=url, MessageBody=body if isinstance(body, str) else json.dumps(body))


def _left(sqs, url) -> int:
    return int(sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"])
               ["Attributes"]["ApproximateNumberOfMessages"])


def _queue(moto, url, **kw) -> InterruptionQueue:
    provider = {"cloud": "aws", "region": "us-east-1", "aws_credentials": {"aws_access_key_id": "testing",
                                                                           "aws_secret_access_key": "testing"}}
    # The client the provider gets: the aws backend config's hook, on the loader's parsed aws section.
    bundle = load_provider(provider)
    return InterruptionQueue(bundle.backend_config.interruption_queue_client(url, bundle.backend_settings), url,
                             NEVER, min_interval_s=0, **kw)


def test_queue_url_names_the_endpoint_and_region():
    assert queue_endpoint("https://sqs.eu-west-1.amazonaws.com/123456789012/spot") == (
        "https://sqs.eu-west-1.amazonaws.com", "eu-west-1")
    assert queue_endpoint("https://us-west-2.queue.amazonaws.com/1/q") == ("https://us-west-2.queue.amazonaws.com",
                                                                          "us-west-2")
    assert queue_endpoint("http://127.0.0.1:5000/123456789012/q") == ("http://127.0.0.1:5000", None)


def test_other_clusters_warnings_stay_and_stale_ones_go(moto, queue):
    sqs, url = queue
    now = time.time()
    _send(sqs, url, spot_event("i-0other000000000001", now))                          # another cluster's, fresh
    _send(sqs, url, spot_event("i-0other000000000002", now - 120 - STALE_AFTER_S - 5))  # long gone
    report = _queue(moto, url).poll(OURS)
    assert sorted(report.foreign) == ["i-0other000000000001", "i-0other000000000002"]
    assert report.deleted == 1 and report.drained == {} and report.failed == {} and not report.error
    assert _left(sqs, url) == 1


def test_messages_that_are_not_spot_warnings_are_deleted(moto, queue):
    sqs, url = queue
    rebalance = dict(spot_event("i-0aaaaaaaaaaaaaaa1", time.time()), **{"detail-type":
                                                                        "EC2 Instance Rebalance Recommendation"})
    _send(sqs, url, rebalance)
    _send(sqs, url, "not json at all")
    report = _queue(moto, url).poll(OURS)
    assert report.ignored == 2 and report.deleted == 2 and report.drained == {}
    assert _left(sqs, url) == 0


def test_a_warning_for_our_machine_whose_drain_fails_is_kept_for_a_retry(moto, queue):
    sqs, url = queue
    _send(sqs, url, spot_event("i-0aaaaaaaaaaaaaaa1", time.time()))
    report = _queue(moto, url).poll(OURS)
    assert list(report.failed) == ["i-0aaaaaaaaaaaaaaa1"] and "no GCS address" in report.failed["i-0aaaaaaaaaaaaaaa1"]
    assert report.deleted == 0 and _left(sqs, url) == 1


def test_one_poll_is_bounded(moto, queue):
    sqs, url = queue
    for n in range(QUEUE_BATCH * QUEUE_MAX_RECEIVES + 7):
        _send(sqs, url, "junk %d" % n)
    q = _queue(moto, url)
    calls = []
    q.sqs.meta.events.register("before-send.sqs.ReceiveMessage", lambda **kw: calls.append(1))
    report = q.poll(OURS)
    assert len(calls) == QUEUE_MAX_RECEIVES and report.deleted == QUEUE_BATCH * QUEUE_MAX_RECEIVES
    assert _left(sqs, url) == 7
    q.poll(OURS)
    assert _left(sqs, url) == 0


def test_polls_closer_than_the_interval_are_skipped(moto, queue):
    _, url = queue
    q = _queue(moto, url)
    q.min_interval_s = 60
    assert q.poll(OURS) is not None
    assert q.poll(OURS) is None


def test_a_broken_queue_is_reported_never_raised(moto):
    gone = f"{moto.url}/123456789012/{unique('missing')}"
    report = _queue(moto, gone).poll(OURS)
    assert "NonExistentQueue" in report.error or "QueueDoesNotExist" in report.error, report.error
    down = f"http://127.0.0.1:{free_port()}/123456789012/q"
    assert "Could not connect" in _queue(moto, down).poll(OURS).error
