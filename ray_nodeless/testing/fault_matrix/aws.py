"""The matrix on the real AWS backend (boto3/botocore) against a moto server.

Faults are EC2's answers on the wire: one botocore `before-send` handler (`Wire`) on every EC2 client of each
provider object sees every request before it leaves and may answer it itself, as EC2 would: a capacity error
(InsufficientInstanceCapacity, HTTP 500 as AWS sends it), throttling (RequestLimitExceeded, 503), a lost response
(the request reaches moto and takes effect, then the read times out), a failed (503 / 401 AuthFailure) or empty
DescribeInstances page, a refused TerminateInstances, InvalidInstanceID.NotFound for instances just launched
(EC2's eventual consistency). Spot interruptions are terminations through a plain client.

moto 5.2.5 does not honour RunInstances' ClientToken (the same token launches new instances; checked again for
this module). With `honour_token` (the default) the wire emulates EC2's idempotency: a RunInstances whose
ClientToken was answered before gets the same answer (the same instances), and creates nothing; without it the
world is an EC2-compatible endpoint that ignores the token (moto as it is), where only the backend's settle step
keeps a re-send from making a second set.

EC2's eventual consistency on the listing side: a DescribeInstances page may miss instances (`next_describe`
"empty", or ("hide", ids): a short page), and after a lost answer the new instances may be listed one by one
(`lag_listing`: every DescribeInstances, the listing's and the token lookup's alike, shows one more). A spot
reclaim is a termination through a plain client with EC2's `Server.SpotInstanceTermination` state reason.

The clients retry nothing (`aws_max_attempts: 1`): botocore's standard retry sleeps up to seconds per retry, so an
injected fault stands for "still failing after the SDK's retries"; the backend's and the launcher's own retries
(same token) still run. The cloud's truth is read from moto's state in-process (no request, no fault).
"""
from __future__ import annotations

import random
import re
import threading
from collections import Counter
from typing import Any

import botocore.exceptions
from botocore.awsrequest import AWSPreparedRequest, AWSResponse

from ray_nodeless.providers.aws.launch_params import TAG_REQUEST
from ray_nodeless.providers.base import TAG_CLUSTER, TAG_INSTANCE_TYPE, TAG_PRICE
from ray_nodeless.ray_adapter.provider import NodelessProvider
from ray_nodeless.testing.moto_server import (
    CREDS, REGION, MotoServer, _Raw, ec2_describe_without, ec2_empty_describe, ec2_error, ec2_not_found, forward,
    query_params,
)
from ray_nodeless.testing.fault_matrix.world import CLUSTER, World

# moto launches any image id; a fixed one skips the slow first describe_images.
AMI = "ami-12c6146b"
LIVE = ("pending", "running")
SHAPES: dict[str, dict[str, float]] = {"gpu": {"CPU": 4, "GPU": 1}, "cpu": {"CPU": 8}}


def provider_config(moto: MotoServer) -> dict[str, Any]:
    return {
        "type": "external", "module": "ray_nodeless.NodelessProvider", "cloud": "aws", "region": REGION,
        "endpoint_url": moto.url, "image_id": AMI, "aws_credentials": dict(CREDS),
        "aws_max_attempts": 1, "aws_retry_base_delay_s": 0.0, "aws_settle_wait_s": 5.0,
        "list_cache_s": 0, "max_candidates_per_launch": 6, "launch_retry_backoff_s": 0,
        "exclude": {"gpus": ["M60", "K80"], "families": ["g5"]},
        "rules": [
            {"name": "gpu-spot-first", "match": {"GPU": ">=1"}, "capacity": ["spot", "on-demand"]},
            {"name": "cpu", "match": {}, "capacity": ["on-demand"]},
        ],
    }


