"""The second corpus of bad cluster YAMLs: values that are well-typed but wrong, which only the catalog, the cloud's
request model, Ray's limits or the cost preview can tell. Each case: (name, mutation, the key its error must name).

- catalog values (instance types, globs, families, zones) in rules, exclusions and node_config, with did-you-mean;
- a rule or pin that leaves a node type with no offering (the key that emptied it), a shape no instance has;
- `max_hourly_cost` below the head's price or the idle cost;
- cluster and node type names (Ray's tags, the clouds' label limits), a YAML nested too deep;
- node_config launch keys against EC2's RunInstances model / GCE's Instance schema;
- the Kubernetes registration's keys (join method keys, pod template) and its live checks (kubeconfig, API server).
"""
from __future__ import annotations

from typing import Any, Callable

from tests.config.corpus import Case, node_config, resource, rule, setp, top

# A misspelt value of each cloud's vocabulary (the local and fake backends are priced as AWS).
TYPO = {"aws": "g4dn.xlarg", "gcp": "n1-standrd-4"}
EXCLUDABLE_TYPO = {"aws": "p5.48xlarg", "gcp": "a3-highgpu-8gg"}
FAMILY_TYPO = {"aws": "g4dm", "gcp": "n1x"}
TYPE_OF_OTHER_CLOUD = {"aws": "n1-standard-4", "gcp": "m5.large"}


def cloud_of(c: dict) -> str:
    p = c["provider"]
    return p.get("cloud") if p.get("cloud") in ("aws", "gcp") else p.get("simulate_cloud") or "aws"


def worker_name(c: dict) -> str:
    return next(n for n in sorted(c["available_node_types"]) if n != c["head_node_type"])


def per_cloud(f: Callable[[dict, str], None]) -> Callable[[dict], None]:
    return lambda c: f(c, cloud_of(c))


def first_rule(**kv: Any) -> Callable[[dict], None]:
    """A new first rule for the first worker type, with the constraint keys `kv`."""
    def f(c: dict) -> None:
        c["provider"].setdefault("rules", []).insert(
            0, {"name": "first", "match": {"node_type": worker_name(c)}, **kv})
    return f


def exclude(**kv: Any) -> Callable[[dict], None]:
    def f(c: dict) -> None:
        ex = c["provider"].get("exclude")
        c["provider"]["exclude"] = dict(ex if isinstance(ex, dict) else {}, **kv)
    return f


def rename_worker(new: Any) -> Callable[[dict], None]:
    def f(c: dict) -> None:
        types = c["available_node_types"]
        types[new] = types.pop(worker_name(c))
    return f


def cap_between_head_and_idle(c: dict) -> None:
    """min_workers that make the idle cost exceed the head's price, and a cap between the two."""
    from ray_nodeless.operate.config import check_cluster, prepare_like_ray_up

    w = worker_name(c)
    c["max_workers"] = max(int(c.get("max_workers") or 0), 3)
    c["available_node_types"][w].update(min_workers=3, max_workers=3)
    cp = check_cluster(prepare_like_ray_up(c))
    head = cp.plans[cp.head_node_type].chosen.hourly_price
    c["provider"]["max_hourly_cost"] = round((head + cp.cost.idle_cost_per_hour) / 2, 6)


def deep_yaml(depth: int = 5000) -> Callable[[dict], None]:
    def f(c: dict) -> None:
        value: Any = "x"
        for _ in range(depth):
            value = {"a": value}
        c["file_mounts"] = value
    return f


def zone_of_region(suffix: str) -> Callable[[dict], None]:
    return lambda c: rule(0, zones=[c["provider"]["region"] + suffix])(c)


