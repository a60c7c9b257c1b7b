#!/usr/bin/env python3
"""Ours against Karpenter, on the same catalog and the same demands, in one run (issue 29).

    make karpenter                                        # Karpenter v1.10.0's kwok provider, once (Go module proxy)
    .venv/bin/python benches/bench_vs_karpenter.py        # AWS us-west-2, every workload
    .venv/bin/python benches/bench_vs_karpenter.py --workloads burst-300,gpu-heavy-60 --json

Per workload, three columns:
- ours: the shape-open packer's plan (the first `OpenTypes.step` the monitor runs for the pending demands, as
  bench_open_types.py's (b)) under cluster-configs/local-nodeless.yaml's rules (spot first, GPU models M60 and K80
  excluded, the previous generation left out) on the region's embedded catalog;
- Karpenter: the real Karpenter core with its kwok provider (`sigs.k8s.io/karpenter/kwok`) on the project's real
  Kubernetes API server, reading the same offerings from an instance-types file, with a NodePool stating the same
  rules (benches/karpenter_side.py says how each piece maps; the output prints both sides), given the demands as
  pending pods; what it decided is its NodeClaims, priced from the same offerings;
- Ray v2 on three declared worker groups (4 CPU, 4 CPU + 1 GPU, 16 CPU; each priced at its cheapest fit): Ray's own
  scheduler for the same demands, with what it cannot serve counted (bench_open_types.py's (c)).
For each: $/h of what is launched, machines, the largest machine, unserved demands, and the decision time (ours: the
plan; Karpenter: from the last pod created to its last NodeClaim, which includes its batching window of 1 s idle /
10 s at most; Ray: its scheduler call).

Karpenter binds its metrics and health endpoints on all interfaces (":port", no bind-address option), so the bench
re-executes itself in a private network namespace (`unshare -n`, only loopback) before any server starts: nothing
it runs is reachable from outside. Needs root (unshare) and `make karpenter`.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benches"))

import karpenter_side as KS  # noqa: E402

IN_NETNS = "RAY_NODELESS_BENCH_NETNS"
GIB = 1024 ** 3
SMALL = ["shape-open-10", "burst-300", "gpu-heavy-60", "selectors-60"]
WORKLOADS = ["shape-open-10", "shape-open-100", "shape-open-1000", "gpu-heavy-60", "selectors-60", "burst-300"]


def _state(items: list[tuple[dict[str, float], list]]) -> Any:
    """A ClusterResourceState with these pending requests (resources, Ray label selectors with fallbacks)."""
    from bench_open_types import IN, NOT_IN
    from ray.autoscaler.v2.utils import ResourceRequestUtil
    from ray.core.generated import autoscaler_pb2, common_pb2

    ops = {IN: common_pb2.LabelSelectorOperator.LABEL_OPERATOR_IN,
           NOT_IN: common_pb2.LabelSelectorOperator.LABEL_OPERATOR_NOT_IN}
    state = autoscaler_pb2.ClusterResourceState()
    head = state.node_states.add()
    head.node_id, head.instance_id, head.ray_node_type_name = b"head", "head-0", "head"
    head.status = autoscaler_pb2.NodeStatus.RUNNING
    head.total_resources["CPU"] = 0
    reqs = [ResourceRequestUtil.make(res, label_selectors=[[(k, ops[op], v) for k, op, v in s] for s in sels] or None)
            for res, sels in items]
    state.pending_resource_requests.extend(ResourceRequestUtil.group_by_count(reqs))
    return state


def workload(name: str) -> Any:
    from bench_open_types import IN, MARKET, NOT_IN, ZONE, cluster_state

    if name.startswith("shape-open-"):
        return cluster_state(int(name.rsplit("-", 1)[1]))
    if name == "burst-300":
        return _state([({"CPU": 1}, [])] * 300)
    if name == "gpu-heavy-60":
        kinds = [({"CPU": 4, "GPU": 1}, []), ({"CPU": 8, "GPU": 2}, []),
                 ({"CPU": 1, "GPU": 1, "accelerator_type:L4": .001}, []),
                 ({"CPU": 4, "GPU": 4, "accelerator_type:A100": .001}, []),
                 ({"CPU": 2, "GPU": 1, "accelerator_type:T4": .001}, []), ({"CPU": 16, "GPU": 8}, [])]
        return _state([kinds[i % len(kinds)] for i in range(60)])
    if name == "selectors-60":
        kinds = [({"CPU": 2}, [[(MARKET, IN, ["on-demand"])]]), ({"CPU": 4}, [[(MARKET, IN, ["spot"])]]),
                 ({"CPU": 1}, [[(ZONE, IN, ["us-west-2b"])]]), ({"CPU": 8, "memory": 32 * GIB},
                                                               [[(ZONE, NOT_IN, ["us-west-2a", "us-west-2b"])]]),
                 ({"CPU": 2, "GPU": 1}, [[(MARKET, IN, ["spot"]), (ZONE, IN, ["us-west-2c"])], []])]
        return _state([kinds[i % len(kinds)] for i in range(60)])
    raise SystemExit(f"--workloads: unknown workload {name!r} (known: {', '.join(WORKLOADS)})")


def config(region: str) -> dict[str, Any]:
    from bench_open_types import base_config

    cfg = base_config()
    cfg["provider"]["region"] = region
    return cfg


def ours(state: Any, region: str) -> tuple[dict[str, Any], Any]:
    from bench_open_types import ShapeOpen

    from ray_nodeless.providers.base import TAG_RAY_NODE_KIND, TAG_RAY_USER_NODE_TYPE, Machine

    so = ShapeOpen(vectorized=False, config=config(region))
    head = {"head-0": Machine("head-0", {TAG_RAY_USER_NODE_TYPE: "head", TAG_RAY_NODE_KIND: "head"})}
    t = time.perf_counter()
    first = so.step(state, head)
    ms = (time.perf_counter() - t) * 1000
    p = first.packing
    types = {n: p.types[n].offering for n in p.new}
    largest = max(types.values(), key=lambda o: (o.instance_type.vcpus, o.instance_type.memory_gib), default=None)
    return ({"per_h": round(p.hourly, 4), "machines": sum(p.new.values()),
             "largest": largest.instance_type.name if largest else None,
             "unserved": sum(max(1, d.count) for d in p.infeasible), "decided_s": round(ms / 1000, 3),
             "by_type": dict(sorted(_count({f"{types[n].instance_type.name} {types[n].capacity}": c
                                            for n, c in p.new.items()}).items()))}, so)


def _count(weighted: dict[str, int]) -> dict[str, int]:
    out: dict[str, int] = {}
    for k, c in weighted.items():
        out[k] = out.get(k, 0) + c
    return out


def ray_three_types(state: Any, so: Any) -> dict[str, Any]:
    from bench_open_types import THREE_TYPES, head_instance, launched, node_type_configs, schedule, three_type_config

    from ray_nodeless.core.demand import Demand, canonical_resources

    import yaml
    ntc, ac = node_type_configs(yaml.safe_dump(three_type_config()))
    t = time.perf_counter()
    reply = schedule(state, ntc, ac, [head_instance(state)])
    s = time.perf_counter() - t
    fits = {n: so.fitter.fit(Demand(canonical_resources(res))) for n, res in THREE_TYPES.items()}
    got = launched(reply)
    unserved = sum(r.count if hasattr(r, "count") else 1 for r in reply.infeasible_resource_requests)
    unserved += sum(len(g.requests) for g in reply.infeasible_gang_resource_requests)
    return {"per_h": round(sum(fits[t].price * c for t, c in got.items()), 4), "machines": sum(got.values()),
            "largest": "cpu16 " + fits["cpu16"].offering.instance_type.name if got.get("cpu16") else
            (max(got, key=lambda t: THREE_TYPES[t]["CPU"]) if got else None),
            "unserved": unserved, "decided_s": round(s, 3), "by_type": got}


def karpenter_largest(by_type: dict[str, int], types: list[dict[str, Any]]) -> str | None:
    size = {t["name"]: int(t["resources"]["cpu"].rstrip("m")) for t in types}
    names = [k.split(" ")[0] for k in by_type]
    return max(names, key=lambda n: size.get(n, 0), default=None)


def equivalence(region: str, families: list[str], gpus: list[str]) -> list[str]:
    provider = config(region)["provider"]
    rules = "; ".join(f"{r['name']}: match {r.get('match') or {}} capacity {r.get('capacity')}"
                      for r in provider.get("rules") or [])
    return [
        f"ours:      cluster-configs/local-nodeless.yaml ({region}): rules {rules}; exclude "
        f"{provider.get('exclude')}; previous-generation and retired families left out ({len(families)} here)",
        f"Karpenter: NodePool {KS.K_CAPACITY} In [spot, on-demand] (its cheapest offering first); {KS.K_FAMILY} "
        f"NotIn the same {len(families)} families; {KS.GPU_MODEL} NotIn {gpus}; arch amd64 and arm64; no "
        "consolidation; capacity = shape + kwok's kube-reserved (100m, 10Mi); pods per node unlimited",
    ]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--region", default="us-west-2")
    ap.add_argument("--workloads", default=",".join(WORKLOADS), help=f"comma-separated, of {', '.join(WORKLOADS)}")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if os.environ.get(IN_NETNS) != "1":
        if shutil.which("unshare") is None or os.geteuid() != 0:
            raise SystemExit("bench_vs_karpenter needs root and `unshare` (Karpenter listens on all interfaces: the "
                             "bench runs it in a private network namespace)")
        cmd = ["unshare", "-n", "sh", "-c", 'ip link set lo up && exec "$0" "$@"', sys.executable,
               str(Path(__file__).resolve()), *(argv if argv is not None else sys.argv[1:])]
        raise SystemExit(subprocess.run(cmd, env=dict(os.environ, **{IN_NETNS: "1"})).returncode)

    from ray_nodeless.core.family_names import AWS_PREVIOUS_GENERATION, AWS_RETIRED_FAMILIES
    from ray_nodeless.testing.k8s_control_plane import ControlPlane, cache_dir

    out_dir = cache_dir()
    if not (out_dir / "karpenter" / ".stamp").is_file():
        raise SystemExit(f"Karpenter is not built in {out_dir}: run `make karpenter` first")
    names = [w for w in args.workloads.split(",") if w]
    for w in names:
        workload(w)                    # unknown names fail before anything starts
    _, so0 = ours(workload(names[0]), args.region)
    region_cat = so0.planner.catalog.region("aws", args.region)
    types = KS.instance_types(region_cat)
    prices = KS.price_table(types)
    present = {t.family for t in region_cat.types}
    families = sorted((AWS_PREVIOUS_GENERATION | AWS_RETIRED_FAMILIES) & present)
    gpus = sorted(config(args.region)["provider"].get("exclude", {}).get("gpus") or [])
    work = Path(tempfile.mkdtemp(prefix="bench-karpenter-"))
    report: dict[str, Any] = {"region": args.region, "equivalence": equivalence(args.region, families, gpus),
                              "offerings": sum(len(t["offerings"]) for t in types), "types": len(types),
                              "workloads": {}}
    cp = ControlPlane(work / "k8s")
    k = KS.Karpenter(cp, out_dir, work)
    try:
        cp.start()
        k.start(KS.write_types(types, work / "instance-types.json"), KS.node_pool(families, gpus))
        for w in names:
            state = workload(w)
            mine, so = ours(state, args.region)
            from bench_open_types import demand_units
            units = [d for d, _ in demand_units(state)]
            pods = [KS.pod(f"d{i:05d}", d) for i, d in enumerate(units)]
            kr = k.run(pods, prices)
            kr["largest"] = karpenter_largest(kr["by_type"], types)
            ray = ray_three_types(state, so)
            report["workloads"][w] = {"demands": len(units), "ours": mine, "karpenter": kr, "ray_v2_three_groups": ray,
                                      "karpenter_over_ours": round(kr["per_h"] / mine["per_h"], 3)
                                      if mine["per_h"] else None}
            if not args.json:
                print(f"{w:16s} demands {len(units):5d} | ours ${mine['per_h']:9.4f}/h {mine['machines']:4d} machines"
                      f" unserved {mine['unserved']:3d} in {mine['decided_s']:.3f} s | Karpenter ${kr['per_h']:9.4f}/h "
                      f"{kr['machines']:4d} unserved {kr['unserved']:3d} in {kr['decided_s']:.2f} s | Ray 3 groups "
                      f"${ray['per_h']:9.4f}/h {ray['machines']:4d} unserved {ray['unserved']:3d}", flush=True)
    except BaseException:
        print(f"logs kept in {work} (karpenter.log, kwok.log, k8s/)", file=sys.stderr)
        raise
    finally:
        k.stop()
        cp.stop()
    shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print("\n".join(report["equivalence"]))
    return report


if __name__ == "__main__":
    main()
