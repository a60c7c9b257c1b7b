"""The head node's IAM policy (cluster-configs/aws-iam-policy.json) against moto's IAM enforcement.

What moto 5.2.5 enforces (read in moto/core/authorization.py and moto/iam/access_control.py, pinned by the
`test_moto_*` tests below):
- Enforcement starts after `INITIAL_NO_AUTH_ACTION_COUNT` unauthenticated requests (env var read at import into
  `moto.settings`; in server mode POST /moto-api/reset-auth with the new count switches it at run time).
- Then every request must be SigV4-signed with an access key of an IAM user (or assumed role) moto knows.
- Identity policies are evaluated on **Action** and **Effect** only in practice: the **Resource** of a statement is
  matched as a string against the literal `"*"` (EC2 handlers pass no resource ARN), so a statement scoped to
  `arn:aws:ec2:*:*:instance/*` never matches; **Conditions** are not evaluated for identity policies (no request
  context is passed, and only StringEquals is implemented, vacuously true without values).
- `iam:PassRole` and other implied permissions of an action are not checked.

So the test runs the policy's exact action set with Resource "*" and no conditions (`moto_view`): it proves that
these actions are sufficient for launch/list/tag/terminate and the catalog refresh, and that anything else is
refused with an error our backend reports naming the action. The tag conditions themselves (the actual least
privilege) are checked structurally here and must be verified against real IAM (e.g. the IAM policy simulator).
"""
from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, Iterator

import botocore.exceptions
import pytest
import requests

from ray_nodeless.errors import BackendError, ForeignMachineError
from ray_nodeless.providers.aws.backend import AwsBackend
from ray_nodeless.core.catalog.refresh import MemoryCache, resolve_live
from ray_nodeless.providers.aws.catalog import live_catalog

from ray_nodeless.testing.moto_server import REGION, MotoServer
from tests.providers.aws.helpers import CLUSTER, make_spec, offering
from tests import REPO_ROOT

POLICY_PATH = REPO_ROOT / "cluster-configs" / "aws-iam-policy.json"


def load_policy() -> dict:
    return json.loads(POLICY_PATH.read_text())


def actions(policy: dict) -> set[str]:
    out: set[str] = set()
    for st in policy["Statement"]:
        a = st["Action"]
        out.update([a] if isinstance(a, str) else a)
    return out


def moto_view(policy: dict, drop: set[str] = frozenset()) -> dict:
    """The policy as moto can evaluate it: same actions and effects, Resource "*", no conditions."""
    p = copy.deepcopy(policy)
    statements = []
    for st in p["Statement"]:
        acts = [st["Action"]] if isinstance(st["Action"], str) else list(st["Action"])
        acts = [a for a in acts if a not in drop]
        if acts:
            statements.append({"Sid": st["Sid"], "Effect": st["Effect"], "Action": acts, "Resource": "*"})
    p["Statement"] = statements
    return p


class Head:
    """An IAM user holding one policy, and moto switched to enforce IAM."""

    def __init__(self, moto: MotoServer, policy: dict, name: str = "ray-head"):
        iam = moto.client("iam")
        iam.create_user(UserName=name)
        iam.put_user_policy(UserName=name, PolicyName="ray-nodeless-head", PolicyDocument=json.dumps(policy))
        key = iam.create_access_key(UserName=name)["AccessKey"]
        self.creds = {"aws_access_key_id": key["AccessKeyId"], "aws_secret_access_key": key["SecretAccessKey"]}
        self.moto = moto

    def backend(self, **extra: Any) -> AwsBackend:
        cfg = {"region": REGION, "endpoint_url": self.moto.url, "image_id": self.moto.ami(),
               "aws_credentials": self.creds, "aws_retry_base_delay_s": 0.0, "aws_max_attempts": 2}
        cfg.update(extra)
        return AwsBackend.from_provider(cfg, CLUSTER)

    def client(self, service: str = "ec2"):
        return self.moto.client(service, **self.creds)


@pytest.fixture
def enforce(moto: MotoServer) -> Iterator[Any]:
    """Returns a function that switches IAM enforcement on (after the users were made); always switched off after."""
    moto.ami()                                   # looked up with the admin credentials, before enforcement

    def on() -> None:
        requests.post(f"{moto.url}/moto-api/reset-auth", data=b"0", timeout=10).raise_for_status()

    try:
        yield on
    finally:
        requests.post(f"{moto.url}/moto-api/reset-auth", data=b"inf", timeout=10).raise_for_status()


