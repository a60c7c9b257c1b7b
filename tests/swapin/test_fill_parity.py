"""Node type resources are filled in exactly as Ray's own AWS provider fills them (checked against Ray's own
`AWSNodeProvider.fillout_available_node_types_resources` on moto, for every instance type of a region), only for
node types pinned to one instance type, and never invented for an empty shape."""
from __future__ import annotations

import copy
import logging
from typing import Any

import pytest
import yaml

from ray_nodeless.core.catalog import embedded
from ray_nodeless.core.node_resources import OBJECT_STORE_MEMORY_PROPORTION, ray_filled_resources
from ray_nodeless.providers import backend_config
from ray_nodeless.providers.aws.ray_resources import AWS_NEURON_CORE, AWS_NEURON_CORES
from ray_nodeless.ray_adapter.provider import NodelessProvider
from ray_nodeless.swapin import ray_defaults
from tests.swapin.helpers import example, prepared, quiet_ray

REGION = "us-west-2"
AMI = "ami-0123456789abcdef0"


def test_constants_are_the_installed_rays() -> None:
    import ray._private.ray_constants as ray_constants
    from ray._private.accelerators.neuron import AWS_NEURON_INSTANCE_MAP
    from ray.util.accelerators import AWS_NEURON_CORE as RAY_NEURON_CORE

    assert OBJECT_STORE_MEMORY_PROPORTION == ray_constants.DEFAULT_OBJECT_STORE_MEMORY_PROPORTION
    assert AWS_NEURON_CORES == AWS_NEURON_INSTANCE_MAP
    assert AWS_NEURON_CORE == RAY_NEURON_CORE


def _ray_fill(moto: Any, config: dict[str, Any]) -> dict[str, Any]:
    """Ray's own AWS fill-in against moto. Its EC2 client is cached per (region, credentials): the endpoint goes in
    through the credentials, so no client pointing elsewhere is reused."""
    from ray.autoscaler._private.aws.node_provider import AWSNodeProvider

    cfg = copy.deepcopy(config)
    cfg["provider"]["aws_credentials"] = {"endpoint_url": moto.url, "aws_access_key_id": "testing",
                                          "aws_secret_access_key": "testing"}
    return AWSNodeProvider.fillout_available_node_types_resources(cfg)


def test_every_instance_type_fills_like_rays_aws_provider(moto: Any) -> None:
    cat = embedded()
    rc = cat.region("aws", REGION)
    names = sorted({rc.types[int(i)].name for i in set(rc.o_type.tolist())})
    head = "g4dn.xlarge"
    config = {"provider": {"type": "aws", "region": REGION}, "head_node_type": head,
              "available_node_types": {n: {"node_config": {"InstanceType": n}, "resources": {}} for n in names}}
    logging.getLogger("ray.autoscaler").setLevel(logging.ERROR)
    ray = _ray_fill(moto, config)["available_node_types"]
    deviations = {}
    rule = backend_config("aws").fill_rule()       # the hook bootstrap_config and convert use
    for n in names:
        ours = ray_filled_resources(cat.instance_type("aws", n), {}, is_head=n == head, rule=rule)
        if ours != ray[n]["resources"]:
            deviations[n] = (ours, ray[n]["resources"])
    # The one deliberate difference (core/node_resources.py): EC2 calls p4de's GPUs A100, the catalog A100-80GB,
    # and the planner would refuse p4de for `accelerator_type:A100`; everything else is identical.
    assert set(deviations) <= {"p4de.24xlarge"}
    for ours, theirs in deviations.values():
        assert theirs == dict(ours, **{"accelerator_type:A100": 1})
    assert ray[head]["resources"] == {"CPU": 4, "GPU": 1, "accelerator_type:T4": 1}     # a head gets no memory
    assert len(names) > 1000


@pytest.mark.parametrize("name", ["aws-example-full.yaml", "aws-example-minimal.yaml"])
def test_converted_examples_fill_like_rays_own_provider(name: str, moto: Any) -> None:
    from ray_nodeless.swapin.convert import convert_file

    quiet_ray()
    conv = convert_file(example(name))
    ours = NodelessProvider.fillout_available_node_types_resources(prepared(conv.config))
    ray_cfg = prepared(ray_defaults.merge_ray_defaults(yaml.safe_load(example(name).read_text())))
    theirs = _ray_fill(moto, ray_cfg)
    for nt in ours["available_node_types"]:
        assert ours["available_node_types"][nt]["resources"] == theirs["available_node_types"][nt]["resources"], nt
    assert ours["available_node_types"]["ray.worker.default"]["resources"] == {
        "CPU": 2, "memory": int(8192 * 2 ** 20 * 0.7)}


def _config(cloud: str, types: dict[str, Any], head: str = "head") -> dict[str, Any]:
    provider = {"type": "external", "module": "ray_nodeless.NodelessProvider", "cloud": cloud,
                "region": REGION if cloud == "aws" else "us-west1"}
    if cloud == "aws":
        provider["image_id"] = AMI
    else:
        provider["project_id"] = "p"
    return {"cluster_name": "c", "max_workers": 4, "head_node_type": head, "provider": provider,
            "available_node_types": types}


