"""The first corpus of bad cluster YAMLs (shapes and types of every key): mutations of the shipped cluster configs
(local, AWS, GCP, and the in-memory `fake` backend whose cloud records every launch), each with the key its error
must name. corpus_values.py holds the second (values the catalog and the clouds' models know, limits, costs).
The tests are test_bad_configs.py (`plan` and `bootstrap_config`) and test_ray_up_path.py (Ray's `ray up` code
against moto and the fake GCE)."""
from __future__ import annotations

import math
from typing import Any, Callable

import yaml

from tests import REPO_ROOT

BASES = {
    "local": "local-cpu-head.yaml",
    "aws": "aws-gpu-head.yaml",
    "gcp": "gcp-gpu-head.yaml",
    "k8s": "local-k8s-cpu-head.yaml",
}


def base(name: str) -> dict[str, Any]:
    if name == "fake":
        cfg = yaml.safe_load((REPO_ROOT / "cluster-configs" / BASES["local"]).read_text())
        for k in ("gcs_address", "disable_node_updaters"):
            cfg["provider"].pop(k, None)
        cfg["provider"]["cloud"] = "fake"
        return cfg
    return yaml.safe_load((REPO_ROOT / "cluster-configs" / BASES[name]).read_text())


def setp(**kv: Any) -> Callable[[dict], None]:
    def f(c: dict) -> None:
        c["provider"].update(kv)
    return f


def delp(key: str) -> Callable[[dict], None]:
    return lambda c: c["provider"].pop(key, None)


def rule(i: int, **kv: Any) -> Callable[[dict], None]:
    def f(c: dict) -> None:
        c["provider"]["rules"][i].update(kv)
    return f


def match(i: int, **kv: Any) -> Callable[[dict], None]:
    def f(c: dict) -> None:
        c["provider"]["rules"][i].setdefault("match", {}).update(kv)
    return f


def worker(field: str, value: Any, node: str | None = None) -> Callable[[dict], None]:
    def f(c: dict) -> None:
        name = node or next(n for n in sorted(c["available_node_types"]) if n != c["head_node_type"])
        c["available_node_types"][name][field] = value
    return f


def node_config(**kv: Any) -> Callable[[dict], None]:
    """Add keys to the first worker's node_config (keeping what the backend needs, e.g. an AWS ImageId)."""
    def f(c: dict) -> None:
        name = next(n for n in sorted(c["available_node_types"]) if n != c["head_node_type"])
        c["available_node_types"][name].setdefault("node_config", {}).update(kv)
    return f


def resource(key: str, value: Any) -> Callable[[dict], None]:
    def f(c: dict) -> None:
        name = next(n for n in sorted(c["available_node_types"]) if n != c["head_node_type"])
        c["available_node_types"][name].setdefault("resources", {})[key] = value
    return f


def top(key: str, value: Any) -> Callable[[dict], None]:
    def f(c: dict) -> None:
        c[key] = value
    return f


