"""NodelessProvider on the AWS backend, through real boto3 against moto: the boot script of self-booting workers
and the launcher's fallback across offerings when EC2 answers with capacity errors or throttling."""
from __future__ import annotations

import pytest

from typing import Any

from ray_nodeless.testing.moto_server import REGION, MotoServer, ec2_error, install, query_params
from tests.providers.aws.helpers import CLUSTER, live


# ------------------------------------------------------------------ disable_node_updaters: the worker boots itself

def test_provider_gives_workers_a_boot_script_when_node_updaters_are_disabled(
        moto_iam: MotoServer, monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    moto = moto_iam
    import base64

    monkeypatch.setenv("HOME", str(tmp_path))     # Ray's key-pair step writes ~/.ssh/ray-autoscaler_*.pem

    import boto3

    from ray_nodeless.ray_adapter.provider import NodelessProvider

    cfg = {"cluster_name": CLUSTER, "max_workers": 1, "head_node_type": "head",
           "setup_commands": ["pip install ray-nodeless"], "worker_setup_commands": [],
           "worker_start_ray_commands": ["ray start --address=$RAY_HEAD_IP:6379"],
           "provider": {"type": "external", "module": "ray_nodeless.NodelessProvider", "cloud": "aws",
                        "region": REGION, "endpoint_url": moto.url, "image_id": moto.ami(), "head_ip": "10.0.0.5",
                        "disable_node_updaters": True,
                        "aws_credentials": {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}},
           "available_node_types": {"head": {"resources": {"CPU": 2}, "node_config": {}},
                                    "gpu_worker": {"resources": {"CPU": 4, "GPU": 1}, "node_config": {}}}}
    boot = NodelessProvider.bootstrap_config(cfg)
    p = NodelessProvider(boot["provider"], CLUSTER)
    p.create_node_with_resources_and_labels({}, {"ray-node-type": "worker", "ray-user-node-type": "gpu_worker"}, 1,
                                           {"CPU": 4, "GPU": 1}, {})
    [iid] = p.non_terminated_nodes({})
    ec2 = boto3.client("ec2", endpoint_url=moto.url, region_name=REGION, aws_access_key_id="testing",
                       aws_secret_access_key="testing")
    raw = ec2.describe_instance_attribute(InstanceId=iid, Attribute="userData")["UserData"]["Value"]
    script = base64.b64decode(raw).decode()
    assert script.startswith("#!/bin/bash")
    assert "latest/meta-data/instance-id" in script and "export RAY_CLOUD_INSTANCE_ID" in script
    assert "export RAY_NODE_TYPE_NAME=gpu_worker" in script and "export RAY_HEAD_IP=10.0.0.5" in script
    assert script.index("pip install ray-nodeless") < script.index("ray start --address=$RAY_HEAD_IP:6379")
    assert '"GPU": 1.0' in script   # RAY_OVERRIDE_RESOURCES: the chosen instance's resources


# ------------------------------------------------------------------ the provider's fallback, through real boto3

def _provider(moto: MotoServer, **provider: Any):
    from ray_nodeless.ray_adapter.provider import NodelessProvider

    cfg = {"type": "external", "module": "ray_nodeless.NodelessProvider", "cloud": "aws", "region": REGION,
           "endpoint_url": moto.url, "image_id": moto.ami(), "list_cache_s": 0, "aws_retry_base_delay_s": 0.0,
           "aws_credentials": {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"},
           "rules": [{"name": "gpu-spot-first", "match": {"GPU": ">=1"}, "capacity": ["spot", "on-demand"]}]}
    cfg.update(provider)
    return NodelessProvider(cfg, CLUSTER)


GPU_TAGS = {"ray-node-type": "worker", "ray-user-node-type": "gpu_worker", "ray-node-status": "uninitialized",
            "ray-node-name": "w", "ray-launch-config": "x"}


def _launched(p) -> list[tuple[str, str, str]]:
    out = []
    for iid in p.non_terminated_nodes({}):
        t = p.node_tags(iid)
        out.append((t["nodeless-instance-type"], t["nodeless-zone"], t["nodeless-capacity"]))
    return sorted(out)


def test_provider_capacity_error_on_the_cheapest_offering_launches_the_next_in_the_same_call(moto: MotoServer) -> None:
    p = _provider(moto)
    plan = p.planner.plan(p.resolver.request("gpu_worker", {"CPU": 4, "GPU": 1}, {}, False))
    first, second = plan.top(2)

    def ice(request, n):
        q = query_params(request)
        if (q.get("InstanceType"), q.get("Placement.AvailabilityZone")) == (first.instance_type.name, first.zone):
            return ec2_error(request, "InsufficientInstanceCapacity", "no capacity", 500)
        return None

    hook = install(p.backend.ec2_launch, "RunInstances", ice)
    p.create_node_with_resources_and_labels({}, dict(GPU_TAGS), 1, {"CPU": 4, "GPU": 1}, {})
    assert hook.calls == 2                                    # the failed offering once, then the next one
    assert _launched(p) == [(second.instance_type.name, second.zone, second.capacity)]
    assert p.unavailable.reason(first) == "InsufficientInstanceCapacity"
    assert len(live(moto)) == 1


def test_provider_all_spot_failing_falls_back_to_on_demand(moto: MotoServer) -> None:
    p = _provider(moto)

    def no_spot(request, n):
        if query_params(request).get("InstanceMarketOptions.MarketType") == "spot":
            return ec2_error(request, "InsufficientInstanceCapacity", "no spot capacity", 500)
        return None

    hook = install(p.backend.ec2_launch, "RunInstances", no_spot)
    p.create_node_with_resources_and_labels({}, dict(GPU_TAGS), 1, {"CPU": 4, "GPU": 1}, {})
    plan = p.planner.plan(p.resolver.request("gpu_worker", {"CPU": 4, "GPU": 1}, {}, False))
    n_spot = sum(1 for o in plan.candidates() if o.capacity == "spot")
    # Spot candidates once each, up to the per-capacity-type cap, then the first on-demand one.
    assert hook.calls == min(n_spot, p.settings.max_candidates_per_launch) + 1
    [(itype, zone, cap)] = _launched(p)
    first_od = next(o for o in plan.candidates() if o.capacity == "on-demand")
    assert (itype, zone, cap) == (first_od.instance_type.name, first_od.zone, "on-demand")
    [inst] = live(moto)
    assert inst.get("InstanceLifecycle") != "spot"


def test_provider_throttling_storm_launches_exactly_the_requested_number(moto: MotoServer) -> None:
    p = _provider(moto)
    install(p.backend.ec2_launch, "RunInstances",
            lambda r, n: ec2_error(r, "RequestLimitExceeded", "Request limit exceeded.", 503) if n <= 3 else None)
    p.create_node_with_resources_and_labels({}, dict(GPU_TAGS), 3, {"CPU": 4, "GPU": 1}, {})
    assert len(p.non_terminated_nodes({})) == 3 and len(live(moto)) == 3