def test_only_pinned_node_types_are_filled(caplog: pytest.LogCaptureFixture) -> None:
    cfg = _config("aws", {
        "head": {"resources": {}, "node_config": {"InstanceType": "m5.large"}},
        "gpu": {"resources": {}, "node_config": {"InstanceType": "g4dn.xlarge",
                                                 "InstanceMarketOptions": {"MarketType": "spot"}}},
        "declared": {"resources": {"CPU": 1, "custom": 3}, "node_config": {"InstanceType": "m5.xlarge"}},
        "one_type_rule": {"resources": {}, "node_config": {"instance_types": ["c5.large"]}},
        "shape": {"resources": {"CPU": 4, "GPU": 1}, "node_config": {}},
        "empty": {"resources": {}, "node_config": {}},
    })
    with caplog.at_level(logging.WARNING, logger="ray_nodeless"):
        out = NodelessProvider.fillout_available_node_types_resources(cfg)["available_node_types"]
    gib7 = lambda gib: int(gib * 1024 * 2 ** 20 * 0.7)   # noqa: E731
    assert out["head"]["resources"] == {"CPU": 2}
    assert out["gpu"]["resources"] == {"CPU": 4, "GPU": 1, "accelerator_type:T4": 1, "memory": gib7(16)}
    assert out["declared"]["resources"] == {"CPU": 1, "custom": 3, "memory": gib7(16)}
    assert out["one_type_rule"]["resources"] == {"CPU": 2, "memory": gib7(4)}
    # not pinned: the instance depends on the shape, so nothing is invented (the planner's smallest fit is no fill)
    assert out["shape"]["resources"] == {"CPU": 4, "GPU": 1}
    assert out["empty"]["resources"] == {}
    assert any("empty: resources state no CPU or GPU" in r.getMessage() for r in caplog.records)


def test_gcp_fills_only_where_rays_gcp_provider_leaves_the_autoscaler_blind() -> None:
    cfg = _config("gcp", {
        "head": {"resources": {"CPU": 2}, "node_config": {"machineType": "n1-standard-2"}},
        "gpu": {"resources": {}, "node_config": {
            "machineType": "n1-standard-8",
            "guestAccelerators": [{"acceleratorType": "nvidia-tesla-t4", "acceleratorCount": 1}],
            "scheduling": [{"preemptible": True}, {"onHostMaintenance": "TERMINATE"}]}},
    })
    out = NodelessProvider.fillout_available_node_types_resources(cfg)["available_node_types"]
    assert out["head"]["resources"] == {"CPU": 2}          # declared: Ray's GCP provider fills nothing
    assert out["gpu"]["resources"] == {"CPU": 8, "GPU": 1, "accelerator_type:T4": 1,
                                       "memory": int(30 * 1024 * 2 ** 20 * 0.7)}


def test_request_resources_on_a_pinned_worker_launches_a_worker() -> None:
    """`request_resources([{CPU: 2}] * 2)` with an m5.large head and m5.large workers (resources: {}, as in Ray's
    examples): Ray's own scheduler asks for one worker once the resources are filled, none before."""
    from ray.autoscaler._private.node_provider_availability_tracker import NodeAvailabilitySummary
    from ray.autoscaler._private.resource_demand_scheduler import ResourceDemandScheduler
    from ray.autoscaler.node_provider import NodeProvider
    from ray.autoscaler.tags import NODE_KIND_HEAD, TAG_RAY_NODE_KIND, TAG_RAY_USER_NODE_TYPE

    cfg = _config("aws", {
        "head": {"resources": {}, "node_config": {"InstanceType": "m5.large"}, "min_workers": 0, "max_workers": 0},
        "worker": {"resources": {}, "node_config": {"InstanceType": "m5.large"}, "min_workers": 0,
                   "max_workers": 2},
    })

    class OneHead(NodeProvider):
        def __init__(self) -> None:
            super().__init__({}, "c")

        def non_terminated_nodes(self, tag_filters: dict) -> list[str]:
            return ["head-1"]

        def node_tags(self, node_id: str) -> dict:
            return {TAG_RAY_NODE_KIND: NODE_KIND_HEAD, TAG_RAY_USER_NODE_TYPE: "head"}

        def internal_ip(self, node_id: str) -> str:
            return "10.0.0.1"

    def to_launch(config: dict[str, Any]) -> dict:
        types = config["available_node_types"]
        sched = ResourceDemandScheduler(OneHead(), types, config["max_workers"], "head", 1.0)
        head_res = types["head"]["resources"]
        launch, _ = sched.get_nodes_to_launch(
            ["head-1"], {}, [], {"10.0.0.1": dict(head_res)}, [], {"10.0.0.1": dict(head_res)},
            [{"CPU": 2}] * 2, NodeAvailabilitySummary(node_availabilities={}))
        return dict(launch)

    assert to_launch(cfg) == {}                 # resources: {} as Ray's YAML has them: nothing can fit
    filled = NodelessProvider.fillout_available_node_types_resources(cfg)
    assert to_launch(filled) == {"worker": 1}
