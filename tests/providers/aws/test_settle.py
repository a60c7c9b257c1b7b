"""The AWS backend's settle step (providers/aws/settle.py) on moto, with EC2's answers faulted on the wire: a
RunInstances answer lost after the instances were made, lookups that see only some of them (EC2 lists new
instances eventually, one by one), lookups that fail, an endpoint that does not honour ClientToken (moto itself)
and one that does (emulated here). Nothing is ever terminated that a launch may return, nothing returned that
was terminated, and RunInstances is never sent again without knowing what the first attempt made."""
from __future__ import annotations

import re
import threading

import botocore.exceptions
import pytest
from botocore.awsrequest import AWSResponse

from ray_nodeless.errors import TransientBackendError
from ray_nodeless.providers.aws.launch_params import TAG_REQUEST
from ray_nodeless.testing.moto_server import (
    MotoServer, _Raw, ec2_describe_without, ec2_error, forward, install, query_params,
)
from tests.providers.aws.helpers import all_instances, live, make_backend, make_spec


class LostAnswer:
    """RunInstances that reach moto and take effect, then lose their answer (`lose` of them); with
    `honour_token`, a repeated ClientToken gets the first answer and creates nothing (EC2's semantics)."""

    def __init__(self, lose: int = 1, honour_token: bool = False):
        self.lose = lose
        self.honour_token = honour_token
        self.made: list[list[str]] = []
        self.answers: dict[str, bytes] = {}
        self.lock = threading.Lock()

    def __call__(self, request, n):
        token = query_params(request).get("ClientToken", "")
        with self.lock:
            if self.honour_token and token in self.answers:
                return AWSResponse(request.url, 200, {"Content-Type": "text/xml"}, _Raw(self.answers[token]))
            resp = forward(request)
            ids = [m.decode() for m in re.findall(rb"<instanceId>([^<]+)</instanceId>", resp.content)]
            self.made.append(ids)
            self.answers[token] = resp.content
            lose = self.lose > 0
            self.lose -= int(lose)
        if lose:
            raise botocore.exceptions.ReadTimeoutError(endpoint_url=request.url)
        return AWSResponse(request.url, 200, {"Content-Type": "text/xml"}, _Raw(resp.content))


class Lagging:
    """DescribeInstances that show the instances of `made` one more per call (the first `start` calls show
    `shown` of them), and `fail` calls that are throttled first."""

    def __init__(self, made: LostAnswer, shown: int = 0, fail: int = 0, reveal_every: int = 1):
        self.made, self.shown, self.fail, self.every = made, shown, fail, reveal_every
        self.calls = 0

    def __call__(self, request, n):
        self.calls += 1
        if self.fail > 0:
            self.fail -= 1
            return ec2_error(request, "RequestLimitExceeded", "Request limit exceeded.", 503)
        new = [i for ids in self.made.made for i in ids]
        visible = set(new[:self.shown])
        if self.calls % self.every == 0:
            self.shown += 1
        return ec2_describe_without(request, lambda i: i in new and i not in visible)


@pytest.mark.parametrize("honour_token", [False, True])
def test_lost_answer_and_a_partial_lookup_waits_for_the_whole_set(moto: MotoServer, honour_token: bool) -> None:
    """The issue's case: 5 made, the answer lost, the lookup sees 2, then the rest one by one. Before: the 2 were
    terminated and a re-send (same ClientToken) returned all 5 ids, 2 of them terminated."""
    b = make_backend(moto, aws_settle_wait_s=10.0)
    run = LostAnswer(honour_token=honour_token)
    runs = install(b.ec2_launch, "RunInstances", run)
    install(b.ec2, "DescribeInstances", Lagging(run, shown=2))
    ids = b.launch(make_spec(count=5))
    assert runs.calls == 1 and len(run.made) == 1
    assert sorted(ids) == sorted(run.made[0])
    assert sorted(i["InstanceId"] for i in live(moto)) == sorted(ids)         # none terminated, none extra


@pytest.mark.parametrize("honour_token", [False, True])
def test_a_short_set_past_the_wait_is_transient_and_never_sent_again(moto: MotoServer, honour_token: bool) -> None:
    b = make_backend(moto, aws_settle_wait_s=0.3)
    run = LostAnswer(honour_token=honour_token)
    runs = install(b.ec2_launch, "RunInstances", run)
    lag = Lagging(run, shown=2, reveal_every=10_000)        # stuck at 2 of 5 for the whole wait
    install(b.ec2, "DescribeInstances", lag)
    spec = make_spec(count=5)
    with pytest.raises(TransientBackendError) as e:
        b.launch(spec)
    assert e.value.category == "PartialLookup"
    assert len(live(moto)) == 5                               # nothing terminated
    lag.shown = 5                                             # EC2 lists them all now
    ids = b.launch(spec)                                      # the launcher's retry, same token
    assert runs.calls == 1 and sorted(ids) == sorted(run.made[0])
    assert sorted(i["InstanceId"] for i in live(moto)) == sorted(ids)


