"""Shared helpers of the AWS backend tests: a backend on the moto server, launch specs, and what moto holds."""
from __future__ import annotations

from typing import Any

from ray_nodeless.core.catalog import InstanceType, Offering
from ray_nodeless.providers.aws.backend import AwsBackend
from ray_nodeless.providers.base import TAG_CLUSTER, LaunchSpec
from ray_nodeless.testing.moto_server import REGION, MotoServer, unique

CLUSTER = "c1"
M5 = InstanceType(cloud="aws", name="m5.large", family="m5", vcpus=2, memory_gib=8, machine_type="m5.large")
G4 = InstanceType(cloud="aws", name="g4dn.xlarge", family="g4dn", vcpus=4, memory_gib=16, gpu_model="T4",
                  gpu_count=1, gpu_memory_gib=16, machine_type="g4dn.xlarge")


def offering(t: InstanceType = M5, zone: str = "us-east-1a", capacity: str = "on-demand") -> Offering:
    return Offering(instance_type=t, region=REGION, zone=zone, capacity=capacity, hourly_price=0.096)


def make_backend(moto: MotoServer, cluster: str = CLUSTER, **extra: Any) -> AwsBackend:
    cfg: dict[str, Any] = {
        "region": REGION, "endpoint_url": moto.url, "image_id": moto.ami(),
        "aws_credentials": {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"},
        "aws_retry_base_delay_s": 0.0, "aws_max_attempts": 5,
    }
    cfg.update(extra)
    return AwsBackend.from_provider(cfg, cluster)


def make_spec(off: Offering | None = None, count: int = 1, cluster: str = CLUSTER, node_config: dict | None = None,
              token: str | None = None) -> LaunchSpec:
    off = off or offering()
    tags = {
        TAG_CLUSTER: cluster, "ray-node-type": "worker", "ray-user-node-type": "cpu",
        "ray-node-name": f"ray-{cluster}-worker", "ray-node-status": "uninitialized",
        "nodeless-instance-type": off.instance_type.name, "nodeless-zone": off.zone,
        "nodeless-capacity": off.capacity, "nodeless-hourly-price": str(off.hourly_price),
    }
    return LaunchSpec(cluster_name=cluster, node_type="cpu", offering=off, count=count, tags=tags,
                      node_config=dict(node_config or {}), request_token=token or unique("tok"))


def all_instances(moto: MotoServer, tag: tuple[str, str] | None = None, **filters: list[str]) -> list[dict]:
    ec2 = moto.client()
    f = [{"Name": k.replace("_", "-"), "Values": v} for k, v in filters.items()]
    if tag:
        f.append({"Name": f"tag:{tag[0]}", "Values": [tag[1]]})
    out = []
    for page in ec2.get_paginator("describe_instances").paginate(Filters=f):
        for r in page["Reservations"]:
            out.extend(r["Instances"])
    return out


def live(moto: MotoServer) -> list[dict]:
    return all_instances(moto, instance_state_name=["pending", "running"])


def tags_of(inst: dict) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in inst.get("Tags", [])}


def capture_params(backend: AwsBackend) -> list[dict]:
    """RunInstances parameters as the backend built them (before serialisation)."""
    seen: list[dict] = []
    backend.ec2_launch.meta.events.register(
        "provide-client-params.ec2.RunInstances", lambda params, **_: seen.append(dict(params)))
    return seen
