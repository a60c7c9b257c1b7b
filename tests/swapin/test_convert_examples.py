"""Ray's own example YAMLs through `ray-nodeless convert`, with no hand edit: each converts, or fails with an error
naming the key that cannot be honoured; a converted YAML passes Ray's own config path and ours, and what the plan
shows is what launches (against moto and the fake Compute Engine server)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from ray_nodeless.errors import ConfigError
from ray_nodeless.swapin import ray_defaults
from ray_nodeless.swapin.convert import Conversion, convert_file
from tests.swapin.helpers import BEFORE_UNPRICED, CASES, CONVERTS, OUTCOMES, PROJECT, example, prepared, quiet_ray

_cache: dict[tuple[str, bool], Conversion] = {}


def converted(name: str, free: bool) -> Conversion:
    quiet_ray()
    if (name, free) not in _cache:
        _cache[(name, free)] = convert_file(example(name), free_instance_types=free, project_id=PROJECT)
    return _cache[(name, free)]



@pytest.mark.parametrize("name", sorted(OUTCOMES))
@pytest.mark.parametrize("free", [False, True], ids=["pinned", "free"])
def test_every_example_converts_or_names_the_key(name: str, free: bool) -> None:
    expected = OUTCOMES[name][free]
    if expected is None:
        conv = converted(name, free)
        assert conv.config["provider"]["type"] == "external"
        assert conv.config["provider"]["module"] == "ray_nodeless.NodelessProvider"
        assert conv.config["provider"]["cloud"] == name.split("-")[0]
        return
    quiet_ray()
    with pytest.raises(ConfigError) as e:
        convert_file(example(name), free_instance_types=free, project_id=PROJECT)
    assert e.value.key == expected, str(e.value)


def test_the_errors_say_why() -> None:
    quiet_ray()
    with pytest.raises(ConfigError, match=r"'p2.xlarge' is not in the catalog's aws instance types.*"
                                          r"`ray-nodeless convert --free-instance-types` writes that"):
        convert_file(example("aws-example-gpu-docker.yaml"))
    with pytest.raises(ConfigError, match=r"custom machine type \(6 vCPU, 16 GiB\).*no per-vCPU / per-GB rates.*"
                                          r"--free-instance-types"):
        convert_file(example("gcp-example-gpu-docker.yaml"), project_id=PROJECT)
    with pytest.raises(ConfigError) as e:
        convert_file(example("gcp-example-minimal.yaml"))          # project_id: null, no --project-id
    assert e.value.key == "provider.project_id" and "--project-id" in str(e.value)


@pytest.mark.parametrize("name, free", CASES)
def test_converted_yaml_passes_rays_config_path_and_ours(name: str, free: bool) -> None:
    from ray.autoscaler._private.util import validate_config

    from ray_nodeless.operate.config import check_cluster, load_provider, prepare_like_ray_up
    from ray_nodeless.ray_adapter.bootstrap import settle_images
    from ray_nodeless.ray_adapter.provider import NodelessProvider

    conv = converted(name, free)
    loaded = yaml.safe_load(conv.text)
    assert loaded == conv.config
    # `ray up`'s order: Ray's prepare_config, the provider's fill-in, Ray's validate_config, our bootstrap checks.
    ready = NodelessProvider.fillout_available_node_types_resources(prepared(loaded))
    validate_config(ready)
    check_cluster(ready)
    check_cluster(loaded)
    # `ray-nodeless plan`'s path gives the same plan as the conversion reported
    planned = prepare_like_ray_up(loaded)
    settle_images(planned, load_provider(planned["provider"]))
    assert {n: p.chosen for n, p in check_cluster(planned).plans.items()} == {
        n: p.chosen for n, p in conv.plan.plans.items()}
    # Every top-level key Ray's defaults give `type: aws|gcp` is written out (`type: external` gets none).
    defaults = yaml.safe_load(ray_defaults.defaults_text(conv.cloud))
    assert set(defaults) - {"head_node", "worker_nodes"} <= set(loaded)
    assert {"setup_commands", "file_mounts", "cluster_synced_files", "initialization_commands",
            "head_start_ray_commands", "worker_start_ray_commands", "head_setup_commands"} <= set(loaded)


@pytest.mark.parametrize("name, free", CASES)
def test_before_and_after(name: str, free: bool) -> None:
    conv = converted(name, free)
    doc = conv.to_dict()
    assert set(doc) == {"node_types", "summary"}
    assert set(doc["summary"]) == {"idle_cost_per_hour_before", "idle_cost_per_hour_after",
                                   "ceiling_cost_per_hour_before", "ceiling_cost_per_hour_after"}
    for rec in doc["node_types"].values():
        assert set(rec) == {"before", "after"}
        for side in rec.values():
            assert set(side) == {"instance_type", "capacity", "hourly_price"}
    unpriced = BEFORE_UNPRICED.get(name, set())
    for n, c in conv.node_types.items():
        assert c.after.hourly_price is not None
        assert (c.before.hourly_price is None) == (n in unpriced), n
        if free:
            assert c.freed and c.after.capacity == c.before.capacity
            if n not in unpriced:
                assert c.after.hourly_price <= c.before.hourly_price
        else:
            assert c.after == c.before and not c.freed
    s = conv.summary
    if unpriced:
        assert s["idle_cost_per_hour_before"] is None and s["ceiling_cost_per_hour_before"] is None
        assert s["idle_cost_per_hour_after"] is not None and s["ceiling_cost_per_hour_after"] is not None
    else:
        assert s["idle_cost_per_hour_after"] <= s["idle_cost_per_hour_before"]
        assert s["ceiling_cost_per_hour_after"] <= s["ceiling_cost_per_hour_before"]


def test_aws_example_full_figures() -> None:
    """m5.large head on demand, m5.large workers on spot (Ray's InstanceMarketOptions) in us-west-2a/b, at most 2."""
    conv = converted("aws-example-full.yaml", False)
    head, worker = conv.node_types["ray.head.default"], conv.node_types["ray.worker.default"]
    assert (head.after.instance_type, head.after.capacity) == ("m5.large", "on-demand")
    assert (worker.after.instance_type, worker.after.capacity) == ("m5.large", "spot")
    assert conv.summary["idle_cost_per_hour_after"] == pytest.approx(head.after.hourly_price)
    assert conv.summary["ceiling_cost_per_hour_after"] == pytest.approx(
        head.after.hourly_price + 2 * worker.after.hourly_price)
    for p in conv.plan.plans.values():
        assert {o.zone for o in p.candidates()} <= {"us-west-2a", "us-west-2b"}
    assert "cache_stopped_nodes" not in conv.config["provider"]
    assert any("cache_stopped_nodes" in n for n in conv.notes)


def test_freed_node_types_state_the_implied_shape() -> None:
    conv = converted("aws-example-full.yaml", True)
    nts = conv.config["available_node_types"]
    worker = nts["ray.worker.default"]
    assert "InstanceType" not in worker["node_config"]
    assert worker["node_config"]["min_memory_gib"] == 8
    assert worker["node_config"]["InstanceMarketOptions"] == {"MarketType": "spot"}
    # what Ray's AWS provider would have filled in for m5.large: the planner must keep at least that
    assert worker["resources"] == {"CPU": 2, "memory": int(8192 * 2 ** 20 * 0.7)}
    assert nts["ray.head.default"]["resources"] == {"CPU": 2}


def test_ami_and_scheduling_written_out() -> None:
    from ray.autoscaler._private.aws.config import DEFAULT_AMI

    conv = converted("aws-example-minimal.yaml", False)
    for nt in conv.config["available_node_types"].values():
        assert nt["node_config"]["ImageId"] == DEFAULT_AMI["us-west-2"]
    conv = converted("gcp-example-minimal.yaml", False)
    assert conv.config["available_node_types"]["ray_worker_small"]["node_config"]["scheduling"] == {
        "preemptible": True}


@pytest.mark.parametrize("name", CONVERTS)
def test_comments_survive(name: str) -> None:
    conv = converted(name, OUTCOMES[name][False] is not None)
    assert conv.comments_kept
    src = example(name).read_text()
    ours = [line.strip() for line in src.splitlines() if line.strip().startswith("#")]
    kept = [c for c in ours if c in conv.text]
    assert len(kept) >= 0.9 * len(ours), sorted(set(ours) - set(kept))[:10]
    # keys merged from Ray's defaults.yaml come with defaults.yaml's comments
    assert "# Command to start ray on worker nodes. You don't need to change this." in conv.text


# ----------------------------------------------------------------------------------------- plan == launch


def _launch_each(config: dict[str, Any], extra_provider: dict[str, Any],
                 bootstrap: bool = False, wheel_dir: Path | None = None) -> dict[str, dict[str, str]]:
    """Every node type launched once, the way Ray's autoscaler calls the provider after `ray up` (Ray's
    prepare_config, our fill-in, Ray's validate_config, with `bootstrap` our bootstrap_config against the cloud):
    returns the instance type and zone the provider reports per node type, and checks the plan the launch used."""
    from ray.autoscaler._private.util import validate_config
    from ray.autoscaler.tags import NODE_KIND_HEAD, NODE_KIND_WORKER, TAG_RAY_NODE_KIND, TAG_RAY_USER_NODE_TYPE

    from ray_nodeless.operate.config import check_cluster
    from ray_nodeless.ray_adapter.provider import NodelessProvider

    cfg = prepared(config)
    cfg["provider"].update(extra_provider)
    if wheel_dir is not None:
        # The converted YAML mounts this checkout's dist/ray_nodeless_wheel, there after `make wheel`; the test's
        # own build of that wheel stands in (bootstrap_config checks that the mounted wheel exists).
        from ray_nodeless.operate.plugin_install import WHEEL_MOUNT

        cfg["file_mounts"][WHEEL_MOUNT] = str(wheel_dir)
    ready = NodelessProvider.fillout_available_node_types_resources(cfg)
    validate_config(ready)
    if bootstrap:
        ready = NodelessProvider.bootstrap_config(ready)
    cp = check_cluster(ready)
    provider = NodelessProvider(ready["provider"], ready["cluster_name"])
    out = {}
    try:
        for name, nt in sorted(ready["available_node_types"].items()):
            is_head = name == ready["head_node_type"]
            planned = provider.launcher.plan(name, nt["resources"], nt["node_config"], is_head).chosen
            assert planned == cp.plans[name].chosen, name
            kind = NODE_KIND_HEAD if is_head else NODE_KIND_WORKER
            [(_, rec)] = provider.create_node_with_resources_and_labels(
                nt["node_config"], {TAG_RAY_USER_NODE_TYPE: name, TAG_RAY_NODE_KIND: kind}, 1,
                nt["resources"], {}).items()
            assert (rec["instance_type"], rec["zone"]) == (planned.instance_type.name, planned.zone)
            out[name] = {"instance_type": rec["instance_type"], "zone": rec["zone"], "capacity": planned.capacity}
    finally:
        provider.backend.close()
    return out


@pytest.mark.parametrize("name, free", [c for c in CASES if c[0].startswith("aws")])
def test_plan_equals_launch_on_moto(name: str, free: bool, moto_iam: Any, plugin_wheel_dir: Path) -> None:
    moto = moto_iam
    conv = converted(name, free)
    launched = _launch_each(conv.config, {"endpoint_url": moto.url}, bootstrap=True, wheel_dir=plugin_wheel_dir)
    ec2 = moto.client(region=conv.region)
    by_type = {}
    for r in ec2.describe_instances()["Reservations"]:
        for i in r["Instances"]:
            tags = {t["Key"]: t["Value"] for t in i.get("Tags", [])}
            by_type[tags["ray-user-node-type"]] = i
    for nt, rec in launched.items():
        inst = by_type[nt]
        assert inst["InstanceType"] == rec["instance_type"]
        assert inst["Placement"]["AvailabilityZone"] == rec["zone"]
        assert inst.get("InstanceLifecycle") == ("spot" if rec["capacity"] == "spot" else None)
        after = conv.node_types[nt].after
        assert (after.instance_type, after.capacity) == (rec["instance_type"], rec["capacity"])
        if not free:
            assert rec["instance_type"] == conv.node_types[nt].before.instance_type


@pytest.mark.parametrize("name, free", [c for c in CASES if c[0].startswith("gcp")])
def test_plan_equals_launch_on_fake_gce(name: str, free: bool) -> None:
    from ray_nodeless.core.catalog import embedded
    from ray_nodeless.core.gpus import GCE_ACCELERATOR_FOR_MODEL
    from ray_nodeless.testing.fake_gce import FakeGce

    conv = converted(name, free)
    cat = embedded()
    rc = cat.region("gcp", conv.region)
    chosen = {c.after.instance_type for c in conv.node_types.values()}
    machine_types = {}
    for t_name in chosen:
        t = cat.instance_type("gcp", t_name)
        built_in = ([(GCE_ACCELERATOR_FOR_MODEL[t.gpu_model], t.gpu_count)]
                    if t.gpu_count and not t.attached_gpu else [])
        machine_types[t.machine_type] = (int(t.vcpus), int(round(t.memory_gib * 1024)), built_in, False, "X86_64")
    with FakeGce(project=PROJECT, zones={z: conv.region for z in rc.zones}, machine_types=machine_types) as fake:
        launched = _launch_each(conv.config, {"api_endpoint": fake.url, "credentials": "anonymous",
                                              "poll_interval_s": 0.01})
        stored = {i["labels"]["ray-user-node-type"] if "ray-user-node-type" in i["labels"] else n: i
                  for n, i in fake.instances.items()}
    for nt, rec in launched.items():
        after = conv.node_types[nt].after
        assert (after.instance_type, after.capacity) == (rec["instance_type"], rec["capacity"])
        if not free:
            assert rec["instance_type"] == conv.node_types[nt].before.instance_type
    models = sorted(i["scheduling"].get("provisioningModel") for i in stored.values())
    assert models == ["SPOT", "STANDARD"]       # the worker's `preemptible: true` launched as spot
    # what GCE got: the planned machine type, with the planned GPUs attached (n1-standard-8+1xT4)
    expected = sorted((cat.instance_type("gcp", r["instance_type"]).machine_type,
                       cat.instance_type("gcp", r["instance_type"]).attached_gpu) for r in launched.values())
    got = sorted((i["machineType"].rsplit("/", 1)[-1],
                  ",".join(a["acceleratorType"].rsplit("/", 1)[-1] for a in i.get("guestAccelerators") or []))
                 for i in stored.values())
    assert got == expected


def test_gpu_docker_examples_freed() -> None:
    """Ray's GPU examples pin what no cloud offers any more (p2.xlarge/K80 on AWS; custom-6-16384 and K80 on GCP):
    freed, the shape comes from the retired-type table / the custom type's name, the GPU count stays and the model
    pin goes, and each change is a note."""
    conv = converted("aws-example-gpu-docker.yaml", True)
    head = conv.config["available_node_types"]["ray.head.gpu"]
    assert "InstanceType" not in head["node_config"] and "gpus" not in head["node_config"]
    assert head["node_config"]["min_memory_gib"] == 61
    assert head["resources"] == {"CPU": 4, "GPU": 1}            # Ray's fill-in for p2.xlarge, less accelerator_type:K80
    chosen = conv.plan.plans["ray.head.gpu"].chosen.instance_type
    assert chosen.gpu_count >= 1 and chosen.memory_gib >= 61 and chosen.vcpus >= 4
    assert conv.node_types["ray.head.gpu"].before.instance_type == "p2.xlarge"
    text = "\n".join(conv.notes)
    assert "p2.xlarge is a retired EC2 type" in text and "(4 vCPU, 61 GiB, 1xK80)" in text
    assert "K80 is retired in aws us-west-2: 1 GPU(s) of any model" in text
    assert "# InstanceType: p2.xlarge is a retired EC2 type" in conv.text       # the notes are comments too

    conv = converted("gcp-example-gpu-docker.yaml", True)
    nts = conv.config["available_node_types"]
    head, worker = nts["ray_head_gpu"], nts["ray_worker_gpu"]
    for nt in (head, worker):
        assert not {"machineType", "guestAccelerators", "gpus"} & set(nt["node_config"])
    assert head["node_config"]["min_memory_gib"] == 16 and "min_vcpus" not in head["node_config"]
    assert head["resources"] == {"CPU": 6, "GPU": 1}
    assert worker["resources"] == {"CPU": 2, "GPU": 1} and worker["node_config"]["scheduling"]["preemptible"]
    for n, nt in nts.items():
        t = conv.plan.plans[n].chosen.instance_type
        assert t.gpu_count >= 1 and t.vcpus >= nt["resources"]["CPU"]
        assert t.memory_gib >= nt["node_config"]["min_memory_gib"]
    text = "\n".join(conv.notes)
    assert "custom-6-16384 is a GCE custom machine type" in text and "6 vCPU and 16384 MiB" in text
    assert text.count("K80 is retired in gcp us-west1") == 2


@pytest.mark.parametrize("machine_type, vcpus, mib", [
    ("custom-4-10240", 4, 10240), ("n2-custom-8-16384", 8, 16384), ("n2d-custom-2-8192-ext", 2, 8192),
    ("e2-custom-4-6144", 4, 6144)])
def test_gcp_custom_machine_types_freed_from_their_name(machine_type: str, vcpus: int, mib: int) -> None:
    from ray_nodeless.swapin.convert import convert

    quiet_ray()
    doc = yaml.safe_load(example("gcp-example-gpu-docker.yaml").read_text())
    worker = doc["available_node_types"]["ray_worker_gpu"]
    worker["node_config"]["machineType"] = machine_type
    del worker["node_config"]["guestAccelerators"]
    worker["resources"] = {}
    conv = convert(doc, free_instance_types=True, project_id=PROJECT)
    nt = conv.config["available_node_types"]["ray_worker_gpu"]
    assert "machineType" not in nt["node_config"]
    assert nt["node_config"]["min_memory_gib"] == round(mib / 1024, 4)
    assert nt["resources"]["CPU"] == vcpus
    assert nt["resources"]["memory"] == int(mib * 2 ** 20 * 0.7)       # Ray's fill-in for a worker
    t = conv.plan.plans["ray_worker_gpu"].chosen.instance_type
    assert t.vcpus >= vcpus and t.memory_gib >= mib / 1024 and not t.gpu_count
    assert f"{machine_type} is a GCE custom machine type" in "\n".join(conv.notes)
    with pytest.raises(ConfigError, match="--free-instance-types"):
        convert(doc, project_id=PROJECT)


@pytest.mark.parametrize("instance_type", sorted(__import__(
    "ray_nodeless.providers.aws.swapin", fromlist=["RETIRED_AWS_TYPES"]).RETIRED_AWS_TYPES))
def test_retired_aws_types_freed(instance_type: str) -> None:
    from ray_nodeless.core.catalog import embedded
    from ray_nodeless.providers.aws.swapin import RETIRED_AWS_TYPES
    from ray_nodeless.swapin.convert import convert

    quiet_ray()
    # the table is for types the catalog lacks: a type back in the catalog must leave the table
    assert embedded().instance_type("aws", instance_type) is None
    vcpus, mem, model, count, _ = RETIRED_AWS_TYPES[instance_type]
    doc = yaml.safe_load(example("aws-example-full.yaml").read_text())
    for nt in doc["available_node_types"].values():
        nt["node_config"]["InstanceType"] = instance_type
    with pytest.raises(ConfigError, match=f"knows {instance_type}'s shape"):
        convert(doc)
    if count > 8:
        # no current EC2 type has more than 8 GPUs: the planner says so, naming the shape
        from ray_nodeless.errors import NoFeasibleOffering

        with pytest.raises(NoFeasibleOffering, match=rf"no offering in aws us-west-2 fits .*GPU: {count}"):
            convert(doc, free_instance_types=True)
        return
    conv = convert(doc, free_instance_types=True)
    for name, nt in conv.config["available_node_types"].items():
        assert nt["node_config"]["min_memory_gib"] == mem and nt["resources"]["GPU"] == count
        assert nt["node_config"].get("gpus", [model]) == [model]
        t = conv.plan.plans[name].chosen.instance_type
        assert t.gpu_count >= count and t.memory_gib >= mem and t.vcpus >= vcpus
    assert any(f"{instance_type} is a retired EC2 type" in n for n in conv.notes)