VALUES_COMMON: list[Case] = [
    # catalog values in rules, with did-you-mean
    ("rule-instance-type-typo", per_cloud(lambda c, k: rule(0, instance_types=[TYPO[k]])(c)),
     "provider.rules[0].instance_types[0]"),
    ("rule-instance-type-other-cloud", per_cloud(lambda c, k: rule(0, instance_types=[TYPE_OF_OTHER_CLOUD[k]])(c)),
     "provider.rules[0].instance_types[0]"),
    ("rule-instance-type-broken-glob", rule(0, instance_types=["g4dn.["]), "provider.rules[0].instance_types[0]"),
    ("rule-instance-type-glob-nothing", rule(0, instance_types=["zz*"]), "provider.rules[0].instance_types[0]"),
    ("rule-instance-types-empty", rule(0, instance_types=[]), "provider.rules[0].instance_types"),
    ("rule-instance-type-spaces", rule(0, instance_types=[" m5.large"]), "provider.rules[0].instance_types[0]"),
    ("rule-families-typo", per_cloud(lambda c, k: rule(0, families=[FAMILY_TYPO[k]])(c)),
     "provider.rules[0].families[0]"),
    ("rule-families-empty", rule(0, families=[]), "provider.rules[0].families"),
    ("rule-gpus-empty", rule(0, gpus=[]), "provider.rules[0].gpus"),
    ("rule-gpus-spaces", rule(0, gpus=["T4 "]), "provider.rules[0].gpus[0]"),
    ("rule-zones-typo", zone_of_region("z"), "provider.rules[0].zones[0]"),
    ("rule-zones-other-region", rule(0, zones=["eu-west-9a"]), "provider.rules[0].zones[0]"),
    ("rule-zones-empty", rule(0, zones=[]), "provider.rules[0].zones"),
    ("rule-exclude-families-unknown", rule(0, exclude_families=["zz9"]), "provider.rules[0].exclude_families[0]"),
    ("rule-exclude-types-typo", per_cloud(lambda c, k: rule(0, exclude_instance_types=[EXCLUDABLE_TYPO[k]])(c)),
     "provider.rules[0].exclude_instance_types[0]"),
    ("rule-exclude-gpus-typo", rule(0, exclude_gpus=["V1OO"]), "provider.rules[0].exclude_gpus[0]"),
    # catalog values in provider.exclude
    ("exclude-families-unknown", exclude(families=["zz9"]), "provider.exclude.families[0]"),
    ("exclude-gpu-spaces", exclude(gpus=["A100 "]), "provider.exclude.gpus[0]"),
    ("exclude-types-broken-glob", exclude(instance_types=["g4dn.["]), "provider.exclude.instance_types[0]"),
    ("exclude-types-typo", per_cloud(lambda c, k: exclude(instance_types=[EXCLUDABLE_TYPO[k]])(c)),
     "provider.exclude.instance_types[0]"),
    ("exclude-gpus-second-typo", exclude(gpus=["T4", "L4x"]), "provider.exclude.gpus[1]"),
    # catalog values in node_config
    ("node-config-instance-type-typo", per_cloud(lambda c, k: node_config(instance_types=[TYPO[k]])(c)),
     "node_config.instance_types[0]"),
    ("node-config-zones-typo", lambda c: node_config(zones=[c["provider"]["region"] + "q"])(c),
     "node_config.zones[0]"),
    ("node-config-families-empty", node_config(families=[]), "node_config.families"),
    ("node-config-exclude-families-unknown", node_config(exclude_families=["qq7"]),
     "node_config.exclude_families[0]"),
    # resources
    ("resource-empty-name", resource("", 1), "resources."),
    ("resource-name-spaces", resource(" CPU", 1), "resources. CPU"),
    ("gpu-count-no-instance-has", resource("GPU", 64), "resources.GPU"),
    ("cpu-count-no-instance-has", resource("CPU", 100000), "resources.CPU"),
    ("memory-no-instance-has", resource("memory", 2 ** 50), "resources.memory"),
    # a rule or pin that empties the node type
    ("rule-min-vcpus-huge", first_rule(min_vcpus=100000), "provider.rules[0].min_vcpus"),
    ("rule-min-memory-huge", first_rule(min_memory_gib=10 ** 6), "provider.rules[0].min_memory_gib"),
    ("rule-max-price-tiny", first_rule(max_hourly_price=0.000001), "provider.rules[0].max_hourly_price"),
    ("rule-gpus-none-for-cpu", first_rule(gpus=["H100"], instance_types=["*.nano", "e2-micro"]),
     "provider.rules[0]"),
    ("node-config-max-price-tiny", node_config(max_hourly_price=0.000001), "node_config.max_hourly_price"),
    ("node-config-min-vcpus-huge", node_config(min_vcpus=50000), "node_config.min_vcpus"),
    ("exclude-everything", exclude(instance_types=["*"]), "provider.exclude.instance_types"),
    # the cost cap
    ("max-cost-below-head", setp(max_hourly_cost=0.000001), "provider.max_hourly_cost"),
    ("max-cost-below-idle", cap_between_head_and_idle, "provider.max_hourly_cost"),
    # names
    ("cluster-name-empty", top("cluster_name", ""), "cluster_name"),
    ("cluster-name-long", top("cluster_name", "c" * 300), "cluster_name"),
    ("cluster-name-number", top("cluster_name", 5), "cluster_name"),
    ("cluster-name-newline", top("cluster_name", "a\nb"), "cluster_name"),
    ("cluster-name-spaces", top("cluster_name", " x "), "cluster_name"),
    ("node-type-name-long", rename_worker("w" * 300), "available_node_types." + "w" * 300),
    ("node-type-name-number", rename_worker(5), "available_node_types.5"),
    ("node-type-name-empty", rename_worker(""), "available_node_types."),
]