# (case name, mutation, the key the message must name). Mutations apply to every base.
COMMON: list[tuple[str, Callable[[dict], None], str]] = [
    ("cloud-unknown", setp(cloud="azure"), "provider.cloud"),
    ("cloud-number", setp(cloud=5), "provider.cloud"),
    ("region-missing", delp("region"), "provider.region"),
    ("region-number", setp(region=42), "provider.region"),
    ("region-empty", setp(region=""), "provider.region"),
    ("region-unknown", setp(region="mars-north-1"), "provider.region"),
    ("catalog-number", setp(catalog=3), "provider.catalog"),
    ("catalog-missing-file", setp(catalog="/nonexistent/catalog.json.gz"), "provider.catalog"),
    ("ttl-negative", setp(unavailable_ttl_s=-1), "provider.unavailable_ttl_s"),
    ("ttl-string", setp(unavailable_ttl_s="3m"), "provider.unavailable_ttl_s"),
    ("ttl-nan", setp(unavailable_ttl_s=math.nan), "provider.unavailable_ttl_s"),
    ("ttl-inf", setp(unavailable_ttl_s=math.inf), "provider.unavailable_ttl_s"),
    ("ttl-bool", setp(unavailable_ttl_s=True), "provider.unavailable_ttl_s"),
    ("backoff-cap-negative", setp(unavailable_backoff_cap_s=-5), "provider.unavailable_backoff_cap_s"),
    ("backoff-cap-below-ttl", setp(unavailable_backoff_cap_s=10), "provider.unavailable_backoff_cap_s"),
    ("probes-fraction", setp(unavailable_probes=1.5), "provider.unavailable_probes"),
    ("list-cache-negative", setp(list_cache_s=-2), "provider.list_cache_s"),
    ("registration-unknown", setp(registration="k8s"), "provider.registration"),
    ("max-cost-zero", setp(max_hourly_cost=0), "provider.max_hourly_cost"),
    ("max-cost-string", setp(max_hourly_cost="10$"), "provider.max_hourly_cost"),
    ("max-candidates-zero", setp(max_candidates_per_launch=0), "provider.max_candidates_per_launch"),
    ("max-candidates-float", setp(max_candidates_per_launch=2.5), "provider.max_candidates_per_launch"),
    ("launch-timeout-zero", setp(launch_timeout_s=0), "provider.launch_timeout_s"),
    ("typo-region", setp(regoin="us-west-2"), "provider.regoin"),
    ("typo-exclude", setp(exclud={}), "provider.exclud"),
    ("typo-rules", setp(rule=[]), "provider.rule"),
    ("unknown-key", setp(frobnicate_level=3), "provider.frobnicate_level"),
    ("exclude-list", setp(exclude=["K80"]), "provider.exclude"),
    ("exclude-typo-key", setp(exclude={"gpu": ["K80"]}), "provider.exclude.gpu"),
    ("exclude-gpu-typo", setp(exclude={"gpus": ["K8O"]}), "provider.exclude.gpus"),
    ("exclude-families-number", setp(exclude={"families": [3]}), "provider.exclude.families"),
    ("rules-mapping", setp(rules={"name": "x"}), "provider.rules"),
    ("rules-string", setp(rules="spot-first"), "provider.rules"),
    ("rule-not-mapping", setp(rules=["spot"]), "provider.rules[0]"),
    ("rule-no-name", rule(0, name=None), "provider.rules[0].name"),
    ("rule-default-name", rule(0, name="default"), "provider.rules[0].name"),
    ("rule-match-list", rule(0, match=["GPU"]), "provider.rules[0].match"),
    ("match-GPUS", match(0, GPUS=">=1"), "provider.rules[0].match.GPUS"),
    ("match-gpu-lower", match(0, gpu=">=1"), "provider.rules[0].match.gpu"),
    ("match-memory-bytes", match(0, memory=">=1"), "provider.rules[0].match.memory"),
    ("match-bad-comparison", match(0, CPU=">= four"), "provider.rules[0].match.CPU"),
    ("match-node-kind", match(0, node_kind="master"), "provider.rules[0].match.node_kind"),
    ("match-node-type-number", match(0, node_type=7), "provider.rules[0].match.node_type"),
    ("capacity-empty", rule(0, capacity=[]), "provider.rules[0].capacity"),
    ("capacity-unknown", rule(0, capacity=["preemptible"]), "provider.rules[0].capacity"),
    ("capacity-twice", rule(0, capacity=["spot", "spot"]), "provider.rules[0].capacity"),
    ("arch-unknown", rule(0, arch="sparc"), "provider.rules[0].arch"),
    ("min-vcpus-negative", rule(0, min_vcpus=-1), "provider.rules[0].min_vcpus"),
    ("min-vcpus-nan", rule(0, min_vcpus=math.nan), "provider.rules[0].min_vcpus"),
    ("min-memory-string", rule(0, min_memory_gib="16G"), "provider.rules[0].min_memory_gib"),
    ("max-price-zero", rule(0, max_hourly_price=0), "provider.rules[0].max_hourly_price"),
    ("allow-gpu-string", rule(0, allow_gpu_instances="yes"), "provider.rules[0].allow_gpu_instances"),
    ("rule-typo-key", rule(0, familes=["g4dn"]), "provider.rules[0].familes"),
    ("rule-gpus-typo", rule(0, gpus=["T5"]), "provider.rules[0].gpus"),
    ("rule-instance-types-number", rule(0, instance_types=5), "provider.rules[0].instance_types"),
    ("types-missing", lambda c: c.pop("available_node_types"), "available_node_types"),
    ("types-list", top("available_node_types", ["head"]), "available_node_types"),
    ("types-empty", top("available_node_types", {}), "available_node_types"),
    ("head-type-unknown", top("head_node_type", "boss"), "head_node_type"),
    ("max-workers-string", top("max_workers", "three"), "max_workers"),
    ("node-type-string", lambda c: c["available_node_types"].update(extra="big"), "available_node_types.extra"),
    ("resources-string", worker("resources", "CPU=4"), "resources"),
    ("gpu-nan", resource("GPU", math.nan), "resources.GPU"),
    ("gpu-inf", resource("GPU", math.inf), "resources.GPU"),
    ("gpu-negative", resource("GPU", -1), "resources.GPU"),
    ("gpu-fraction", resource("GPU", 1.5), "resources.GPU"),
    ("cpu-string", resource("CPU", "4"), "resources.CPU"),
    ("cpu-lower-case", resource("cpu", 4), "resources.cpu"),
    ("memory-string", resource("memory", "16GiB"), "resources.memory"),
    ("custom-resource-nan", resource("my_accel", math.nan), "resources.my_accel"),
    ("min-workers-word", worker("min_workers", "two"), "min_workers"),
    ("max-workers-negative", worker("max_workers", -1), "max_workers"),
    ("min-over-max", lambda c: (worker("max_workers", 1)(c), worker("min_workers", 3)(c)), "min_workers"),
    ("node-config-list", worker("node_config", ["a"]), "node_config"),
    ("node-config-capacity", node_config(capacity=["reserved"]), "node_config.capacity"),
    ("node-config-gpus-typo", node_config(gpus=["A1000"]), "node_config.gpus"),
    ("node-config-min-memory", node_config(min_memory_gib=-4), "node_config.min_memory_gib"),
    ("accelerator-type-twice", lambda c: (resource("accelerator_type:T4", 1)(c), resource("accelerator_type:L4", 1)(c)),
     "accelerator_type"),
]

