"""Karpenter's side of benches/bench_vs_karpenter.py: the catalog as its kwok provider's instance-types file, the
NodePool that states our rules and exclusions, the demands as pending pods, and a run of the real Karpenter core
(`sigs.k8s.io/karpenter/kwok`, built by `scripts/k8s/build_go.sh karpenter`) against the project's real API server.

Each piece of the equivalence (stated again in the bench's output):
- offerings: every priced offering of the region (zone, capacity type, price) with the type's CPU, memory, NVIDIA GPUs
  (`nvidia.com/gpu`; the model as the offering label `ray-nodeless.io/gpu-model`) and architecture. Karpenter's kwok
  types reserve 100m CPU and 10Mi memory for the kubelet: the file adds them to the capacity, so a type's
  allocatable is its shape, as Ray sees it. Pods per node are not limited (Ray has no such limit).
- the NodePool: capacity types spot and on-demand (Karpenter takes the cheapest offering, which is our `spot-first`
  rule's order where spot is cheaper), the families our search leaves out by default (previous generation and
  retired) NotIn, the excluded GPU models NotIn, both architectures; no consolidation (a single decision is measured).
- a demand: a pod requesting its CPU, memory and GPUs; an accelerator type as a nodeSelector on the GPU model;
  Ray's label selectors on market type and zone as required node affinity on Karpenter's capacity-type and zone
  labels (a selector with fallbacks: the terms ORed, the first one preferred); a STRICT_SPREAD placement group as
  required pod anti-affinity per hostname among its bundles, and (our `single_zone_gangs`) required pod affinity
  per zone.
"""
from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import yaml

GPU_MODEL = "ray-nodeless.io/gpu-model"
KUBE_RESERVED_CPU_M, KUBE_RESERVED_MEM_MI = 100, 10      # kwok/cloudprovider/helpers.go newInstanceType
MARKET, ZONE = "ray.io/market-type", "ray.io/availability-zone"
K_CAPACITY, K_ZONE = "karpenter.sh/capacity-type", "topology.kubernetes.io/zone"
K_TYPE = "node.kubernetes.io/instance-type"
K_FAMILY = "karpenter.kwok.sh/instance-family"
NS = "bench"


def instance_types(region_catalog: Any) -> list[dict[str, Any]]:
    """The region's priced offerings in the kwok provider's format (its embedded instance_types.json)."""
    by_type: dict[str, dict[str, Any]] = {}
    for o in region_catalog.offerings():
        if o.hourly_price is None:
            continue
        t = o.instance_type
        entry = by_type.get(t.name)
        if entry is None:
            res = {"cpu": f"{int(round(t.vcpus * 1000)) + KUBE_RESERVED_CPU_M}m",
                   "memory": f"{int(round(t.memory_gib * 1024)) + KUBE_RESERVED_MEM_MI}Mi", "pods": "1000000"}
            if t.gpu_count and not t.accelerator:
                res["nvidia.com/gpu"] = str(t.gpu_count)
            entry = by_type[t.name] = {"name": t.name, "offerings": [], "resources": res, "operatingSystems": ["linux"],
                                       "architecture": "arm64" if t.arch == "arm64" else "amd64"}
        reqs = [{"key": K_CAPACITY, "operator": "In", "values": [o.capacity]},
                {"key": K_ZONE, "operator": "In", "values": [o.zone]}]
        if t.gpu_model and not t.accelerator:
            reqs.append({"key": GPU_MODEL, "operator": "In", "values": [t.gpu_model]})
        entry["offerings"].append({"Price": o.hourly_price, "Available": True, "Requirements": reqs})
    return sorted(by_type.values(), key=lambda e: e["name"])


def price_table(types: list[dict[str, Any]]) -> dict[tuple[str, str, str], float]:
    out = {}
    for t in types:
        for o in t["offerings"]:
            r = {q["key"]: q["values"][0] for q in o["Requirements"]}
            out[(t["name"], r[K_ZONE], r[K_CAPACITY])] = o["Price"]
    return out