def _k8s_block(**kv: Any) -> Callable[[dict], None]:
    def f(c: dict) -> None:
        c["provider"]["kubernetes"].update(kv)
    return f


def _k8s_join(**kv: Any) -> Callable[[dict], None]:
    def f(c: dict) -> None:
        join = c["provider"]["kubernetes"]["join"]
        join.update(kv)
        for k in [k for k, v in join.items() if v is None]:
            join.pop(k)
    return f


def _kubeconfig_to(server: str) -> Callable[[dict], None]:
    """A kubeconfig file (in the test's temporary HOME) for an API server that does not answer."""
    def f(c: dict) -> None:
        import os
        import tempfile

        path = os.path.join(tempfile.mkdtemp(prefix="kubeconfig-"), "config")
        with open(path, "w") as fh:
            fh.write("apiVersion: v1\nkind: Config\ncurrent-context: x\n"
                     f"clusters: [{{name: x, cluster: {{server: '{server}'}}}}]\n"
                     "contexts: [{name: x, context: {cluster: x, user: x}}]\n"
                     "users: [{name: x, user: {token: t}}]\n")
        c["provider"]["kubernetes"]["kubeconfig"] = path
    return f


EKS_JOIN = {"method": "eks", "endpoint": "https://127.0.0.1:6443", "ca": "Y2E=", "cidr": "10.100.0.0/16",
            "token": None, "ca_cert_hash": None}