PER_BACKEND: dict[str, list[tuple[str, Callable[[dict], None], str]]] = {
    "aws": [
        ("aws-max-attempts-word", setp(aws_max_attempts="five"), "provider.aws_max_attempts"),
        ("aws-credentials-string", setp(aws_credentials="AKIA..."), "provider.aws_credentials"),
        ("aws-endpoint-typo", setp(endpoint_ur="http://127.0.0.1:5000"), "provider.endpoint_ur"),
        ("aws-subnets-typo", setp(subnet={"us-west-2a": "subnet-1"}), "provider.subnet"),
        ("aws-subnets-list", setp(subnets=["subnet-1"]), "provider.subnets"),
        # eu-north-1: a region with no Ray default AMI (elsewhere bootstrap fills Ray's default, as Ray does)
        ("aws-no-ami", lambda c: (c["provider"].pop("image_id", None), c["provider"].update(region="eu-north-1"),
                                  [nt.get("node_config", {}).pop("ImageId", None)
                                   for nt in c["available_node_types"].values()]), "ImageId"),
        ("aws-node-config-typo", node_config(SecurityGroupIDs=["sg-1"]),
         "node_config.SecurityGroupIDs"),
        ("aws-node-config-managed", node_config(MaxCount=3), "node_config.MaxCount"),
    ],
    "gcp": [
        ("gcp-project-null", setp(project_id=None), "provider.project_id"),
        ("gcp-disk-word", setp(disk_size_gb="big"), "provider.disk_size_gb"),
        ("gcp-typo", setp(projectid="p"), "provider.projectid"),
        ("gcp-node-config-typo", node_config(machineTypo="n1-standard-4"), "node_config.machineTypo"),
    ],
    "local": [
        ("local-gcs-no-port", setp(gcs_address="localhost"), "provider.gcs_address"),
        ("local-state-dir-number", setp(state_dir=5), "provider.state_dir"),
        ("local-faults-string", setp(local_faults="capacity"), "provider.local_faults"),
    ],
    "fake": [],
}

Case = tuple[str, Callable[[dict], None], str]