def node_pool(left_out_families: list[str], excluded_gpus: list[str]) -> list[dict[str, Any]]:
    reqs = [{"key": K_CAPACITY, "operator": "In", "values": ["spot", "on-demand"]},
            {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64", "arm64"]},
            {"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]}]
    if left_out_families:
        reqs.append({"key": K_FAMILY, "operator": "NotIn", "values": sorted(left_out_families)})
    if excluded_gpus:
        reqs.append({"key": GPU_MODEL, "operator": "NotIn", "values": sorted(excluded_gpus)})
    return [
        {"apiVersion": "karpenter.kwok.sh/v1alpha1", "kind": "KWOKNodeClass", "metadata": {"name": "default"}},
        {"apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": "default"}, "spec": {
            "template": {"spec": {"requirements": reqs, "expireAfter": "Never", "nodeClassRef": {
                "group": "karpenter.kwok.sh", "kind": "KWOKNodeClass", "name": "default"}}},
            "disruption": {"consolidationPolicy": "WhenEmpty", "consolidateAfter": "Never"}}},
    ]


def _term(selector: Any) -> dict[str, Any] | None:
    """One of Ray's selectors as a node selector term (None: it matches any node)."""
    keys = {MARKET: K_CAPACITY, ZONE: K_ZONE}
    exprs = [{"key": keys[c.key], "operator": "In" if c.op == "in" else "NotIn", "values": list(c.values)}
             for c in selector.constraints if c.key in keys]
    return {"matchExpressions": exprs} if exprs else None


def pod(name: str, demand: Any) -> dict[str, Any]:
    """The pod of one demand unit (see the module docstring)."""
    res = demand.res
    requests: dict[str, str] = {}
    if res.get("CPU"):
        requests["cpu"] = f"{int(round(res['CPU'] * 1000))}m"
    if res.get("memory"):
        requests["memory"] = str(int(res["memory"]))
    if res.get("GPU"):
        requests["nvidia.com/gpu"] = str(int(res["GPU"]))
    spec: dict[str, Any] = {"containers": [{"name": "work", "image": "none", "resources": {
        "requests": requests, "limits": {k: v for k, v in requests.items() if k == "nvidia.com/gpu"}}}],
        "terminationGracePeriodSeconds": 0}
    models = [k.split(":", 1)[1] for k in res if k.startswith("accelerator_type:")]
    if models:
        spec["nodeSelector"] = {GPU_MODEL: models[0]}
    affinity: dict[str, Any] = {}
    if demand.selectors:
        terms = [_term(s) for s in demand.selectors]
        if all(t is not None for t in terms):       # a fallback that matches any node makes the requirement void
            affinity["nodeAffinity"] = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}
        if len(terms) > 1 and terms[0] is not None:
            affinity.setdefault("nodeAffinity", {})["preferredDuringSchedulingIgnoredDuringExecution"] = [
                {"weight": 100, "preference": terms[0]}]
    labels = {"app": "bench"}
    if demand.gang:
        labels["gang"] = demand.gang[:63]
        peers = {"labelSelector": {"matchLabels": {"gang": labels["gang"]}}}
        if demand.spread:
            affinity["podAntiAffinity"] = {"requiredDuringSchedulingIgnoredDuringExecution": [
                {**peers, "topologyKey": "kubernetes.io/hostname"}]}
        affinity["podAffinity"] = {"requiredDuringSchedulingIgnoredDuringExecution": [
            {**peers, "topologyKey": "kubernetes.io/hostname" if demand.packed else K_ZONE}]}
    if affinity:
        spec["affinity"] = affinity
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels}, "spec": spec}