def test_policy_is_least_privilege_by_construction() -> None:
    policy = load_policy()
    assert policy["Version"] == "2012-10-17"
    assert not any(a.endswith("*") for a in actions(policy))             # no wildcard actions
    by_action: dict[str, list[dict]] = {}
    for st in policy["Statement"]:
        assert st["Effect"] == "Allow"
        for a in [st["Action"]] if isinstance(st["Action"], str) else st["Action"]:
            by_action.setdefault(a, []).append(st)
    # Every mutating call is scoped to resource ARNs, and the ones on instances carry a tag condition.
    for a in ("ec2:RunInstances", "ec2:CreateTags", "ec2:TerminateInstances", "iam:PassRole"):
        assert all(st["Resource"] != "*" for st in by_action[a]), a
    [term] = by_action["ec2:TerminateInstances"]
    assert term["Condition"] == {"Null": {"ec2:ResourceTag/ray-cluster-name": "false"}}
    create_tags = by_action["ec2:CreateTags"]
    assert {json.dumps(st["Condition"], sort_keys=True) for st in create_tags} == {
        json.dumps({"StringEquals": {"ec2:CreateAction": "RunInstances"}}),
        json.dumps({"Null": {"ec2:ResourceTag/ray-cluster-name": "false"}}),
    }
    run = [st for st in by_action["ec2:RunInstances"] if "Condition" in st]
    assert run and run[0]["Condition"] == {"Null": {"aws:RequestTag/ray-cluster-name": "false"}}
    assert set(run[0]["Resource"]) == {"arn:aws:ec2:*:*:instance/*", "arn:aws:ec2:*:*:volume/*"}


def test_head_policy_suffices_and_nothing_else_is_allowed(moto: MotoServer, enforce, tmp_path: Path) -> None:
    policy = load_policy()
    head = Head(moto, moto_view(policy))
    other = moto.client().run_instances(ImageId=moto.ami(), MinCount=1, MaxCount=1)["Instances"][0]["InstanceId"]
    enforce()

    b = head.backend()
    used: set[str] = set()
    for c in b.clients:
        c.meta.events.register("before-call.ec2", lambda model, **_: used.add(f"ec2:{model.name}"))
    ids = b.launch(make_spec(count=2))
    [spot] = b.launch(make_spec(offering(zone="us-east-1b", capacity="spot")))
    assert {m.id for m in b.list_machines()} == set(ids) | {spot}
    b.set_tags(ids[0], {"ray-node-status": "up-to-date"})
    with pytest.raises(ForeignMachineError):         # ours ended; the untagged instance refused
        b.terminate(ids + [spot, other])
    assert b.list_machines() == []
    b.reservations()                                 # capacity `reserved`: its listing
    assert used <= actions(policy), used - actions(policy)
    assert {"ec2:RunInstances", "ec2:DescribeInstances", "ec2:DescribeSubnets", "ec2:CreateTags",
            "ec2:TerminateInstances", "ec2:DescribeCapacityReservations"} <= used

    # The catalog refresh reads specs, offerings and spot history with the same permissions.
    r = resolve_live(live_catalog(REGION, session_kwargs=head.creds, endpoint_url=moto.url), cache_dir=tmp_path,
                     ttl_s=0, memory=MemoryCache())
    assert r.source == "live" and len(r.catalog.types("aws")) > 1300

    # Outside the policy: refused, and the error names the action.
    ec2 = head.client()
    with pytest.raises(botocore.exceptions.ClientError) as e:
        ec2.delete_vpc(VpcId="vpc-12345678")
    assert e.value.response["Error"]["Code"] in ("AccessDenied", "UnauthorizedOperation")
    assert "ec2:DeleteVpc" in str(e.value)
    with pytest.raises(botocore.exceptions.ClientError):
        ec2.stop_instances(InstanceIds=[other])


def test_missing_permission_is_a_backend_error_naming_the_action(moto: MotoServer, enforce) -> None:
    head = Head(moto, moto_view(load_policy(), drop={"ec2:TerminateInstances"}))
    enforce()
    b = head.backend()
    ids = b.launch(make_spec())
    with pytest.raises(BackendError) as e:
        b.terminate(ids)
    assert e.value.category in ("AccessDenied", "UnauthorizedOperation")
    assert "ec2:TerminateInstances" in str(e.value) and "IAM policy" in str(e.value)
    assert [m.id for m in b.list_machines()] == ids          # nothing was terminated


def test_moto_matches_statement_resources_against_literal_star(moto: MotoServer, enforce) -> None:
    """Pins moto's limitation: the real (resource-scoped) policy is refused RunInstances by moto.
    If this starts failing, moto evaluates resource ARNs now and the real policy can be tested directly."""
    head = Head(moto, load_policy())
    enforce()
    with pytest.raises(BackendError) as e:
        head.backend().launch(make_spec())
    assert "ec2:RunInstances" in str(e.value)


def test_moto_ignores_identity_policy_conditions(moto: MotoServer, enforce) -> None:
    """Pins moto's limitation: a tag condition that should refuse the call does not."""
    policy = moto_view(load_policy())
    for st in policy["Statement"]:
        if "ec2:TerminateInstances" in st["Action"]:
            st["Condition"] = {"StringEquals": {"ec2:ResourceTag/ray-cluster-name": "some-other-cluster"}}
    head = Head(moto, policy)
    enforce()
    b = head.backend()
    ids = b.launch(make_spec())
    b.terminate(ids)                       # real IAM would refuse: the instance is tagged c1
    assert b.list_machines() == []
