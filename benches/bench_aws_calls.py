"""EC2 API calls and wall time per autoscaler update: ray_nodeless's NodelessProvider (cloud aws, registration vm)
vs Ray's own AWSNodeProvider, both against one moto server, at 10, 100 and 1,000 instances.

One "update" is what the v2 NodeProviderAdapter (and v1's update loop) does per round: `non_terminated_nodes({})`,
then `node_tags`, `is_running` and `internal_ip` for every node. Caches are expired between updates (ours:
`list_cache_s: 0`; Ray's re-lists on every non_terminated_nodes call anyway). Instances are created directly with
boto3, carrying the tags both providers filter on. Calls are counted with botocore `before-call.ec2.*` hooks on each
provider's own clients (one count per API operation, retries excluded).

    .venv/bin/python benches/bench_aws_calls.py [--sizes 10,100,1000] [--updates 2] [--json out.json]
"""
from __future__ import annotations

import argparse
import collections
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import boto3

from ray_nodeless.testing.moto_server import CREDS, REGION, start_moto_server  # noqa: E402

from ray_nodeless.ray_adapter.provider import NodelessProvider  # noqa: E402


class Counter:
    """Counts API operations (before-call) and the time spent inside them (before-call -> after-call: request,
    moto's handling, response parsing)."""

    def __init__(self) -> None:
        self.ops: collections.Counter[str] = collections.Counter()
        self.api_s = 0.0
        self._t0: float | None = None

    def __call__(self, model: Any = None, **_: Any) -> None:
        self.ops[model.name if model is not None else "?"] += 1
        self._t0 = time.perf_counter()

    def after(self, **_: Any) -> None:
        if self._t0 is not None:
            self.api_s += time.perf_counter() - self._t0
            self._t0 = None

    def attach(self, client: Any) -> None:
        client.meta.events.register("before-call.ec2", self)
        client.meta.events.register("after-call.ec2", self.after)

    def take(self) -> tuple[dict[str, int], float]:
        out, api = dict(self.ops), self.api_s
        self.ops.clear()
        self.api_s = 0.0
        return out, api


def populate(url: str, ami: str, cluster: str, n: int) -> None:
    ec2 = boto3.client("ec2", endpoint_url=url, region_name=REGION, **CREDS)
    tags = [{"Key": k, "Value": v} for k, v in {
        "ray-cluster-name": cluster, "ray-node-type": "worker", "ray-user-node-type": "gpu_worker",
        "ray-node-name": f"ray-{cluster}-worker", "ray-node-status": "up-to-date", "ray-launch-config": "bench",
        "nodeless-instance-type": "g4dn.xlarge", "nodeless-zone": "us-east-1a", "nodeless-capacity": "spot",
        "nodeless-hourly-price": "0.1578", "nodeless-rule": "gpu-workers-spot-first",
    }.items()]
    left = n
    while left:
        k = min(left, 250)
        ec2.run_instances(ImageId=ami, InstanceType="g4dn.xlarge", MinCount=k, MaxCount=k,
                          TagSpecifications=[{"ResourceType": "instance", "Tags": tags}])
        left -= k


def one_update(p: Any) -> int:
    ids = p.non_terminated_nodes({})
    for i in ids:
        p.node_tags(i)
        p.is_running(i)
        p.internal_ip(i)
    return len(ids)


def measure(p: Any, counter: Counter, n: int, updates: int) -> dict[str, Any]:
    assert one_update(p) == n      # warm-up: client set-up, first listing
    counter.take()
    walls = []
    for _ in range(updates):
        t0 = time.perf_counter()
        got = one_update(p)
        walls.append(time.perf_counter() - t0)
        assert got == n, (got, n)
    ops, api = counter.take()
    wall = sum(walls) / updates
    return {"calls_per_update": {k: v / updates for k, v in sorted(ops.items())},
            "total_calls_per_update": sum(ops.values()) / updates,
            "wall_s_per_update": wall, "api_s_per_update": api / updates,
            "provider_s_per_update": wall - api / updates, "walls_s": walls}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="10,100,1000")
    ap.add_argument("--updates", type=int, default=2)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    logging.basicConfig(level=logging.ERROR)
    for k in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_EC2", "AWS_SESSION_TOKEN"):
        os.environ.pop(k, None)
    os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION=REGION)

    from ray.autoscaler._private.aws.node_provider import AWSNodeProvider

    srv = start_moto_server()
    results = []
    try:
        ami = srv.ami()
        for n in [int(s) for s in args.sizes.split(",")]:
            cluster = f"bench-{n}"
            t0 = time.perf_counter()
            populate(srv.url, ami, cluster, n)
            t_pop = time.perf_counter() - t0

            ours_c, rays_c = Counter(), Counter()
            ours = NodelessProvider({
                "type": "external", "module": "ray_nodeless.NodelessProvider", "cloud": "aws", "region": REGION,
                "registration": "vm", "endpoint_url": srv.url, "aws_credentials": dict(CREDS), "image_id": ami,
                "list_cache_s": 0,
            }, cluster)
            for c in ours.backend.clients:
                ours_c.attach(c)
            rays = AWSNodeProvider({"type": "aws", "region": REGION,
                                    "aws_credentials": {"endpoint_url": srv.url, **CREDS}}, cluster)
            for res in (rays.ec2, rays.ec2_fail_fast):
                rays_c.attach(res.meta.client)

            row: dict[str, Any] = {"size": n, "populate_s": round(t_pop, 2)}
            row["ours"] = measure(ours, ours_c, n, args.updates)
            row["ray"] = measure(rays, rays_c, n, args.updates)
            row["wall_ratio_ours_over_ray"] = row["ours"]["wall_s_per_update"] / row["ray"]["wall_s_per_update"]
            results.append(row)
            print(f"size {n}: done (populate {t_pop:.1f} s)", file=sys.stderr, flush=True)
    finally:
        srv.server.stop()

    def ops(d: dict[str, float]) -> str:
        return ", ".join(f"{k} {v:g}" for k, v in d.items()) or "-"

    print()
    print(f"{'size':>5} | {'calls/update ours':<28} | {'calls/update Ray':<28} | {'wall ours':>9} | "
          f"{'wall Ray':>9} | {'ours/Ray':>8} | {'outside API ours':>16} | {'outside API Ray':>15}")
    print("-" * 140)
    for r in results:
        print(f"{r['size']:>5} | {ops(r['ours']['calls_per_update']):<28} | {ops(r['ray']['calls_per_update']):<28} | "
              f"{r['ours']['wall_s_per_update'] * 1000:>7.1f}ms | {r['ray']['wall_s_per_update'] * 1000:>7.1f}ms | "
              f"{r['wall_ratio_ours_over_ray']:>8.2f} | {r['ours']['provider_s_per_update'] * 1000:>14.1f}ms | "
              f"{r['ray']['provider_s_per_update'] * 1000:>13.1f}ms")
    print()
    print(json.dumps(results, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