VALUES_PER_BACKEND: dict[str, list[Case]] = {
    "aws": [
        ("aws-bdm-mapping", node_config(BlockDeviceMappings={"DeviceName": "/dev/sda1"}),
         "node_config.BlockDeviceMappings"),
        ("aws-ebs-negative", node_config(BlockDeviceMappings=[{"DeviceName": "/dev/sda1", "Ebs": {"VolumeSize": -5}}]),
         "node_config.BlockDeviceMappings[0].Ebs.VolumeSize"),
        ("aws-ebs-zero", node_config(BlockDeviceMappings=[{"DeviceName": "/dev/sda1", "Ebs": {"VolumeSize": 0}}]),
         "node_config.BlockDeviceMappings[0].Ebs.VolumeSize"),
        ("aws-ebs-size-string", node_config(BlockDeviceMappings=[{"DeviceName": "/dev/sda1",
                                                                 "Ebs": {"VolumeSize": "100"}}]),
         "node_config.BlockDeviceMappings[0].Ebs.VolumeSize"),
        ("aws-ebs-key-typo", node_config(BlockDeviceMappings=[{"DeviceName": "/dev/sda1",
                                                              "Ebs": {"VolumeSzie": 100}}]),
         "node_config.BlockDeviceMappings[0].Ebs.VolumeSzie"),
        ("aws-bdm-entry-string", node_config(BlockDeviceMappings=["/dev/sda1"]),
         "node_config.BlockDeviceMappings[0]"),
        ("aws-userdata-number", node_config(UserData=5), "node_config.UserData"),
        ("aws-userdata-too-long", node_config(UserData="#!/bin/sh\n" + "x" * 20000), "node_config.UserData"),
        ("aws-imageid-number", node_config(ImageId=123), "node_config.ImageId"),
        ("aws-keyname-list", node_config(KeyName=["k"]), "node_config.KeyName"),
        ("aws-security-groups-string", node_config(SecurityGroupIds="sg-1"), "node_config.SecurityGroupIds"),
        ("aws-tags-mapping", node_config(TagSpecifications=[{"ResourceType": "instance", "Tags": {"a": "b"}}]),
         "node_config.TagSpecifications[0].Tags"),
        ("aws-iam-profile-string", node_config(IamInstanceProfile="arn:aws:iam::1:instance-profile/x"),
         "node_config.IamInstanceProfile"),
        ("aws-ebs-optimized-word", node_config(EbsOptimized="yes"), "node_config.EbsOptimized"),
        ("aws-subnet-ids-numbers", node_config(SubnetIds=[1, 2]), "node_config.SubnetIds"),
        ("aws-metadata-options-typo", node_config(MetadataOptions={"HttpToken": "required"}),
         "node_config.MetadataOptions.HttpToken"),
        ("aws-instance-type-typo", node_config(InstanceType="g4dn.xlarg"), "node_config.InstanceType"),
        ("aws-instance-type-excluded", node_config(InstanceType="g3.4xlarge"), "node_config.InstanceType"),
        ("aws-instance-type-too-small", node_config(InstanceType="t3.nano"), "node_config.InstanceType"),
        ("aws-instance-type-number", node_config(InstanceType=5), "node_config.InstanceType"),
        ("aws-availability-zone-typo", setp(availability_zone="us-west-2z"), "provider.availability_zone"),
    ],
    "gcp": [
        ("gcp-machine-type-typo", node_config(machineType="n1-standrd-4"), "node_config.machineType"),
        ("gcp-machine-type-number", node_config(machineType=4), "node_config.machineType"),
        ("gcp-disks-mapping", node_config(disks={"boot": True}), "node_config.disks"),
        ("gcp-disk-size-word", node_config(disks=[{"boot": True, "initializeParams": {"diskSizeGb": "big"}}]),
         "node_config.disks"),
        ("gcp-metadata-list", node_config(metadata=[1]), "node_config.metadata"),
        ("gcp-labels-upper", node_config(labels={"Team": "x"}), "node_config.labels.Team"),
        ("gcp-scheduling-word", node_config(scheduling="spot"), "node_config.scheduling"),
        ("gcp-machine-type-too-small", node_config(machineType="e2-micro"), "node_config.machineType"),
    ],
    # registration: kubernetes (cluster-configs/local-k8s-cpu-head.yaml)
    "k8s": [
        ("k8s-eks-without-cluster", _k8s_join(**EKS_JOIN), "provider.kubernetes.join.cluster"),
        ("k8s-kubeadm-without-token", _k8s_join(token=None), "provider.kubernetes.join.token"),
        ("k8s-kubeadm-without-hash", _k8s_join(ca_cert_hash=None), "provider.kubernetes.join.ca_cert_hash"),
        ("k8s-join-method-unknown", _k8s_join(method="kubelet"), "provider.kubernetes.join.method"),
        ("k8s-no-pod-template", lambda c: c["provider"]["kubernetes"].pop("pod_template"),
         "provider.kubernetes.pod_template"),
        ("k8s-pod-template-no-containers", _k8s_block(pod_template={"spec": {}}),
         "provider.kubernetes.pod_template.spec.containers"),
        ("k8s-pod-template-empty-containers", _k8s_block(pod_template={"spec": {"containers": []}}),
         "provider.kubernetes.pod_template.spec.containers"),
        ("k8s-pod-template-no-spec", _k8s_block(pod_template={"metadata": {"labels": {"a": "b"}}}),
         "provider.kubernetes.pod_template.spec"),
        ("k8s-pod-template-image-number", _k8s_block(pod_template={"spec": {"containers": [{"name": "r",
                                                                                            "image": 5}]}}),
         "provider.kubernetes.pod_template.spec.containers[0].image"),
        ("k8s-namespace-empty", _k8s_block(namespace=""), "provider.kubernetes.namespace"),
        ("k8s-typo", _k8s_block(namspace="ray"), "provider.kubernetes.namspace"),
    ],
}