def test_lost_answer_while_the_lookup_fails_is_never_sent_again(moto: MotoServer) -> None:
    """Before: the retry's lookup did not see the new instances yet and RunInstances went out again (2 for 1)."""
    b = make_backend(moto, aws_settle_wait_s=0.3)
    run = LostAnswer()
    runs = install(b.ec2_launch, "RunInstances", run)
    lag = Lagging(run, shown=0, fail=10_000)                  # every lookup throttled during the first call
    install(b.ec2, "DescribeInstances", lag)
    spec = make_spec(count=1)
    with pytest.raises(TransientBackendError) as e:
        b.launch(spec)
    assert e.value.category == "DescribeInstances" and runs.calls == 1
    lag.fail, lag.shown, lag.every = 0, 0, 3                  # lookups answer, the instance listed only later
    ids = b.launch(spec)
    assert runs.calls == 1 and ids == run.made[0] and [i["InstanceId"] for i in live(moto)] == ids


def test_lost_answer_while_nothing_is_listed_yet_looks_again_before_sending(moto: MotoServer) -> None:
    """Before: a lookup that saw nothing yet was read as "nothing made" and re-sent (10 for 5)."""
    b = make_backend(moto, aws_settle_wait_s=10.0)
    run = LostAnswer()
    runs = install(b.ec2_launch, "RunInstances", run)
    lag = Lagging(run, shown=0, reveal_every=2)               # nothing for a few lookups, then one by one
    install(b.ec2, "DescribeInstances", lag)
    ids = b.launch(make_spec(count=5))
    assert runs.calls == 1 and sorted(ids) == sorted(run.made[0]) and lag.calls > 5
    assert len(live(moto)) == 5


def test_a_server_error_that_made_nothing_is_sent_again_after_the_wait(moto: MotoServer) -> None:
    b = make_backend(moto, aws_settle_wait_s=0.3)
    runs = install(b.ec2_launch, "RunInstances",
                   lambda r, n: ec2_error(r, "InternalError", "An internal error has occurred", 500) if n == 1
                   else None)
    describes = install(b.ec2, "DescribeInstances", lambda r, n: None)
    ids = b.launch(make_spec(count=2))
    assert runs.calls == 2 and len(ids) == 2 and len(live(moto)) == 2
    assert describes.calls >= 2                               # looked until the wait had passed, then sent


def test_throttling_is_looked_up_once_and_sent_again_without_waiting(moto: MotoServer) -> None:
    b = make_backend(moto, aws_settle_wait_s=60.0)            # a wait here would show as a hung test
    runs = install(b.ec2_launch, "RunInstances",
                   lambda r, n: ec2_error(r, "RequestLimitExceeded", "slow down", 503) if n == 1 else None)
    describes = install(b.ec2, "DescribeInstances", lambda r, n: None)
    assert len(b.launch(make_spec(count=1))) == 1
    assert runs.calls == 2 and describes.calls == 1


def test_a_retry_after_a_terminate_never_returns_the_terminated_instance(moto: MotoServer) -> None:
    """A Ray-level retry of a launch whose machines were partly ended since: the lookup sees 1 of 2 live and the
    launch is not sent again (an endpoint honouring ClientToken would answer with both ids, one terminated)."""
    b = make_backend(moto, aws_settle_wait_s=0.3)
    run = LostAnswer(lose=0, honour_token=True)
    runs = install(b.ec2_launch, "RunInstances", run)
    spec = make_spec(count=2)
    first = b.launch(spec)
    b.terminate(first[:1])
    with pytest.raises(TransientBackendError) as e:
        b.launch(spec)
    assert e.value.category == "PartialLookup" and runs.calls == 1
    assert [i["InstanceId"] for i in live(moto)] == first[1:]
    # Past the token memory's bound the launch is sent again; the endpoint replays the first answer, which
    # names the terminated instance: not returned (the live one alone is a short set: transient again).
    b._tokens._tokens.clear()
    with pytest.raises(TransientBackendError) as e:
        b.launch(spec)
    assert e.value.category == "PartialLookup" and runs.calls == 2
    assert len(run.made) == 1 and [i["InstanceId"] for i in live(moto)] == first[1:]


def test_more_instances_than_count_keeps_the_same_ones_on_every_retry(moto: MotoServer) -> None:
    spec = make_spec(count=2)
    b = make_backend(moto, aws_settle_wait_s=0.3)
    run = LostAnswer(lose=2)                                  # moto ignores ClientToken: two sets of 2
    install(b.ec2_launch, "RunInstances", run)
    throttled = [True]
    install(b.ec2, "DescribeInstances", lambda r, n: ec2_error(r, "RequestLimitExceeded", "x", 503) if throttled[0]
            else None)
    # The answer is lost and every lookup throttled: a transient error, nothing sent again ...
    with pytest.raises(TransientBackendError):
        b.launch(spec)
    assert len(run.made) == 1
    # ... so only another object sending the same token (an old monitor) can make a second set; its lookup sees
    # 4 for 2, keeps the first 2 by launch time and id, and ends the others.
    other = make_backend(moto, aws_settle_wait_s=0.3)
    install(other.ec2_launch, "RunInstances", run)
    kept = other.launch(spec)
    assert len(run.made) == 2 and len(kept) == 2
    assert sorted(i["InstanceId"] for i in live(moto)) == sorted(kept)
    assert len(all_instances(moto, tag=(TAG_REQUEST, spec.request_token))) == 4
    throttled[0] = False
    assert sorted(b.launch(spec)) == sorted(kept)             # the first object's retry gets the same two
    assert len(run.made) == 2