class Wire:
    """The before-send handler: EC2's answers under fault, and ClientToken idempotency moto lacks."""

    def __init__(self, honour_token: bool = True) -> None:
        self.lock = threading.Lock()
        self.honour_token = honour_token
        self.capacity: list[tuple[str, str]] = []       # (zone or "*", "spot" / "on-demand" / "*")
        self.storm = False                              # throttle every RunInstances
        self.throttle_once = 0
        self.lose = 0                                   # RunInstances that run, then lose their answer
        self.storm_after_lost = False                   # once an answer is lost, throttle every RunInstances
        self.refuse_terminates = False
        self.lag_next = False                           # the next launched instances are not visible to EC2 yet:
        self.lagging: dict[str, set[str]] = {}          # id -> operations still to answer NotFound
        self.next_describe: list[Any] = []              # "throttle" | "auth" | "empty" | ("hide", ids), in turn
        self.lag_listing = False                        # the next lost launch's instances are listed one by one
        self.unlisted: list[str] = []                   # not listed yet; one more shown per DescribeInstances
        self.answers: dict[str, tuple[int, dict[str, str], bytes]] = {}      # ClientToken -> first answer
        self.created: list[tuple[str, int]] = []        # (request token tag, instances) per executed launch
        self.requests: Counter[str] = Counter()
        self.replayed = 0

    def install(self, provider: NodelessProvider) -> NodelessProvider:
        clients = provider.backend.clients  # type: ignore[attr-defined]  # this world's backend is an AwsBackend
        for client in clients:
            client.meta.events.register("before-send.ec2", self)
        return provider

    def __call__(self, request: AWSPreparedRequest, event_name: str = "", **_: Any) -> AWSResponse | None:
        op = event_name.rsplit(".", 1)[-1]
        with self.lock:
            self.requests[op] += 1
        if op == "RunInstances":
            return self._run_instances(request)
        if op == "DescribeInstances":
            with self.lock:
                kind = self.next_describe.pop(0) if self.next_describe else None
            if kind == "throttle":
                return ec2_error(request, "RequestLimitExceeded", "Request limit exceeded.", 503)
            if kind == "auth":
                return ec2_error(request, "AuthFailure", "AWS was not able to validate the provided access "
                                 "credentials", 401)
            if kind == "empty":
                return ec2_empty_describe(request)
            with self.lock:
                hidden = set(self.unlisted) | (set(kind[1]) if isinstance(kind, tuple) else set())
                if self.unlisted:
                    self.unlisted.pop(0)
            if hidden:
                return ec2_describe_without(request, hidden.__contains__)
        if op == "TerminateInstances" and self.refuse_terminates:
            return ec2_error(request, "RequestLimitExceeded", "Request limit exceeded.", 503)
        if op in ("TerminateInstances", "CreateTags"):
            ids = [v for k, v in query_params(request).items() if k.startswith(("InstanceId.", "ResourceId."))]
            with self.lock:
                lag = [i for i in ids if op in self.lagging.get(i, ())]
                for i in lag:
                    self.lagging[i].discard(op)
            if lag:             # EC2's eventual consistency right after RunInstances
                return ec2_not_found(request, lag)
        return None

    def _run_instances(self, request: AWSPreparedRequest) -> AWSResponse:
        q = query_params(request)
        zone = q.get("Placement.AvailabilityZone", "")
        capacity = "spot" if q.get("InstanceMarketOptions.MarketType") == "spot" else "on-demand"
        with self.lock:
            if self.storm or self.throttle_once:
                self.throttle_once = max(0, self.throttle_once - 1)
                return ec2_error(request, "RequestLimitExceeded", "Request limit exceeded.", 503)
            if any(z in ("*", zone) and c in ("*", capacity) for z, c in self.capacity):
                return ec2_error(request, "InsufficientInstanceCapacity",
                                 f"We currently do not have sufficient {q.get('InstanceType')} capacity in the "
                                 f"Availability Zone you requested ({zone}).", 500)
            token = q.get("ClientToken", "")
            if self.honour_token and token in self.answers:     # EC2: a repeated token gets the first answer
                self.replayed += 1
                status, headers, body = self.answers[token]
                return AWSResponse(request.url, status, headers, _Raw(body))
            resp = forward(request)                      # under the lock: a token is executed once
            headers = {"Content-Type": resp.headers.get("Content-Type", "text/xml")}
            if resp.status_code == 200:
                if token:
                    self.answers[token] = (200, headers, resp.content)
                tag = next((q[k.replace(".Key", ".Value")] for k, v in q.items()
                            if k.startswith("TagSpecification.1.Tag.") and k.endswith(".Key") and v == TAG_REQUEST),
                           token)
                ids = [m.decode() for m in re.findall(rb"<instanceId>([^<]+)</instanceId>", resp.content)]
                self.created.append((tag, len(ids)))
                if self.lag_next:
                    self.lag_next = False
                    self.lagging.update({i: {"TerminateInstances", "CreateTags"} for i in ids})
            lose = self.lose > 0 and resp.status_code == 200
            self.lose -= int(lose)
            if lose and self.storm_after_lost:
                self.storm = True                        # and every RunInstances after it is throttled
            if lose and self.lag_listing:
                # EC2 lists the new instances eventually, one by one: the first lookups see some, or none.
                self.lag_listing = False
                self.unlisted = ids[1:] if len(ids) > 1 else list(ids)
        if lose:
            raise botocore.exceptions.ReadTimeoutError(endpoint_url=request.url)
        return AWSResponse(request.url, resp.status_code, headers, _Raw(resp.content))