# Checked only where the live service is asked (bootstrap_config, `ray up`), never by `plan`, which makes no call.
LIVE_K8S: list[Case] = [
    ("k8s-kubeconfig-missing", _k8s_block(kubeconfig="/nonexistent/kubeconfig"), "provider.kubernetes.kubeconfig"),
    ("k8s-api-server-unreachable", _kubeconfig_to("https://127.0.0.1:9"), "provider.kubernetes.kubeconfig"),
]

# Ray's own cluster schema and preparation (`prepare_config`, `validate_config`): `plan` applies the schema itself
# (operate/ray_schema.py); on the `ray up` path Ray refuses these before the plugin runs, or crashes on them.
RAY_SHAPES: list[Case] = [
    ("top-key-typo", top("max_worker", 3), "max_worker"),
    ("top-key-unknown", top("head_setup", []), "head_setup"),
    ("setup-commands-string", top("setup_commands", "pip install ray"), "setup_commands"),
    ("setup-commands-numbers", top("setup_commands", [1]), "setup_commands"),
    ("start-commands-string", top("head_start_ray_commands", "ray start --head"), "head_start_ray_commands"),
    ("file-mounts-list", top("file_mounts", ["/tmp/a"]), "file_mounts"),
    ("synced-files-string", top("cluster_synced_files", "/tmp/a"), "cluster_synced_files"),
    ("auth-string", top("auth", "ubuntu"), "auth"),
    ("auth-key-typo", top("auth", {"ssh_usr": "ubuntu"}), "ssh_usr"),
    ("docker-list", top("docker", ["rayproject/ray"]), "docker"),
    ("docker-key-typo", top("docker", {"imag": "rayproject/ray"}), "imag"),
    ("idle-timeout-negative", top("idle_timeout_minutes", -1), "idle_timeout_minutes"),
    ("upscaling-speed-word", top("upscaling_speed", "fast"), "upscaling_speed"),
    ("node-type-key-typo", lambda c: c["available_node_types"][worker_name(c)].update(max_worker=2), "max_worker"),
    ("node-type-labels-number", lambda c: c["available_node_types"][worker_name(c)].update(labels={"a": 1}),
     "labels"),
    ("cpu-fraction", resource("CPU", 0.5), "resources.CPU"),
    ("provider-list", top("provider", [{"cloud": "aws"}]), "provider"),
    ("provider-missing", lambda c: c.pop("provider"), "provider"),
    ("head-type-number", top("head_node_type", 5), "head_node_type"),
]