class Karpenter:
    """The karpenter-kwok process against a ControlPlane, with its CRDs, the instance-types file and the NodePool."""

    def __init__(self, plane: Any, out: Path, work: Path):
        self.plane, self.out, self.work = plane, out, work
        self.proc: subprocess.Popen | None = None
        self.kwok: subprocess.Popen | None = None

    def start(self, types_file: Path, pool: list[dict[str, Any]]) -> None:
        from kubernetes import client

        from ray_nodeless.testing.clock import wait_for
        from ray_nodeless.testing.k8s_support import _child_setup, _free_ports

        api = self.plane.api_client()
        ext = client.ApiextensionsV1Api(api)
        for f in sorted((self.out / "karpenter" / "crd").glob("*.yaml")):
            crd = yaml.safe_load(f.read_text())
            ext.create_custom_resource_definition(crd)
        for f in sorted((self.out / "karpenter" / "crd").glob("*.yaml")):
            name = yaml.safe_load(f.read_text())["metadata"]["name"]
            wait_for(lambda n=name: any(c.type == "Established" and c.status == "True" for c in
                                        ext.read_custom_resource_definition(n).status.conditions or []), 60, name)
        core = client.CoreV1Api(api)
        for ns in ("karpenter", NS):
            core.create_namespace({"metadata": {"name": ns}})
        metrics, health = _free_ports(2)
        env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"} | {
            "KUBECONFIG": str(self.plane.admin_kubeconfig), "SYSTEM_NAMESPACE": "karpenter",
            "DISABLE_LEADER_ELECTION": "true", "METRICS_PORT": str(metrics), "HEALTH_PROBE_PORT": str(health),
            "INSTANCE_TYPES_FILE_PATH": str(types_file), "LOG_LEVEL": "info", "CPU_REQUESTS": "2000"}
        log = open(self.work / "karpenter.log", "ab")
        self.proc = subprocess.Popen([str(self.out / "bin" / "karpenter-kwok")], env=env, stdout=log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                                     preexec_fn=_child_setup(True))
        log.close()
        import urllib.request
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

        def healthy() -> bool:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"karpenter-kwok exited:\n{(self.work / 'karpenter.log').read_text()[-3000:]}")
            try:
                with opener.open(f"http://127.0.0.1:{health}/readyz", timeout=2) as r:
                    return r.status == 200
            except OSError:
                return False

        wait_for(healthy, 120, "Karpenter ready", interval=0.5)
        # kwok (sigs.k8s.io/kwok) plays the kubelets of the Nodes the kwok provider creates: they turn Ready and the
        # real scheduler binds the pods, so "unserved" is the pods left unbound, not a count of Karpenter's events.
        klog = open(self.work / "kwok.log", "ab")
        self.kwok = subprocess.Popen(
            [str(self.out / "bin" / "kwok"), f"--kubeconfig={self.plane.admin_kubeconfig}",
             "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake", "--cidr=10.64.0.0/10",
             "--node-ip=127.0.0.1", "--server-address=127.0.0.1:0"],
            env=env, stdout=klog, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            preexec_fn=_child_setup(True))
        klog.close()
        plural = {"KWOKNodeClass": "kwoknodeclasses", "NodePool": "nodepools"}
        for doc in pool:
            group, version = doc["apiVersion"].split("/")
            client.CustomObjectsApi(api).create_cluster_custom_object(group, version, plural[doc["kind"]], doc)
        api.close()

    def stop(self) -> None:
        from ray_nodeless.testing.k8s_support import _kill_group

        for p in (self.kwok, self.proc):
            if p is not None:
                _kill_group(p)
        self.kwok = self.proc = None

    def run(self, pods: list[dict[str, Any]], prices: dict[tuple[str, str, str], float],
            quiet_s: float = 15.0, timeout_s: float = 600.0) -> dict[str, Any]:
        """Create the pods, wait until Karpenter's NodeClaims stop changing for `quiet_s` (longer than its 10 s batch
        window), and read what it decided; then delete pods and NodeClaims and wait for them to go."""
        from kubernetes import client

        api = self.plane.api_client()
        core, objs = client.CoreV1Api(api), client.CustomObjectsApi(api)

        def claims() -> list[dict[str, Any]]:
            return objs.list_cluster_custom_object("karpenter.sh", "v1", "nodeclaims")["items"]

        t_first = time.monotonic()
        for p in pods:
            core.create_namespaced_pod(NS, p)
        t_pending = time.monotonic()
        seen: dict[str, float] = {}
        last_change = time.monotonic()
        while time.monotonic() - last_change < quiet_s and time.monotonic() - t_pending < timeout_s:
            for c in claims():
                if c["metadata"]["name"] not in seen:
                    seen[c["metadata"]["name"]] = time.monotonic()
                    last_change = time.monotonic()
            time.sleep(0.2)
        decided = claims()
        # the pods bound once the Nodes are Ready (kwok), until that count stops growing for 10 s
        bound, last, t_bound = -1, time.monotonic(), time.monotonic()
        while time.monotonic() - last < 10 and time.monotonic() - t_bound < 180:
            n = sum(1 for p in core.list_namespaced_pod(NS).items if p.spec.node_name)
            if n != bound:
                bound, last = n, time.monotonic()
            if n == len(pods):
                break
            time.sleep(0.5)
        machines = []
        for c in decided:
            lab = c["metadata"].get("labels") or {}
            key = (lab.get(K_TYPE, "?"), lab.get(K_ZONE, "?"), lab.get(K_CAPACITY, "?"))
            machines.append((key, prices.get(key)))
        out = {
            "per_h": round(sum(p or 0.0 for _, p in machines), 4), "machines": len(machines),
            "by_type": dict(sorted(_count(f"{k[0]} {k[2]}" for k, _ in machines).items())),
            "unpriced": sum(1 for _, p in machines if p is None),
            "unserved": len(pods) - bound,
            "create_pods_s": round(t_pending - t_first, 2),
            "decided_s": round((max(seen.values()) - t_pending) if seen else float("nan"), 2),
        }
        core.delete_collection_namespaced_pod(NS, grace_period_seconds=0)
        for c in decided:
            objs.delete_cluster_custom_object("karpenter.sh", "v1", "nodeclaims", c["metadata"]["name"])
        deadline = time.monotonic() + 180
        while (claims() or core.list_namespaced_pod(NS).items) and time.monotonic() < deadline:
            time.sleep(0.5)
        core.delete_collection_namespaced_event(NS)
        api.close()
        return out


def _count(items: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for i in items:
        out[i] = out.get(i, 0) + 1
    return out


def write_types(types: list[dict[str, Any]], path: Path) -> Path:
    path.write_text(json.dumps(types))
    return path