class AwsWorld(World):
    name = "aws"
    shapes = SHAPES
    max_count = 7
    max_live = 8

    def __init__(self, moto: MotoServer, honour_token: bool = True):
        super().__init__(provider_config(moto))
        self.moto = moto
        self.ec2 = moto.client()                # out of band: no wire, no faults
        self.wire = Wire(honour_token)
        if not honour_token:
            self.name = "aws-no-client-token"
        self.forbidden = self.forbidden_types("aws", REGION, {"M60", "K80"}, {"g5"})

    def _backend(self) -> Any:
        from moto.core import DEFAULT_ACCOUNT_ID
        from moto.ec2.models import ec2_backends

        return ec2_backends[DEFAULT_ACCOUNT_ID][REGION]

    def _instances(self) -> list[tuple[str, str, str, dict[str, str]]]:
        """(id, state, instance type, tags) of every instance moto holds, terminated ones included."""
        b = self._backend()
        return [(i.id, i._state.name, i.instance_type, dict(b.tags.get(i.id, {}))) for i in b.all_instances()]

    def tidy(self) -> None:
        """Forget terminated instances and the tags of deleted resources, as EC2 does after a while. moto keeps
        them forever, and its tag lookups scan every tag it holds, so each request would get slower."""
        with self.wire.lock:
            # A listing fault the step armed and its listings did not use up (a glitch of three empty pages met
            # by a listing that asked twice) is the step's: left queued, it would hit the next step's lookups by
            # id too, which the fault did not mean (a restarted object's first listing then found 4 live
            # instances "not believed empty" and raised, once in CI).
            self.wire.next_describe.clear()
        b = self._backend()
        for rid, res in list(b.reservations.items()):
            res.instances = [i for i in res.instances if i._state.name != "terminated"]
            if not res.instances:
                del b.reservations[rid]
        alive = {i.id for i in b.all_instances()} | set(b.volumes)
        for rid in [r for r in b.tags if r.startswith(("i-", "vol-")) and r not in alive]:
            del b.tags[rid]

    def new_provider(self) -> NodelessProvider:
        return self.wire.install(super().new_provider())

    def start(self) -> None:
        self.moto.reset()
        ec2 = self.ec2
        other = ec2.run_instances(ImageId=AMI, MinCount=1, MaxCount=1, InstanceType="m5.large", TagSpecifications=[
            {"ResourceType": "instance", "Tags": [{"Key": TAG_CLUSTER, "Value": "other"},
                                                  {"Key": TAG_INSTANCE_TYPE, "Value": "m5.large"}]}])
        untagged = ec2.run_instances(ImageId=AMI, MinCount=1, MaxCount=1, InstanceType="c5.large")
        self.foreign_ids = [r["Instances"][0]["InstanceId"] for r in (other, untagged)]
        self.foreign = {i: (state, itype, tags) for i, state, itype, tags in self._instances()}

    def ours(self) -> dict[str, str]:
        return {i: itype for i, state, itype, tags in self._instances()
                if state in LIVE and tags.get(TAG_CLUSTER) == CLUSTER}

    def cost(self) -> float:
        return sum(float(tags.get(TAG_PRICE, 0)) for i, state, itype, tags in self._instances()
                   if state in LIVE and tags.get(TAG_CLUSTER) == CLUSTER)

    def arm_orphan(self) -> bool:
        """The answer of the next RunInstances is lost, then every RunInstances is throttled and the lookups by the
        request tag fail until the call gives up: the settle step cannot know what was made, so it neither
        returns nor ends it, and create_node raises with the instances running (listed from the next step)."""
        w = self.wire
        w.lose, w.storm_after_lost = 1, True
        w.next_describe += ["throttle"] * 40
        return True

    def check_foreign(self) -> None:
        now = {i: (state, itype, tags) for i, state, itype, tags in self._instances() if i in self.foreign}
        assert now == self.foreign, f"aws: foreign instances changed: {now} != {self.foreign}"

    def batch_mark(self) -> int:
        return len(self.wire.created)

    def batch_made(self, mark: int) -> dict[str, int]:
        made: Counter[str] = Counter()
        for token, n in self.wire.created[mark:]:
            made[token] += n
        return dict(made)

    def inject_launch_fault(self, rng: random.Random) -> str | None:
        r, w = rng.random(), self.wire
        if r < 0.15:
            w.capacity.append((rng.choice(["*", "us-east-1a", "us-east-1b"]), rng.choice(["spot", "on-demand", "*"])))
            return "capacity"
        if r < 0.20:
            w.lose = 1
            return "lost_response"
        if r < 0.23:
            w.storm = True
            return "throttling_storm"
        if r < 0.28:
            w.throttle_once = 1
            return "throttled_once"
        if r < 0.31:
            # The answer is lost and the token lookups fail for a while: the settle step keeps looking (and the
            # launcher retries with the same token) but never sends RunInstances again without knowing.
            w.lose = 1
            w.next_describe += ["throttle"] * rng.randint(1, 3)
            return "lost_response_lookup_failed"
        if r < 0.35:
            # The new instances are unknown to EC2 for a moment: their first terminate and tag write answer
            # InvalidInstanceID.NotFound, which must not read as "already gone".
            w.lag_next = True
            return "not_found_after_launch"
        if r < 0.40:
            # The answer is lost and EC2 lists the new instances one by one: the lookup by the request tag sees
            # some (or none) of them at first. Before the settle step waited, the visible ones were terminated and
            # the re-sent token returned them (EC2), or a second set was made (no ClientToken).
            w.lose = 1
            w.lag_listing = True
            return "lost_response_partial_lookup"
        return None

    def clear_launch_faults(self) -> None:
        w = self.wire
        w.capacity.clear()
        w.storm, w.throttle_once, w.lose, w.lag_next, w.lag_listing = False, 0, 0, False, False
        w.storm_after_lost = False
        w.next_describe.clear()
        w.unlisted.clear()

    def fail_terminates(self) -> None:
        self.wire.refuse_terminates = True

    def clear_terminate_fault(self) -> None:
        self.wire.refuse_terminates = False

    def reclaim(self, machine_id: str) -> None:
        """EC2 takes a spot machine back: terminated, with the state reason EC2 gives a spot interruption."""
        from moto.ec2.models.instances import StateReason

        self.ec2.terminate_instances(InstanceIds=[machine_id])
        inst = self._backend().get_instance(machine_id)
        inst.state_reason = StateReason("Server.SpotInstanceTermination: Spot instance termination",
                                        "Server.SpotInstanceTermination")

    def fail_next_listing(self) -> None:
        self.wire.next_describe.append("throttle")

    def glitch_next_listing(self, rng: random.Random) -> str:
        kind = rng.choice(["throttle", "auth", "empty", "empty_twice", "empty_thrice", "partial"])
        if kind in ("empty_twice", "empty_thrice"):
            # The listing and the next DescribeInstances (the second look by id), and the one after, come back
            # empty: nothing the cloud shows nothing of is believed gone (kept for ttls.UNSEEN_GONE_S).
            self.wire.next_describe += ["empty"] * (2 if kind == "empty_twice" else 3)
            return f"list_{kind}"
        if kind == "partial":
            ours = sorted(self.ours())
            hide = set(rng.sample(ours, len(ours) // 2)) if len(ours) >= 2 else set(ours)
            self.wire.next_describe.append(("hide", frozenset(hide)))
            return "list_partial"
        self.wire.next_describe.append(kind)
        return {"throttle": "list_failure", "auth": "list_exception", "empty": "list_empty"}[kind]

    def empty_first_listing(self) -> bool:
        # One empty page, or two in a row (the listing and the second look by the cluster tag): DescribeTags
        # and a lookup by id then confirm what runs (providers/aws/listing.py).
        self.wire.next_describe += ["empty"] * (1 + int(len(self.wire.created) % 2))
        return True
